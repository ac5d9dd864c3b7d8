//! Flash attention backward, rung 3 (sm_90a): FlashAttention's backward on TMA + `wgmma`, with a
//! producer warp feeding a ring of tiles (the Hopper forward's machinery, [`super::flash_wgmma`]).
//! bf16 or f16 in and out, f32 accumulation, head dim 64 or 128. Deterministic: no atomics; dQ has
//! a pass of its own (as the `mma.sync` backward, [`super::flash_bwd_mma`]), so every gradient
//! element is summed by one thread of one block in a fixed order and the same inputs give the same
//! bits.
//!
//! With `P_ij = e^(scale q_i . k_j - lse_i)` recomputed from the forward's log-sum-exp and
//! `delta_i = dO_i . O_i`:
//!
//! ```text
//! dV_j = sum_i P_ij dO_i      dP_ij = dO_i . V_j      dS_ij = P_ij (dP_ij - delta_i)
//! dQ_i = scale sum_j dS_ij K_j      dK_j = scale sum_i dS_ij Q_i
//! ```
//!
//! Three kernels, launched in this order on one stream:
//!
//! 1. **delta**: the `mma.sync` rung's `flash_bwd_delta_*` (one warp per query row), reused.
//! 2. **dK, dV** (`flash_bwd_dkdv_wgmma_*`): a block owns [`FLASH_BWD_WGMMA_BKV`] keys; its
//!    consumer warpgroup keeps their dK and dV (64 x D each, f32) in registers. The producer warp
//!    loads the K and V tiles once, then streams the Q and dO tiles of the query blocks of
//!    [`FLASH_BWD_WGMMA_BQ`] rows that see the keys (with the causal mask from the block of the
//!    first row that sees the first key: [`flash_bwd_query_blocks`]) through a two-stage ring.
//!    Per query block:
//!
//!    ```text
//!    S^T  = K  Q^T   wgmma m64n64k16, A = K tile (smem, K-major), B = Q tile (smem, K-major)
//!    dP^T = V  dO^T  wgmma m64n64k16, A = V tile,                  B = dO tile
//!    P^T, dS^T       per element in registers (0 where masked), packed to bf16 / f16 A fragments
//!    dV  += P^T  dO  wgmma m64nDk16, A = P^T  (registers), B = dO tile read MN-major
//!    dK  += dS^T Q   wgmma m64nDk16, A = dS^T (registers), B = Q tile read MN-major
//!    ```
//!
//!    The four products are issued as groups in that order and waited for one at a time: `P^T` is
//!    computed while `dP^T`'s product runs, `dS^T` while `dV`'s does.
//!
//!    Computing the transposed scores (keys as the warpgroup's 64 rows) puts `P^T` and `dS^T` in
//!    the accumulator layout of the rows dV and dK need, so they go to the next products straight
//!    from registers, as the forward's P does; no shared-memory round trip. Grid
//!    `(ceil(kv_len / 64), batch * heads)`.
//! 3. **dQ** (`flash_bwd_dq_wgmma_*`): a block owns 64 query rows (dQ 64 x D f32 in registers);
//!    the producer loads Q and dO once and streams the K and V tiles the rows see:
//!
//!    ```text
//!    S  = Q  K^T     wgmma m64n64k16, A = Q tile, B = K tile (both K-major)
//!    dP = dO V^T     wgmma m64n64k16, A = dO tile, B = V tile
//!    dS              per element (0 where masked), packed to A fragments
//!    dQ += dS K      wgmma m64nDk16, A = dS (registers), B = K tile read MN-major
//!    ```
//!
//!    Grid `(ceil(q_len / 64), batch * heads)`, the query blocks last first (causal: the longest
//!    first).
//!
//! - **Block.** [`FLASH_BWD_WGMMA_THREADS`] threads: warps 0-3 are the consumer warpgroup (warp
//!   `w` owns rows `16 w .. 16 w + 16` of every 64-row product; a thread holds rows `g = lane / 4`
//!   and `g + 8` and columns `8 n + 2 (lane % 4) + {0, 1}` of each n8 block, the `mma.m16n8` C
//!   layout, [`crate::wgmma::acc_m64`]); warp 4 produces (its lane 0 issues every TMA copy).
//! - **Tiles.** Every tile is 64 rows x D, stored as `D / 64` boxes of 64 rows of 128 bytes,
//!   128-byte swizzled (the forward's tensor maps, box 64 x 64). K-major operands use the GEMM's
//!   `tile_descriptor`, MN-major ones its `mn_descriptor`.
//! - **Ring.** Shared memory holds the two owned tiles, then two stages of two streamed tiles,
//!   then the barriers: `own_full` (one arrival plus both owned tiles' bytes), `full[s]` (1
//!   arrival in the dQ kernel, 32 in the dK / dV kernel, plus the stage's bytes), `empty[s]` (128
//!   arrivals: every consumer thread, after the products that read the stage have been waited
//!   for). Use `j` of stage `j % 2` is phase `j / 2`.
//!   Every wait is bounded and traps on a stall. In the dK / dV kernel each stage also holds its
//!   query block's log-sum-exps (times log2 e) and deltas, 64 f32 each: the producer warp loads
//!   them from global memory (lane `l` queries `2 l`, `2 l + 1`), each lane arriving on `full[s]`
//!   after its stores (`full[s]` counts 32 arrivals there), so the consumers read them from shared
//!   memory instead of waiting on 32 global loads per tile (the stall that kept the tensor pipe
//!   30% busy, ncu in run 230).
//! - **Edges.** The tensor maps are 2-D over all heads' rows, so a tile that crosses a head's end
//!   reads the next head's rows (zeros past the tensor's end): every product term with a query past
//!   `q_len` or a key a query does not see (past `kv_len`, or above the causal diagonal) gets P = 0
//!   and dS = 0 (the inputs must be finite), and rows past the block's length are not stored.
//!   Tiles no row sees are never loaded; a tile is masked only where it crosses an edge or the
//!   diagonal.
//! - **Stores.** dK (times `scale`), dV and dQ (times `scale`) are rounded from the accumulators
//!   and stored two elements (4 bytes) per store, rows below the length only.
//!
//! - **Two consumers** (`flash_bwd_*_wgmma2_*`): [`FLASH_BWD_WGMMA2_THREADS`] threads, warpgroups 0
//!   and 1 consume (each with its own two owned tiles: 64 keys, or 64 query rows, per warpgroup, so a
//!   block owns 128), warpgroup 2 produces (thread 256 issues the copies). Both consumers read every
//!   streamed stage (`empty[s]` counts 256 arrivals), so each Q / dO (K / V) tile loaded serves
//!   twice the keys (rows). An owned tile that starts past the tensor's last row is not loaded (its
//!   rows are never stored; only they see its garbage). `setmaxnreg`: the producer warpgroup drops
//!   to [`FLASH_BWD_WGMMA2_PRODUCER_REGS`] registers, the consumers rise to
//!   [`FLASH_BWD_WGMMA2_CONSUMER_REGS`].
//!
//! Shared memory: [`flash_bwd_wgmma_smem_bytes`] (6 tiles, 5 barriers padded to 48 bytes, 2 x 512
//! bytes of per-query values: 48 KiB + 1072 bytes at D = 64, 96 KiB + 1072 at D = 128),
//! [`flash_bwd_wgmma2_smem_bytes`] (8 tiles: 64 KiB + 1072, 128 KiB + 1072).

