//! Flash attention, rung 3 with warp specialization and ping-pong (sm_90a): the FlashAttention-3
//! schedule on top of [`super::flash_wgmma`]'s tiles. bf16 or f16 in and out, f32 accumulation,
//! head dim 64 or 128.
//!
//! ```text
//!   warpgroup 0 (producer, setmaxnreg.dec to 40)      thread 0 issues every TMA copy
//!        | Q tiles once, then K/V tiles into a 3-stage ring (full[s] / empty[s] mbarriers)
//!        v
//!   warpgroups 1 and 2 (consumers, setmaxnreg.inc to 232), 64 query rows each, both read every stage
//!
//!   time ->     consumer A                          consumer B
//!               [sync A] issue S_j = Q K_j^T
//!               [arrive B] ------------------------> [sync B] issue S_j = Q K_j^T
//!               softmax(S_j)  (B's S on the cores)   [arrive A]
//!               issue O += P_j V_j                   softmax(S_j)  (A's P V, S_j+1 on the cores)
//!               [sync A] issue S_j+1 ...             issue O += P_j V_j
//! ```
//!
//! - **Block.** [`FLASH_WGMMA_PP_THREADS`] = 384 threads, three warpgroups. Warpgroup 0 is the
//!   producer: it drops to [`FLASH_WGMMA_PP_PRODUCER_REGS`] registers per thread
//!   (`setmaxnreg.dec`) and its thread 0 issues the copies; warpgroups 1 and 2 are consumers that
//!   rise to [`FLASH_WGMMA_PP_CONSUMER_REGS`] (`setmaxnreg.inc`): 128 x 40 + 256 x 232 = 64 512 of
//!   the SM's 65 536 registers. The launch bound (`max_threads = 384, min_blocks = 1`: `.maxntid
//!   384` and `.minnctapersm 1`) makes ptxas allocate exactly [`FLASH_WGMMA_PP_ENTRY_REGS`] = 168 per
//!   thread at entry. That matters: `setmaxnreg.inc` takes registers only from the block's own pool,
//!   which holds what `setmaxnreg.dec` released, and blocks until enough are there; without
//!   `.minnctapersm 1` ptxas allocated 124 at head dim 64, and the consumers' increase to 232 could
//!   never be met. Consumer `c` owns query rows `q0 + 64 c ..
//!   + 64`; grid `(ceil(q_len / 128), batch * heads)`, query tiles taken last first.
//! - **Ring.** [`FLASH_WGMMA_PP_STAGES`] stages of K and V (64 x D each); `full[s]`: the producer's
//!   `arrive.expect_tx` plus the TMA bytes; `empty[s]`: 256 arrivals (every consumer thread, once
//!   its P V products on the stage have completed). Use `j` of stage `j % 3` is phase `j / 3`.
//!   Every wait is bounded and traps on a stall.
//! - **Ping-pong.** Two named barriers order the consumers' tensor-core work: consumer A issues
//!   `S_j` after `barrier.sync 1` (not before its first tile), then `barrier.arrive 2`; consumer B
//!   issues `S_j` after `barrier.sync 2`, then `barrier.arrive 1` (not after its last tile). Both
//!   barriers count 256 threads (128 waiting, 128 arriving), and both consumers walk the same
//!   number of tiles, so every sync meets exactly one arrive. One warpgroup's softmax (exp2, row
//!   max and sum on the CUDA cores) thus runs while the other's products run on the tensor cores.
//! - **Tiles, edges, softmax, products, epilogue.** As [`super::flash_wgmma`]: 64-column boxes
//!   with 128-byte swizzle, keys `>= kv_len` and causal keys masked to `-inf` (bottom-right
//!   alignment), rows `>= q_len` computed from the next head's rows and not stored, online softmax
//!   in base 2, P packed from the S registers as the A fragment of `O += P V`, O / l stored with
//!   4-byte stores and the log-sum-exp (natural log) per row for the backward.
//!
//! Shared memory: [`flash_wgmma_pp_smem_bytes`] (two Q tiles, three stages of K and V, seven
//! mbarriers: 65 592 bytes at head dim 64, 131 128 at 128).

use super::attention::AttentionParams;
use super::flash_wgmma::flash_wgmma_tile_bytes;
use crate::tma::TensorMap;
use crate::{DevicePtr, DevicePtrMut, kernel};
use half::{bf16, f16};

/// Query rows per block: 64 per consumer warpgroup.
pub const FLASH_WGMMA_PP_BQ: u32 = 128;
/// Threads per block: one producer warpgroup and two consumer warpgroups.
pub const FLASH_WGMMA_PP_THREADS: u32 = 384;
/// Ring depth (K/V stages).
pub const FLASH_WGMMA_PP_STAGES: u32 = 3;
/// Registers per thread the producer warpgroup keeps (`setmaxnreg.dec`).
pub const FLASH_WGMMA_PP_PRODUCER_REGS: u32 = 40;
/// Registers per thread the consumer warpgroups take (`setmaxnreg.inc`).
pub const FLASH_WGMMA_PP_CONSUMER_REGS: u32 = 232;
/// Registers per thread ptxas allocates at entry under the launch bound (384 threads, one block per
/// SM: 65 536 / 384 rounded down to a multiple of 8).
pub const FLASH_WGMMA_PP_ENTRY_REGS: u32 = 168;

const _: () = assert!(crate::wgmma::setmaxnreg_split_fits(
    FLASH_WGMMA_PP_ENTRY_REGS,
    FLASH_WGMMA_PP_PRODUCER_REGS,
    FLASH_WGMMA_PP_CONSUMER_REGS,
    2
));

/// The named barrier consumer 0 waits on before issuing `S = Q K^T`; consumer 1 waits on the next
/// id (id 0 is the block barrier).
pub const FLASH_WGMMA_PP_BARRIER: u32 = 1;