use super::attention::AttentionParams;
use super::flash_bwd_mma::flash_bwd_query_blocks;
use crate::tma::TensorMap;
use crate::{DevicePtr, DevicePtrMut, kernel};
use half::{bf16, f16};

/// Query rows per dQ block and per streamed Q / dO tile of the dK / dV kernel.
pub const FLASH_BWD_WGMMA_BQ: u32 = 64;
/// Keys per dK / dV block and per streamed K / V tile of the dQ kernel.
pub const FLASH_BWD_WGMMA_BKV: u32 = 64;
/// Threads per block of the dK / dV and dQ kernels: one consumer warpgroup and one producer warp.
pub const FLASH_BWD_WGMMA_THREADS: u32 = 160;
/// Ring depth (stages of streamed tiles).
pub const FLASH_BWD_WGMMA_STAGES: u32 = 2;

/// Bytes of one 64 x D tile of 16-bit elements.
pub const fn flash_bwd_wgmma_tile_bytes(d: u32) -> u32 {
    64 * d * 2
}

/// Dynamic shared memory of the dK / dV and dQ kernels at head dim `d`: two owned tiles, two
/// stages of two streamed tiles, the barriers (`own_full`, `full[2]`, `empty[2]`, padded to 48
/// bytes) and each stage's per-query values ([`FLASH_BWD_WGMMA_ROW_STATS_BYTES`]).
pub const fn flash_bwd_wgmma_smem_bytes(d: u32) -> u32 {
    flash_bwd_wgmma_smem_bytes_for(d, 1)
}

/// Threads per block of the two-consumer kernels (`flash_bwd_*_wgmma2_*`): two consumer
/// warpgroups and a producer warpgroup (which gives its registers to the consumers).
pub const FLASH_BWD_WGMMA2_THREADS: u32 = 384;
/// Keys per dK / dV block and query rows per dQ block of the two-consumer kernels (64 per
/// consumer warpgroup).
pub const FLASH_BWD_WGMMA2_ROWS: u32 = 128;
/// Registers per thread the two-consumer kernels' producer warpgroup keeps (`setmaxnreg.dec`).
pub const FLASH_BWD_WGMMA2_PRODUCER_REGS: u32 = 24;
/// Registers per thread their consumer warpgroups take (`setmaxnreg.inc`): with the producer's,
/// `128 (24 + 2 x 240) = 64512` of the SM's 65536.
pub const FLASH_BWD_WGMMA2_CONSUMER_REGS: u32 = 240;

/// Dynamic shared memory of the two-consumer kernels at head dim `d`: two owned tiles per
/// consumer warpgroup, two stages of two streamed tiles (shared by both), the barriers and the
/// per-query values, as [`flash_bwd_wgmma_smem_bytes`].
pub const fn flash_bwd_wgmma2_smem_bytes(d: u32) -> u32 {
    flash_bwd_wgmma_smem_bytes_for(d, 2)
}

/// Bytes of one stage's per-query values in the dK / dV kernel: the log-sum-exp (in log2 units) and
/// delta of each of the stage's [`FLASH_BWD_WGMMA_BQ`] queries, f32.
pub const FLASH_BWD_WGMMA_ROW_STATS_BYTES: u32 = 2 * FLASH_BWD_WGMMA_BQ * 4;

/// Shared memory with `cons` consumer warpgroups: the tiles, the barriers (padded to 16 bytes),
/// each stage's per-query values.
const fn flash_bwd_wgmma_smem_bytes_for(d: u32, cons: u32) -> u32 {
    (2 * cons + 2 * FLASH_BWD_WGMMA_STAGES) * flash_bwd_wgmma_tile_bytes(d)
        + ((1 + 2 * FLASH_BWD_WGMMA_STAGES) * 8).next_multiple_of(16)
        + FLASH_BWD_WGMMA_STAGES * FLASH_BWD_WGMMA_ROW_STATS_BYTES
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub(crate) mod device {
    use super::*;
    use crate::kernels::flash_mma::pack;
    use crate::kernels::flash_wgmma::device::{kmajor, load_tile, wait};
    use crate::kernels::gemm_wgmma_fused::mn_descriptor;
    use crate::{fence, math, mbarrier, shared, sync, thread, tma, wgmma};

    const BQ: u32 = FLASH_BWD_WGMMA_BQ;
    const BKV: u32 = FLASH_BWD_WGMMA_BKV;
    const ST: u32 = FLASH_BWD_WGMMA_STAGES;

    /// The block's shared memory: the owned tiles (two per consumer warpgroup: `own(2 c)`,
    /// `own(2 c + 1)` of warpgroup `c`), the stages' streamed tiles, the barriers.
    #[derive(Clone, Copy)]
    struct Ring {
        base: u32,
        tile: u32,
        cons: u32,
    }

    impl Ring {
        fn own(self, i: u32) -> u32 {
            self.base + i * self.tile
        }
        fn streamed(self, st: u32, i: u32) -> u32 {
            self.base + (2 * self.cons + 2 * st + i) * self.tile
        }
        fn own_full(self) -> u32 {
            self.base + (2 * self.cons + 2 * ST) * self.tile
        }
        fn full(self, st: u32) -> u32 {
            self.own_full() + 8 * (1 + st)
        }
        fn empty(self, st: u32) -> u32 {
            self.own_full() + 8 * (1 + ST + st)
        }
        /// Stage `st`'s per-query log-sum-exp (log2 units), then at `+ 4 BQ` its deltas.
        fn row_stats(self, st: u32) -> u32 {
            self.own_full() + ((1 + 2 * ST) * 8).next_multiple_of(16) + st * FLASH_BWD_WGMMA_ROW_STATS_BYTES
        }
    }

    /// Where the dK / dV kernel's producer finds each streamed query block's per-query values:
    /// `lse` and `delta` of the head (`len` rows), the first streamed block's first row `q0`.
    #[derive(Clone, Copy)]
    struct RowStats {
        lse: *const f32,
        delta: *const f32,
        len: u32,
        q0: u32,
    }

    /// Checks the alignment 128-byte swizzling needs and has thread 0 initialize the barriers
    /// (`full[s]` expecting `full_arrivals`: 1, or the producer warp's 32 when every lane writes
    /// the stage's per-query values); then a block barrier. All threads call it.
    #[inline(always)]
    fn init(ring: Ring, full_arrivals: u32) {
        if ring.base % 1024 != 0 {
            thread::trap();
        }
        if thread::thread_idx_x() == 0 {
            unsafe {
                mbarrier::init(ring.own_full(), 1);
                let mut st = 0;
                while st < ST {
                    mbarrier::init(ring.full(st), full_arrivals);
                    mbarrier::init(ring.empty(st), 128 * ring.cons);
                    st += 1;
                }
            }
            fence::mbarrier_init_release_cluster();
        }
        sync::sync_threads();
    }

    /// The producer (one warp; lane 0 issues every copy): the owned tiles of `own` at global rows
    /// `own_row + 64 c` for each consumer warpgroup `c` whose rows start before `own_rows` (the
    /// tensor's end: a tile wholly past it is not loaded, and its rows are never stored), then `n`
    /// streamed tile pairs of `streamed` at rows `row0 + 64 j`, each into stage `j % 2` once the
    /// consumers have released it. With `stats`, the warp first writes the stage's per-query
    /// values ([`Ring::row_stats`]: lane `l` those of queries `2 l`, `2 l + 1` of the block, 0
    /// past `len`) and every lane arrives on `full[s]` after its own stores (a release each, so a
    /// consumer's wait orders every store before its reads; `full[s]` counts 32 arrivals).
    ///
    /// # Safety
    /// The whole warp calls it, converged. The maps must be valid tensor maps over 16-bit
    /// `[rows, D]` matrices (box 64 x 64, 128-byte swizzle), every streamed row inside them;
    /// `stats`' pointers valid for `len` rows; the ring initialized by [`init`].
    #[inline(always)]
    unsafe fn produce<const D: u32>(
        ring: Ring,
        own: [*const TensorMap; 2],
        (own_row, own_rows): (u32, u32),
        streamed: [*const TensorMap; 2],
        (row0, n): (u32, u32),
        stats: Option<RowStats>,
    ) {
        let lane = thread::thread_idx_x() % 32;
        let mut loads = 0;
        while loads < ring.cons && own_row + 64 * loads < own_rows {
            loads += 1;
        }
        if lane == 0 {
            unsafe {
                tma::prefetch(streamed[0]);
                tma::prefetch(streamed[1]);
                produce_owned::<D>(ring, own, own_row, loads);
            }
        } else if stats.is_none() {
            return;
        }
        let mut j = 0;
        while j < n {
            let st = j % ST;
            if j >= ST {
                unsafe { wait(ring.empty(st), ((j / ST) + 1) & 1) };
            }
            if let Some(rs) = stats {
                let mut v = [[0u32; 2]; 2];
                let mut e = 0;
                while e < 2 {
                    let q = rs.q0 + j * BQ + 2 * lane + e;
                    if q < rs.len {
                        let l = unsafe { *rs.lse.add(q as usize) };
                        v[0][e as usize] = (l * core::f32::consts::LOG2_E).to_bits();
                        v[1][e as usize] = unsafe { *rs.delta.add(q as usize) }.to_bits();
                    }
                    e += 1;
                }
                let at = ring.row_stats(st) + 8 * lane;
                unsafe {
                    shared::st_shared_v2(at, v[0]);
                    shared::st_shared_v2(at + 4 * BQ, v[1]);
                    if lane != 0 {
                        mbarrier::arrive(ring.full(st));
                    }
                }
            }
            if lane == 0 {
                let row = row0 + j * 64;
                unsafe {
                    mbarrier::arrive_expect_tx(ring.full(st), 2 * ring.tile);
                    load_tile::<D>(ring.streamed(st, 0), streamed[0], row, ring.full(st));
                    load_tile::<D>(ring.streamed(st, 1), streamed[1], row, ring.full(st));
                }
            }
            j += 1;
        }
    }

    /// The owned tiles' copies (`loads` consumer warpgroups' pairs), completing on `own_full`.
    ///
    /// # Safety
    /// One thread calls it; as [`produce`].
    #[inline(always)]
    unsafe fn produce_owned<const D: u32>(ring: Ring, own: [*const TensorMap; 2], own_row: u32, loads: u32) {
        unsafe {
            tma::prefetch(own[0]);
            tma::prefetch(own[1]);
            mbarrier::arrive_expect_tx(ring.own_full(), 2 * loads * ring.tile);
            let mut c = 0;
            while c < loads {
                load_tile::<D>(ring.own(2 * c), own[0], own_row + 64 * c, ring.own_full());
                load_tile::<D>(ring.own(2 * c + 1), own[1], own_row + 64 * c, ring.own_full());
                c += 1;
            }
        }
    }

    /// Issues the two 64 x 64 score products `x = A0 B0^T` and `y = A1 B1^T` over D (tiles in
    /// shared memory, all K-major) as two groups, `x`'s first; the caller waits for them
    /// (`wgmma::wait_group_m64n64::<1>(x)` is `x` alone).
    ///
    /// # Safety
    /// The whole consumer warpgroup calls it, converged; the tiles' copies are complete; `x` and
    /// `y` stay untouched until their groups are waited for.
    #[inline(always)]
    unsafe fn issue_scores<const F16: bool, const D: u32>(
        a0: u32,
        b0: u32,
        a1: u32,
        b1: u32,
        x: &mut [f32; 32],
        y: &mut [f32; 32],
    ) {
        wgmma::fence();
        let mut ks = 0;
        while ks < D / 16 {
            unsafe { wgmma::mma_m64n64k16_ss::<F16>(x, kmajor(a0, ks), kmajor(b0, ks), ks > 0) };
            ks += 1;
        }
        wgmma::commit_group();
        wgmma::fence();
        let mut ks = 0;
        while ks < D / 16 {
            unsafe { wgmma::mma_m64n64k16_ss::<F16>(y, kmajor(a1, ks), kmajor(b1, ks), ks > 0) };
            ks += 1;
        }
        wgmma::commit_group();
    }

    /// The A fragments of a 64 x 64 weight tile in accumulator layout (`w`): n8 blocks `2 kk` and
    /// `2 kk + 1` are the `m64k16` A fragment of k step `kk`, packed to bf16 / f16.
    #[inline(always)]
    fn fragments<const F16: bool>(w: &[f32; 32]) -> [[u32; 4]; 4] {
        let mut a = [[0u32; 4]; 4];
        let mut kk = 0;
        while kk < 4 {
            let b = 8 * kk;
            a[kk] = [
                pack::<F16>(w[b], w[b + 1]),
                pack::<F16>(w[b + 2], w[b + 3]),
                pack::<F16>(w[b + 4], w[b + 5]),
                pack::<F16>(w[b + 6], w[b + 7]),
            ];
            kk += 1;
        }
        a
    }

    /// Issues `acc (64 x D) += W (64 x 64) B` as one group: `w` the A fragments of W
    /// ([`fragments`]), `b` a 64-row tile of D columns in shared memory read MN-major (its rows are
    /// the reduction index).
    ///
    /// # Safety
    /// The whole consumer warpgroup calls it, converged, after [`wgmma::fence`]; `b`'s copies are
    /// complete; `acc` and `w` stay untouched until the group is waited for ([`wait_acc`]).
    #[inline(always)]
    unsafe fn weights_times_tile<const F16: bool, const D: u32, const NO: usize>(
        acc: &mut [f32; NO],
        w: &[[u32; 4]; 4],
        b: u32,
    ) {
        let mut kk = 0;
        while kk < 4 {
            let bd = mn_descriptor(b, kk as u32);
            if D == 128 {
                let a = unsafe { &mut *(acc.as_mut_ptr() as *mut [f32; 64]) };
                unsafe { wgmma::mma_m64n128k16_rs_tb::<F16>(a, w[kk], bd) };
            } else {
                let a = unsafe { &mut *(acc.as_mut_ptr() as *mut [f32; 32]) };
                unsafe { wgmma::mma_m64n64k16_rs_tb::<F16>(a, w[kk], bd) };
            }
            kk += 1;
        }
        wgmma::commit_group();
    }

    /// Waits until at most `N` groups are in flight, naming `acc` (64 x D) as written.
    ///
    /// # Safety
    /// The whole consumer warpgroup calls it, converged.
    #[inline(always)]
    unsafe fn wait_acc<const D: u32, const NO: usize, const N: u32>(acc: &mut [f32; NO]) {
        if D == 128 {
            unsafe { wgmma::wait_group_m64n128::<N>(&mut *(acc.as_mut_ptr() as *mut [f32; 64])) };
        } else {
            unsafe { wgmma::wait_group_m64n64::<N>(&mut *(acc.as_mut_ptr() as *mut [f32; 32])) };
        }
    }

    /// Stores the thread's part of a 64 x D accumulator times `mul`, rounded, to rows
    /// `rows[0]`, `rows[1]` (its `g` and `g + 8`) of the matrix at `dst` (row `r` at `dst + r D`),
    /// where they are below `len`: two elements per 4-byte store.
    ///
    /// # Safety
    /// `dst` must be 4-byte aligned and hold `len` rows of D.
    #[inline(always)]
    unsafe fn store_acc<const F16: bool, const D: u32, const NO: usize>(
        acc: &[f32; NO],
        mul: f32,
        dst: *mut u16,
        rows: [u32; 2],
        len: u32,
        tq: u32,
    ) {
        let mut h = 0;
        while h < 2 {
            if rows[h] < len {
                let base = rows[h] as usize * D as usize;
                let mut n = 0;
                while n < NO / 4 {
                    let col = n as u32 * 8 + 2 * tq;
                    let word = pack::<F16>(acc[4 * n + 2 * h] * mul, acc[4 * n + 2 * h + 1] * mul);
                    unsafe { (dst.add(base + col as usize) as *mut u32).write(word) };
                    n += 1;
                }
            }
            h += 1;
        }
    }

    /// The tensor maps of Q, K, V and dO, in that order.
    pub(super) type Maps = [*const TensorMap; 4];

    /// Splits the block into its roles: threads `128 CONS ..` produce (the warp of thread
    /// `128 CONS` runs `produce`; with two consumers the producer warpgroup first gives registers
    /// away), the consumer warpgroups run `consume` (with two, after taking those registers).
    ///
    /// # Safety
    /// All threads call it, converged; `produce` and `consume` as their callers require.
    #[inline(always)]
    unsafe fn roles<const CONS: u32>(produce: impl FnOnce(), consume: impl FnOnce()) {
        if thread::thread_idx_x() >= 128 * CONS {
            if CONS == 2 {
                unsafe { wgmma::setmaxnreg_dec::<FLASH_BWD_WGMMA2_PRODUCER_REGS>() };
            }
            if thread::thread_idx_x() < 128 * CONS + 32 {
                produce();
            }
        } else {
            if CONS == 2 {
                unsafe { wgmma::setmaxnreg_inc::<FLASH_BWD_WGMMA2_CONSUMER_REGS>() };
            }
            consume();
        }
    }

    #[inline(always)]
    pub(super) unsafe fn dkdv<const F16: bool, const D: u32, const NO: usize, const CONS: u32>(
        [q_map, k_map, v_map, do_map]: Maps,
        lse: *const f32,
        delta: *const f32,
        dk: *mut u16,
        dv: *mut u16,
        p: AttentionParams,
    ) {
        const { assert!(NO as u32 == D / 2 && (D == 64 || D == 128) && (CONS == 1 || CONS == 2)) };
        let bh = thread::block_idx_y();
        // the block's first key (consumer warpgroup c owns keys k0 + 64 c ..)
        let k0 = thread::block_idx_x() * BKV * CONS;
        let (q_len, kv_len) = (p.q_len, p.kv_len);
        let ring = Ring { base: shared::dynamic_smem_addr(), tile: flash_bwd_wgmma_tile_bytes(D), cons: CONS };
        // the query blocks that see the block's first key see all its keys
        let (i0, n_blocks) = flash_bwd_query_blocks(p, k0);
        init(ring, 32);
        let produce = || {
            let own = (bh * kv_len + k0, p.heads_total() * kv_len);
            let row0 = bh * q_len + i0 * BQ;
            let lb = bh as usize * q_len as usize;
            let stats =
                RowStats { lse: unsafe { lse.add(lb) }, delta: unsafe { delta.add(lb) }, len: q_len, q0: i0 * BQ };
            unsafe { produce::<D>(ring, [k_map, v_map], own, [q_map, do_map], (row0, n_blocks), Some(stats)) };
        };
        let consume = || unsafe {
            dkdv_consumer::<F16, D, NO>(ring, k0 + BKV * (thread::thread_idx_x() / 128), (i0, n_blocks), dk, dv, p)
        };
        unsafe { roles::<CONS>(produce, consume) };
    }

    /// A consumer thread's view of one streamed query block in the dK / dV kernel: its key rows
    /// `keys` (`g` and `g + 8` of its warp's 16), its quad index `tq`, the block's first query
    /// `q0`, the scale in log2 units, and the stage's per-query values ([`Ring::row_stats`]).
    #[derive(Clone, Copy)]
    struct KeyTile {
        keys: [u32; 2],
        tq: u32,
        q0: u32,
        scale_log2: f32,
        stats: u32,
    }

    impl KeyTile {
        /// Turns the scores `S^T` into `P^T = e^(scale S - lse)` in place; with `MASKED`, 0 where
        /// the query is past `q_len` or does not see the key. Element `4 nt + 2 h + e` is key row
        /// `keys[h]`, query column `8 nt + 2 tq + e`.
        ///
        /// # Safety
        /// `stats` must hold the stage's values (the stage's `full` barrier waited for).
        #[inline(always)]
        unsafe fn probabilities<const MASKED: bool>(self, s: &mut [f32; 32], p: AttentionParams) {
            let mut nt = 0;
            while nt < 8 {
                let col = 8 * nt as u32 + 2 * self.tq;
                let l2 = unsafe { shared::ld_shared_v2(self.stats + 4 * col) };
                let mut e = 0;
                while e < 2 {
                    let query = self.q0 + col + e as u32;
                    let vis = if !MASKED || query >= p.q_len { 0 } else { p.visible_keys(query) };
                    let mut h = 0;
                    while h < 2 {
                        let i = 4 * nt + 2 * h + e;
                        s[i] = if !MASKED || self.keys[h] < vis {
                            math::exp2_fast(math::fma(s[i], self.scale_log2, -f32::from_bits(l2[e])))
                        } else {
                            0.0
                        };
                        h += 1;
                    }
                    e += 1;
                }
                nt += 1;
            }
        }
    }

    /// One consumer warpgroup of the dK / dV kernel: keys `k0 .. k0 + 64` (its tiles `own(2 c)`,
    /// `own(2 c + 1)` for warpgroup `c`), query blocks `i0 .. i0 + n_blocks`.
    ///
    /// # Safety
    /// The warpgroup calls it, converged, with the ring's producer running.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn dkdv_consumer<const F16: bool, const D: u32, const NO: usize>(
        ring: Ring,
        k0: u32,
        (i0, n_blocks): (u32, u32),
        dk: *mut u16,
        dv: *mut u16,
        p: AttentionParams,
    ) {
        let tid = thread::thread_idx_x();
        let bh = thread::block_idx_y();
        let (q_len, kv_len) = (p.q_len, p.kv_len);
        let cw = tid / 128;
        // keys k0 + 16 w + g and k0 + 16 w + g + 8
        let (lane, w) = (tid % 32, (tid % 128) / 32);
        let (g, tq) = (lane / 4, lane % 4);
        let keys = [k0 + 16 * w + g, k0 + 16 * w + g + 8];
        let scale_log2 = p.scale * core::f32::consts::LOG2_E;
        let (k_tile, v_tile) = (ring.own(2 * cw), ring.own(2 * cw + 1));
        let mut dk_acc = [0.0f32; NO];
        let mut dv_acc = [0.0f32; NO];
        unsafe { wait(ring.own_full(), 0) };

        let mut j = 0;
        while j < n_blocks {
            let st = j % ST;
            unsafe { wait(ring.full(st), (j / ST) & 1) };
            let (q_t, do_t) = (ring.streamed(st, 0), ring.streamed(st, 1));
            let q0 = (i0 + j) * BQ;

            // S^T = K Q^T and dP^T = V dO^T: 64 keys x 64 queries
            let mut s = [0.0f32; 32];
            let mut dp = [0.0f32; 32];
            unsafe {
                issue_scores::<F16, D>(k_tile, q_t, v_tile, do_t, &mut s, &mut dp);
                wgmma::wait_group_m64n64::<1>(&mut s);
            }

            // P^T (0 where masked: queries past q_len, keys a query does not see) while dP^T is
            // in flight, then dV += P^T dO, in flight while dS^T is computed.
            let stats = ring.row_stats(st);
            let view = KeyTile { keys, tq, q0, scale_log2, stats };
            if p.tile_needs_mask(q0, k0, BKV) || q0 + BQ > q_len {
                unsafe { view.probabilities::<true>(&mut s, p) };
            } else {
                unsafe { view.probabilities::<false>(&mut s, p) };
            }
            let pa = fragments::<F16>(&s);
            wgmma::fence();
            unsafe {
                weights_times_tile::<F16, D, NO>(&mut dv_acc, &pa, do_t);
                // dP^T's group (dV's may still run)
                wgmma::wait_group_m64n64::<1>(&mut dp);
            }

            // dS^T = P^T (dP^T - delta) (0 where P is), then dK += dS^T Q
            let mut nt = 0;
            while nt < 8 {
                let dl = unsafe { shared::ld_shared_v2(stats + 4 * (BQ + 8 * nt as u32 + 2 * tq)) };
                let mut e = 0;
                while e < 2 {
                    let mut h = 0;
                    while h < 2 {
                        let i = 4 * nt + 2 * h + e;
                        dp[i] = s[i] * (dp[i] - f32::from_bits(dl[e]));
                        h += 1;
                    }
                    e += 1;
                }
                nt += 1;
            }
            let da = fragments::<F16>(&dp);
            wgmma::fence();
            unsafe {
                weights_times_tile::<F16, D, NO>(&mut dk_acc, &da, q_t);
                wait_acc::<D, NO, 1>(&mut dv_acc);
                wait_acc::<D, NO, 0>(&mut dk_acc);
                // this thread is done reading the stage
                mbarrier::arrive(ring.empty(st));
            }
            j += 1;
        }

        let kb = bh as usize * kv_len as usize * D as usize;
        unsafe {
            store_acc::<F16, D, NO>(&dk_acc, p.scale, dk.add(kb), keys, kv_len, tq);
            store_acc::<F16, D, NO>(&dv_acc, 1.0, dv.add(kb), keys, kv_len, tq);
        }
    }

    #[inline(always)]
    pub(super) unsafe fn dq<const F16: bool, const D: u32, const NO: usize, const CONS: u32>(
        [q_map, k_map, v_map, do_map]: Maps,
        lse: *const f32,
        delta: *const f32,
        dq: *mut u16,
        p: AttentionParams,
    ) {
        const { assert!(NO as u32 == D / 2 && (D == 64 || D == 128) && (CONS == 1 || CONS == 2)) };
        let bh = thread::block_idx_y();
        // the block's first query row (consumer warpgroup c owns rows q0 + 64 c ..)
        let q0 = (thread::grid_dim_x() - 1 - thread::block_idx_x()) * BQ * CONS;
        let (q_len, kv_len) = (p.q_len, p.kv_len);
        let ring = Ring { base: shared::dynamic_smem_addr(), tile: flash_bwd_wgmma_tile_bytes(D), cons: CONS };
        // the keys the block's last row sees: every row's
        let n_tiles = p.keys_for_rows(q0, BQ * CONS).div_ceil(BKV);
        init(ring, 1);
        let produce = || {
            let own = (bh * q_len + q0, p.heads_total() * q_len);
            unsafe { produce::<D>(ring, [q_map, do_map], own, [k_map, v_map], (bh * kv_len, n_tiles), None) };
        };
        let consume = || unsafe {
            dq_consumer::<F16, D, NO>(ring, q0 + BQ * (thread::thread_idx_x() / 128), n_tiles, lse, delta, dq, p)
        };
        unsafe { roles::<CONS>(produce, consume) };
    }

    /// One consumer warpgroup of the dQ kernel: query rows `q0 .. q0 + 64` (its tiles `own(2 c)`,
    /// `own(2 c + 1)` for warpgroup `c`), key tiles `0 .. n_tiles`.
    ///
    /// # Safety
    /// The warpgroup calls it, converged, with the ring's producer running.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn dq_consumer<const F16: bool, const D: u32, const NO: usize>(
        ring: Ring,
        q0: u32,
        n_tiles: u32,
        lse: *const f32,
        delta: *const f32,
        dq: *mut u16,
        p: AttentionParams,
    ) {
        let tid = thread::thread_idx_x();
        let bh = thread::block_idx_y();
        let q_len = p.q_len;
        let cw = tid / 128;
        // query rows q0 + 16 w + g and q0 + 16 w + g + 8
        let (lane, w) = (tid % 32, (tid % 128) / 32);
        let (g, tq) = (lane / 4, lane % 4);
        let rows = [q0 + 16 * w + g, q0 + 16 * w + g + 8];
        let scale_log2 = p.scale * core::f32::consts::LOG2_E;
        let lb = bh as usize * q_len as usize;
        // per row: the log-sum-exp in log2 units, delta, and the keys it sees (0 past q_len and
        // for a row that sees no key)
        let mut lse2 = [0.0f32; 2];
        let mut dl = [0.0f32; 2];
        let mut vis = [0u32; 2];
        let mut h = 0;
        while h < 2 {
            if rows[h] < q_len {
                let l = unsafe { *lse.add(lb + rows[h] as usize) };
                lse2[h] = l * core::f32::consts::LOG2_E;
                dl[h] = unsafe { *delta.add(lb + rows[h] as usize) };
                vis[h] = if l == f32::NEG_INFINITY { 0 } else { p.visible_keys(rows[h]) };
            }
            h += 1;
        }
        let (q_tile, do_tile) = (ring.own(2 * cw), ring.own(2 * cw + 1));
        let mut dq_acc = [0.0f32; NO];
        unsafe { wait(ring.own_full(), 0) };

        let mut j = 0;
        while j < n_tiles {
            let st = j % ST;
            unsafe { wait(ring.full(st), (j / ST) & 1) };
            let (k_t, v_t) = (ring.streamed(st, 0), ring.streamed(st, 1));
            let k0 = j * BKV;

            // S = Q K^T and dP = dO V^T: 64 queries x 64 keys
            let mut s = [0.0f32; 32];
            let mut dp = [0.0f32; 32];
            unsafe {
                issue_scores::<F16, D>(q_tile, k_t, do_tile, v_t, &mut s, &mut dp);
                wgmma::wait_group_m64n64::<1>(&mut s);
                wgmma::wait_group_m64n64::<0>(&mut dp);
            }

            // dS (0 where masked); element i is row g + 8 ((i % 4) / 2), key column
            // 8 (i / 4) + 2 tq + i % 2
            let mut i = 0;
            while i < 32 {
                let key = k0 + 8 * (i as u32 / 4) + 2 * tq + (i as u32 % 2);
                let h = (i % 4) / 2;
                s[i] = if key < vis[h] {
                    let pv = math::exp2_fast(math::fma(s[i], scale_log2, -lse2[h]));
                    pv * (dp[i] - dl[h])
                } else {
                    0.0
                };
                i += 1;
            }
            let da = fragments::<F16>(&s);

            // dQ += dS K
            wgmma::fence();
            unsafe {
                weights_times_tile::<F16, D, NO>(&mut dq_acc, &da, k_t);
                wait_acc::<D, NO, 0>(&mut dq_acc);
                mbarrier::arrive(ring.empty(st));
            }
            j += 1;
        }

        let qb = bh as usize * q_len as usize * D as usize;
        unsafe { store_acc::<F16, D, NO>(&dq_acc, p.scale, dq.add(qb), rows, q_len, tq) };
    }
}