/// Dynamic shared memory of the ping-pong kernels at head dim `d`: two Q tiles, the K and V tiles
/// of every stage, and the barriers (`q_full`, `full[3]`, `empty[3]`).
pub const fn flash_wgmma_pp_smem_bytes(d: u32) -> u32 {
    (2 + 2 * FLASH_WGMMA_PP_STAGES) * flash_wgmma_tile_bytes(d) + (1 + 2 * FLASH_WGMMA_PP_STAGES) * 8
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod device {
    use super::*;
    use crate::kernels::flash_mma::pack;
    use crate::kernels::flash_wgmma::device::{
        kmajor, load_tile, mask_scores, p_fragments, softmax_rows, store_rows, wait,
    };
    use crate::kernels::gemm_wgmma_fused::mn_descriptor;
    use crate::{fence, math, mbarrier, shared, sync, thread, tma, warp, wgmma};

    const BQ: u32 = 64;
    const BKV: u32 = 64;
    const ST: u32 = FLASH_WGMMA_PP_STAGES;
    const CONS: u32 = 2;
    const BAR: u32 = FLASH_WGMMA_PP_BARRIER;

    /// Shared memory: the two Q tiles, then K and V of each stage, then the barriers.
    #[derive(Clone, Copy)]
    struct Layout {
        base: u32,
        tile: u32,
        bars: u32,
    }

    impl Layout {
        fn q(self, c: u32) -> u32 {
            self.base + c * self.tile
        }
        fn k(self, st: u32) -> u32 {
            self.base + (CONS + 2 * st) * self.tile
        }
        fn v(self, st: u32) -> u32 {
            self.base + (CONS + 1 + 2 * st) * self.tile
        }
        fn q_full(self) -> u32 {
            self.bars
        }
        fn full(self, st: u32) -> u32 {
            self.bars + 8 * (1 + st)
        }
        fn empty(self, st: u32) -> u32 {
            self.bars + 8 * (1 + ST + st)
        }
    }

    /// The producer (thread 0 of warpgroup 0): both Q tiles, then every K/V tile of the block.
    #[inline(always)]
    unsafe fn produce<const D: u32>(
        lay: Layout,
        q_map: *const TensorMap,
        k_map: *const TensorMap,
        v_map: *const TensorMap,
        p: AttentionParams,
        q0: u32,
        n_tiles: u32,
    ) {
        let bh = thread::block_idx_y();
        // a consumer's Q tile that starts past the last head's rows is not loaded (its rows are
        // never stored): only boxes that start inside the tensor are counted
        let q_rows = p.heads_total() * p.q_len;
        let mut loads = 0;
        let mut c = 0;
        while c < CONS {
            if bh * p.q_len + q0 + c * BQ < q_rows {
                loads += 1;
            }
            c += 1;
        }
        unsafe {
            tma::prefetch(q_map);
            tma::prefetch(k_map);
            tma::prefetch(v_map);
            mbarrier::arrive_expect_tx(lay.q_full(), loads * lay.tile);
            let mut c = 0;
            while c < loads {
                load_tile::<D>(lay.q(c), q_map, bh * p.q_len + q0 + c * BQ, lay.q_full());
                c += 1;
            }
        }
        let mut j = 0;
        while j < n_tiles {
            let st = j % ST;
            if j >= ST {
                unsafe { wait(lay.empty(st), ((j / ST) + 1) & 1) };
            }
            let row = bh * p.kv_len + j * BKV;
            unsafe {
                mbarrier::arrive_expect_tx(lay.full(st), 2 * lay.tile);
                load_tile::<D>(lay.k(st), k_map, row, lay.full(st));
                load_tile::<D>(lay.v(st), v_map, row, lay.full(st));
            }
            j += 1;
        }
    }

    #[inline(always)]
    pub(super) unsafe fn flash_wgmma_pp<const F16: bool, const D: u32, const NO: usize>(
        q_map: *const TensorMap,
        k_map: *const TensorMap,
        v_map: *const TensorMap,
        o: *mut u16,
        lse: DevicePtrMut<f32>,
        p: AttentionParams,
    ) {
        const { assert!(NO as u32 == D / 2 && (D == 64 || D == 128)) };
        let tid = thread::thread_idx_x();
        let bh = thread::block_idx_y();
        // the block's first query row (each consumer warpgroup owns 64 rows from q0 + 64 c)
        let q0 = (thread::grid_dim_x() - 1 - thread::block_idx_x()) * BQ * CONS;
        let q_len = p.q_len;
        let tile = flash_wgmma_tile_bytes(D);
        let base = shared::dynamic_smem_addr();
        let lay = Layout { base, tile, bars: base + (CONS + 2 * ST) * tile };
        if lay.base % 1024 != 0 {
            thread::trap();
        }
        let n_tiles = p.keys_for_rows(q0, BQ * CONS).div_ceil(BKV);
        if tid == 0 {
            unsafe {
                mbarrier::init(lay.q_full(), 1);
                let mut st = 0;
                while st < ST {
                    mbarrier::init(lay.full(st), 1);
                    mbarrier::init(lay.empty(st), 128 * CONS);
                    st += 1;
                }
            }
            fence::mbarrier_init_release_cluster();
        }
        sync::sync_threads();

        if tid < 128 {
            // the producer warpgroup hands its registers to the consumers
            unsafe { wgmma::setmaxnreg_dec::<FLASH_WGMMA_PP_PRODUCER_REGS>() };
            if tid == 0 {
                unsafe { produce::<D>(lay, q_map, k_map, v_map, p, q0, n_tiles) };
            }
            return;
        }
        unsafe { wgmma::setmaxnreg_inc::<FLASH_WGMMA_PP_CONSUMER_REGS>() };

        // consumer warpgroup `cw`: rows q0 + 64 cw .. + 64, warp w of it rows 16 w .. 16 w + 16
        let cw = tid / 128 - 1;
        let (lane, w) = (tid % 32, (tid % 128) / 32);
        let (g, tq) = (lane / 4, lane % 4);
        let r0 = q0 + cw * BQ;
        let q_tile = lay.q(cw);
        let wrow = w * 16;
        let rows = [r0 + wrow + g, r0 + wrow + g + 8];
        let scale_log2 = p.scale * core::f32::consts::LOG2_E;
        let mut m = [f32::NEG_INFINITY; 2];
        let mut l = [0.0f32; 2];
        let mut acc = [0.0f32; NO];
        unsafe { wait(lay.q_full(), 0) };

        let mut j = 0;
        while j < n_tiles {
            let st = j % ST;
            unsafe { wait(lay.full(st), (j / ST) & 1) };
            let k0 = j * BKV;

            // my turn on the tensor cores: consumer 0 goes first on tile 0, then each waits for the
            // other to have issued its S of the previous (consumer 0) or same (consumer 1) tile
            if cw == 1 || j > 0 {
                unsafe { sync::named_barrier_sync(BAR + cw, 256) };
            }
            // S = Q K^T (64 x 64)
            let mut s = [0.0f32; 32];
            wgmma::fence();
            let mut ks = 0;
            while ks < D / 16 {
                unsafe { wgmma::mma_m64n64k16_ss::<F16>(&mut s, kmajor(q_tile, ks), kmajor(lay.k(st), ks), ks > 0) };
                ks += 1;
            }
            wgmma::commit_group();
            // the other consumer's turn (consumer 1 does not hand over after its last tile: consumer
            // 0 has no tile left to wait for)
            if cw == 0 || j + 1 < n_tiles {
                unsafe { sync::named_barrier_arrive(BAR + 1 - cw, 256) };
            }
            unsafe { wgmma::wait_group_m64n64::<0>(&mut s) };

            // (with two consumers and the causal mask, the first one's last tiles may be wholly
            // masked: its rows keep their state, P = 0)
            mask_scores(&mut s, p, (r0, rows), (k0, BKV), tq);

            softmax_rows(&mut s, (&mut m, &mut l), &mut acc, scale_log2);

            // O += P V: n8 blocks 2 kk and 2 kk + 1 of S are the A fragment of k step kk
            let pa = p_fragments::<F16, 32, 4>(&s);
            wgmma::fence();
            let mut kk = 0;
            while kk < 4 {
                let bd = mn_descriptor(lay.v(st), kk as u32);
                if D == 128 {
                    let a = unsafe { &mut *(acc.as_mut_ptr() as *mut [f32; 64]) };
                    unsafe { wgmma::mma_m64n128k16_rs_tb::<F16>(a, pa[kk], bd) };
                } else {
                    let a = unsafe { &mut *(acc.as_mut_ptr() as *mut [f32; 32]) };
                    unsafe { wgmma::mma_m64n64k16_rs_tb::<F16>(a, pa[kk], bd) };
                }
                kk += 1;
            }
            wgmma::commit_group();
            if D == 128 {
                unsafe { wgmma::wait_group_m64n128::<0>(&mut *(acc.as_mut_ptr() as *mut [f32; 64])) };
            } else {
                unsafe { wgmma::wait_group_m64n64::<0>(&mut *(acc.as_mut_ptr() as *mut [f32; 32])) };
            }
            // this thread is done reading the stage
            unsafe { mbarrier::arrive(lay.empty(st)) };
            j += 1;
        }

        unsafe { store_rows::<F16, D, NO>(o, lse, &acc, (m, l), (bh, rows, q_len), tq) };
    }
}

macro_rules! flash_wgmma_pp_kernels {
    ($($(#[$doc:meta])+ $name:ident: $ty:ty, $f16:literal, $d:literal;)*) => {$(
        $(#[$doc])+
        ///
        /// Parameters: `q_map`, `k_map`, `v_map` (tensor maps in global memory over Q as
        /// `[batch * heads * q_len, head_dim]` and K, V as `[batch * heads * kv_len, head_dim]`, box
        /// 64 x 64, 128-byte swizzle), `o` (output, the shape of Q, 4-byte aligned), `lse`
        /// (`batch * heads * q_len` f32), `p` (the problem). Grid `(ceil(q_len / 128), batch *
        /// heads)`; block 384 threads (warpgroup 0 produces, warpgroups 1 and 2 consume 64 query
        /// rows each); dynamic shared memory `flash_wgmma_pp_smem_bytes(head_dim)`. Tiling, thread
        /// mapping and the ping-pong schedule: the module docs.
        #[kernel(arch = "sm_90a", max_threads = 384, min_blocks = 1)]
        pub unsafe fn $name(
            q_map: DevicePtr<TensorMap>,
            k_map: DevicePtr<TensorMap>,
            v_map: DevicePtr<TensorMap>,
            o: DevicePtrMut<$ty>,
            lse: DevicePtrMut<f32>,
            p: AttentionParams,
        ) {
            unsafe {
                device::flash_wgmma_pp::<$f16, $d, { $d / 2 }>(
                    q_map.as_ptr(),
                    k_map.as_ptr(),
                    v_map.as_ptr(),
                    o.as_mut_ptr() as *mut u16,
                    lse,
                    p,
                )
            }
        }
    )*};
}

flash_wgmma_pp_kernels! {
    /// FlashAttention-3-style forward with a register-trading producer warpgroup and two ping-pong
    /// consumer warpgroups (sm_90a), bf16 in and out, head dim 64.
    flash_fwd_wgmma_pp_bf16_d64: bf16, false, 64;
    /// The ping-pong forward, bf16, head dim 128.
    flash_fwd_wgmma_pp_bf16_d128: bf16, false, 128;
    /// The ping-pong forward, f16, head dim 64.
    flash_fwd_wgmma_pp_f16_d64: f16, true, 64;
    /// The ping-pong forward, f16, head dim 128.
    flash_fwd_wgmma_pp_f16_d128: f16, true, 128;
}