macro_rules! flash_bwd_wgmma_kernels {
    ($($(#[$doc:meta])+ $dkdv:ident, $dq:ident: $ty:ty, $f16:literal, $d:literal, $cons:literal, $threads:literal;)*) => {$(
        $(#[$doc])+
        /// The dK / dV pass.
        ///
        /// Parameters: `q_map`, `k_map`, `v_map`, `do_map` (tensor maps in global memory over Q and
        /// dO as `[batch * heads * q_len, head_dim]`, K and V as `[batch * heads * kv_len,
        /// head_dim]`, box 64 x 64, 128-byte swizzle), `lse` (the forward's), `delta` (the delta
        /// pass's), `dk`, `dv` (written, the shape of K, 4-byte aligned), `p`. Grid
        /// `(ceil(kv_len / (64 C)), batch * heads)` for `C` consumer warpgroups; block
        /// [`FLASH_BWD_WGMMA_THREADS`] (C = 1: warps 0-3 consume, warp 4 produces) or
        /// [`FLASH_BWD_WGMMA2_THREADS`] (C = 2: warpgroups 0 and 1 consume, 2 produces); dynamic
        /// shared memory `flash_bwd_wgmma_smem_bytes(head_dim)` (C = 1) or
        /// `flash_bwd_wgmma2_smem_bytes(head_dim)` (C = 2). Tiling and thread mapping: the module
        /// docs.
        #[kernel(arch = "sm_90a", max_threads = $threads)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $dkdv(
            q_map: DevicePtr<TensorMap>,
            k_map: DevicePtr<TensorMap>,
            v_map: DevicePtr<TensorMap>,
            do_map: DevicePtr<TensorMap>,
            lse: DevicePtr<f32>,
            delta: DevicePtr<f32>,
            dk: DevicePtrMut<$ty>,
            dv: DevicePtrMut<$ty>,
            p: AttentionParams,
        ) {
            let maps = [q_map.as_ptr(), k_map.as_ptr(), v_map.as_ptr(), do_map.as_ptr()];
            unsafe {
                device::dkdv::<$f16, $d, { $d / 2 }, $cons>(
                    maps,
                    lse.as_ptr(),
                    delta.as_ptr(),
                    dk.as_mut_ptr() as *mut u16,
                    dv.as_mut_ptr() as *mut u16,
                    p,
                )
            }
        }

        $(#[$doc])+
        /// The dQ pass.
        ///
        /// Parameters: `q_map`, `k_map`, `v_map`, `do_map` (as the dK / dV pass's), `lse`,
        /// `delta`, `dq` (written, the shape of Q, 4-byte aligned), `p`. Grid
        /// `(ceil(q_len / (64 C)), batch * heads)`; block and shared memory as the dK / dV pass's.
        /// Tiling and thread mapping: the module docs.
        #[kernel(arch = "sm_90a", max_threads = $threads)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $dq(
            q_map: DevicePtr<TensorMap>,
            k_map: DevicePtr<TensorMap>,
            v_map: DevicePtr<TensorMap>,
            do_map: DevicePtr<TensorMap>,
            lse: DevicePtr<f32>,
            delta: DevicePtr<f32>,
            dq: DevicePtrMut<$ty>,
            p: AttentionParams,
        ) {
            let maps = [q_map.as_ptr(), k_map.as_ptr(), v_map.as_ptr(), do_map.as_ptr()];
            unsafe {
                device::dq::<$f16, $d, { $d / 2 }, $cons>(maps, lse.as_ptr(), delta.as_ptr(), dq.as_mut_ptr() as *mut u16, p)
            }
        }
    )*};
}

flash_bwd_wgmma_kernels! {
    /// FlashAttention backward on TMA + `wgmma` (sm_90a), bf16 in and out (f32 accumulation), head
    /// dim 64.
    flash_bwd_dkdv_wgmma_bf16_d64, flash_bwd_dq_wgmma_bf16_d64: bf16, false, 64, 1, 160;
    /// FlashAttention backward on TMA + `wgmma` (sm_90a), bf16 in and out (f32 accumulation), head
    /// dim 128.
    flash_bwd_dkdv_wgmma_bf16_d128, flash_bwd_dq_wgmma_bf16_d128: bf16, false, 128, 1, 160;
    /// FlashAttention backward on TMA + `wgmma` (sm_90a), f16 in and out (f32 accumulation), head
    /// dim 64.
    flash_bwd_dkdv_wgmma_f16_d64, flash_bwd_dq_wgmma_f16_d64: f16, true, 64, 1, 160;
    /// FlashAttention backward on TMA + `wgmma` (sm_90a), f16 in and out (f32 accumulation), head
    /// dim 128.
    flash_bwd_dkdv_wgmma_f16_d128, flash_bwd_dq_wgmma_f16_d128: f16, true, 128, 1, 160;
    /// The two-consumer form (128 keys per dK / dV block, 128 query rows per dQ block, each
    /// streamed tile shared by both warpgroups; `setmaxnreg`), bf16, head dim 64.
    flash_bwd_dkdv_wgmma2_bf16_d64, flash_bwd_dq_wgmma2_bf16_d64: bf16, false, 64, 2, 384;
    /// The two-consumer form, bf16, head dim 128.
    flash_bwd_dkdv_wgmma2_bf16_d128, flash_bwd_dq_wgmma2_bf16_d128: bf16, false, 128, 2, 384;
    /// The two-consumer form, f16, head dim 64.
    flash_bwd_dkdv_wgmma2_f16_d64, flash_bwd_dq_wgmma2_f16_d64: f16, true, 64, 2, 384;
    /// The two-consumer form, f16, head dim 128.
    flash_bwd_dkdv_wgmma2_f16_d128, flash_bwd_dq_wgmma2_f16_d128: f16, true, 128, 2, 384;
}
