//! Blackwell GEMM (sm_100a): `C = A B^T` with A (m x k) and B (n x k) bf16 row-major (both
//! K-major), C (m x n) f32, on the fifth-generation tensor cores, warp-specialized and persistent.
//!
//! The shape is the one `../shared/seeds/001` traces through CUTLASS's Blackwell pipeline, in
//! kiln's own code:
//!
//! - **Producer** (warp 0, one thread): the Hopper kernels' TMA ring ([`WG_STAGES`] stages of a
//!   128 x 64 A box and a 256 x 64 B box, 128-byte swizzle), filled tile after tile; a stage is
//!   refilled once the products reading it have completed.
//! - **MMA issuer** (warp 1, one thread): per k tile, waits for the stage, issues four
//!   `tcgen05.mma.cta_group::1.kind::f16` of 128 x 256 x 16 into the tile's accumulator in tensor
//!   memory (TMEM), and `tcgen05.commit`s the stage's `empty` barrier, which arrives when those
//!   products are done. After a tile's last k tile it commits the accumulator's `acc_full` barrier.
//! - **TMEM owner** (warp 2): allocates all 512 columns at the start (two 256-column f32
//!   accumulators, so one tile's epilogue overlaps the next tile's products) and frees them at the
//!   end.
//! - **Epilogue** (warps 4-7, one warpgroup): waits for `acc_full`, reads its 32 lanes (rows) of the
//!   accumulator 32 columns at a time with `tcgen05.ld.32x32b.x32`, stores them to C (masked), and
//!   arrives on `acc_empty` (128 arrivals), which frees the accumulator for the tile after next.
//!   Warp `w` may only read TMEM lanes `32 (w % 4) ..`, which is why the epilogue is warps 4-7.
//!
//! Parity: the ring's as in `gemm_wgmma` (its use counter runs on across tiles); accumulator `b`
//! of local tile `j` is `j % 2`, its `acc_full` wait parity `(j / 2) & 1` ([`acc_full_parity`]) and
//! the issuer's `acc_empty` wait (from `j = 2` on) the parity of the release of tile `j - 2`
//! ([`acc_empty_parity`]). Every wait is bounded and traps on a stall.
//!
//! Not done (as CUTLASS does): the producer does not drain the ring's last `empty` commits before
//! the block exits (the products they track have completed: the epilogue waited for the tile's
//! `acc_full`, committed after them); and the kernel takes all 512 TMEM columns, so a block of
//! another kernel holding TMEM on the same SM would make its allocation wait.
//!
//! Status: assembled by ptxas for sm_100a in CI; its encodings and schedule are tested on the host.
//! **It has never run**: no Blackwell GPU is lent to kiln's developers, and its GPU test skips below
//! compute capability 10.0.

use super::gemm::GemmShape;
use super::gemm_wgmma::{WG_BK, WG_STAGES, WW_BARRIERS, WW_STAGE_BYTES};
use crate::tcgen05::{Accum, F16Kind, Layout, Major, instr_desc_f16, smem_desc};
use crate::tma::TensorMap;
use crate::{DevicePtr, DevicePtrMut, kernel};
use crate::{fence, mbarrier, shared, sync, tcgen05, thread, tma};

/// Rows of C per tile (the MMA's M, one TMEM lane per row).
pub const TC_BM: u32 = 128;
/// Columns of C per tile (the MMA's N, one TMEM column per output column).
pub const TC_BN: u32 = 256;
/// k per MMA instruction.
pub const TC_UMMA_K: u32 = 16;
/// Threads per block: producer, issuer, TMEM owner, one idle warp, and the epilogue warpgroup.
pub const TC_THREADS: u32 = 256;
/// The first epilogue warp (warps `TC_EPI_WARP0 .. TC_EPI_WARP0 + 4`).
pub const TC_EPI_WARP0: u32 = 4;
/// Epilogue threads: each arrives on `acc_empty` once per tile.
pub const TC_EPI_THREADS: u32 = 128;
/// Accumulators in TMEM (each `TC_BN` f32 columns of 128 lanes).
pub const TC_ACCUMULATORS: u32 = 2;
/// TMEM columns the kernel allocates: both accumulators, all of an SM's tensor memory.
pub const TC_TMEM_COLUMNS: u32 = TC_ACCUMULATORS * TC_BN;
/// Offset of the accumulator barriers: after the ring's stages and its `full` / `empty` barriers.
pub const TC_ACC_BARRIERS: u32 = WW_BARRIERS + 2 * WG_STAGES * 8;
/// Offset of the shared word the TMEM allocation writes its base address to.
pub const TC_TMEM_SLOT: u32 = TC_ACC_BARRIERS + 2 * TC_ACCUMULATORS * 8;
/// Dynamic shared memory per block.
pub const TC_SMEM_BYTES: u32 = TC_TMEM_SLOT + 16;
/// Rows of C per tile group of the tile order (as the Hopper wide kernel's).
pub const TC_GROUP_M: u32 = super::gemm_wgmma::WW_GROUP_M;

/// The instruction descriptor of every MMA: bf16 A and B, both K-major, f32 accumulators,
/// 128 x 256.
pub const TC_IDESC: u32 =
    match instr_desc_f16(F16Kind::Bf16, F16Kind::Bf16, Accum::F32, TC_BM, TC_BN, Major::K, Major::K) {
        Some(d) => d,
        None => panic!("128 x 256 is a tcgen05.mma shape"),
    };

/// The descriptor of a K-major, 128-byte-swizzled operand tile at shared address `addr`, advanced to
/// k step `kk` (16 bf16, 32 bytes, inside the swizzle atom): 8-row groups 1024 bytes apart (SBO);
/// the leading offset is unused for swizzled K-major tiles (encoded as 16 bytes).
pub const fn operand_descriptor(addr: u32, kk: u32) -> u64 {
    smem_desc(addr + kk * TC_UMMA_K * 2, 16, 1024, 0, Layout::Swizzle128B)
}

/// The accumulator of a CTA's `j`-th tile.
pub const fn accumulator(j: u32) -> u32 {
    j % TC_ACCUMULATORS
}

/// The parity the epilogue waits for on `acc_full[accumulator(j)]` for its `j`-th tile: that
/// barrier's `(j / 2)`-th completion.
pub const fn acc_full_parity(j: u32) -> u32 {
    (j / TC_ACCUMULATORS) & 1
}

/// The parity the issuer waits for on `acc_empty[accumulator(j)]` before the `j`-th tile's first
/// MMA, for `j >= 2`: the epilogue's release of tile `j - 2`, that barrier's `(j / 2 - 1)`-th
/// completion.
pub const fn acc_empty_parity(j: u32) -> u32 {
    (j / TC_ACCUMULATORS + 1) & 1
}

/// The tile a CTA takes on its `j`-th turn (`cta + j * ctas` in the grouped order), or `None`
/// past the last.
pub const fn tc_tile(cta: u32, ctas: u32, j: u32, tiles_m: u32, tiles_n: u32) -> Option<(u32, u32)> {
    let t = cta as u64 + j as u64 * ctas as u64;
    if t >= tiles_m as u64 * tiles_n as u64 {
        return None;
    }
    Some(super::gemm_wgmma::grouped_tile(t as u32, tiles_m, tiles_n, TC_GROUP_M))
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
fn wait_or_trap(bar: u32, parity: u32) {
    if !unsafe { mbarrier::wait_parity_bounded(bar, parity, mbarrier::DEFAULT_WAIT_NS) } {
        thread::trap();
    }
}

/// `C = A B^T` (see the module docs). `a_map`: bf16 tensor map of A with a 64 x 128 box, `b_map`:
/// of B with a 64 x 256 box, both 128-byte swizzled; `k % 8 == 0`. Grid: at most one CTA per SM
/// (persistent: CTA `i` takes tiles `i, i + grid, ...` of the `ceil(m / 128) x ceil(n / 256)`
/// tiles in grouped order); block [`TC_THREADS`]; dynamic shared memory [`TC_SMEM_BYTES`].
///
/// No launch bound: with `.maxntid 256` ptxas aims at three blocks per SM, allocates 80 registers
/// and spills; shared memory allows one block anyway, and without the bound it takes 95 and spills
/// nothing.
#[kernel(arch = "sm_100a")]
pub unsafe fn gemm_tcgen05_bf16(
    a_map: DevicePtr<TensorMap>,
    b_map: DevicePtr<TensorMap>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    let base = shared::dynamic_smem_addr();
    let ring = super::gemm_wgmma::Ring { base, stage_bytes: WW_STAGE_BYTES };
    let acc_full = |b: u32| base + TC_ACC_BARRIERS + b * 8;
    let acc_empty = |b: u32| base + TC_ACC_BARRIERS + (TC_ACCUMULATORS + b) * 8;
    let (warp, lane) = (thread::warp_id(), thread::lane_id());
    let (tiles_m, tiles_n) = (s.m.div_ceil(TC_BM), s.n.div_ceil(TC_BN));
    let (cta, ctas) = (thread::block_idx_x(), thread::grid_dim_x());
    let k_tiles = s.k.div_ceil(WG_BK);

    // Set-up: the ring's barriers (one `empty` arrival per stage use: the issuer's commit), the
    // accumulator barriers, and the TMEM allocation, published to every thread.
    if thread::thread_idx_x() == 0 {
        let mut b = 0;
        while b < TC_ACCUMULATORS {
            unsafe {
                mbarrier::init(acc_full(b), 1);
                mbarrier::init(acc_empty(b), TC_EPI_THREADS);
            }
            b += 1;
        }
    }
    ring.init(1); // initializes the ring's barriers, fences the inits, block barrier
    if warp == 2 {
        unsafe { tcgen05::alloc(base + TC_TMEM_SLOT, TC_TMEM_COLUMNS) };
        tcgen05::relinquish_alloc_permit();
    }
    tcgen05::fence_before_thread_sync();
    sync::sync_threads();
    tcgen05::fence_after_thread_sync();
    let tmem = unsafe { *shared::dynamic_smem::<u32>(TC_TMEM_SLOT as usize) };

    if warp == 0 && lane == 0 {
        // Producer.
        unsafe {
            tma::prefetch(a_map.as_ptr());
            tma::prefetch(b_map.as_ptr());
        }
        let (mut j, mut t) = (0, 0);
        while let Some((tm, tn)) = tc_tile(cta, ctas, j, tiles_m, tiles_n) {
            let mut kt = 0;
            while kt < k_tiles {
                unsafe { ring.fill_at(a_map, b_map, t, kt * WG_BK, tm * TC_BM, tn * TC_BN) };
                (kt, t) = (kt + 1, t + 1);
            }
            j += 1;
        }
    } else if warp == 1 && lane == 0 {
        // MMA issuer.
        let (mut j, mut t) = (0, 0);
        while tc_tile(cta, ctas, j, tiles_m, tiles_n).is_some() {
            let acc = accumulator(j);
            if j >= TC_ACCUMULATORS {
                wait_or_trap(acc_empty(acc), acc_empty_parity(j));
            }
            tcgen05::fence_after_thread_sync();
            let d = tcgen05::tmem_addr(tmem, 0, acc * TC_BN);
            let mut kt = 0;
            while kt < k_tiles {
                ring.wait_full(t);
                let st = t % WG_STAGES;
                let (a_tile, b_tile) = (ring.stage(st), ring.stage(st) + TC_BM * WG_BK * 2);
                let mut kk = 0;
                while kk < WG_BK / TC_UMMA_K {
                    let (a, b) = (operand_descriptor(a_tile, kk), operand_descriptor(b_tile, kk));
                    unsafe { tcgen05::mma_f16(d, a, b, TC_IDESC, kt > 0 || kk > 0) };
                    kk += 1;
                }
                // the stage is free once these products have read it
                unsafe { tcgen05::commit(ring.empty(st)) };
                (kt, t) = (kt + 1, t + 1);
            }
            // the accumulator is complete once every product of the tile is
            unsafe { tcgen05::commit(acc_full(acc)) };
            j += 1;
        }
    } else if warp >= TC_EPI_WARP0 {
        // Epilogue: this warp's 32 rows of each tile.
        let lane0 = tcgen05::warp_lane_base(warp);
        let mut j = 0;
        while let Some((tm, tn)) = tc_tile(cta, ctas, j, tiles_m, tiles_n) {
            let acc = accumulator(j);
            wait_or_trap(acc_full(acc), acc_full_parity(j));
            tcgen05::fence_after_thread_sync();
            let row = tm * TC_BM + lane0 + lane;
            let mut chunk = 0;
            while chunk < TC_BN / 32 {
                // warp-wide, whatever this thread's row: every lane of the warp must take part
                let v = unsafe { tcgen05::ld_32x32b_x32(tcgen05::tmem_addr(tmem, lane0, acc * TC_BN + chunk * 32)) };
                let col0 = tn * TC_BN + chunk * 32;
                if row < s.m {
                    store_row32(c, s, row, col0, &v);
                }
                chunk += 1;
            }
            tcgen05::fence_before_thread_sync();
            unsafe { mbarrier::arrive(acc_empty(acc)) };
            j += 1;
        }
    }

    // Teardown: every product has been read out (the epilogue waited for each), so the owner frees
    // the tensor memory.
    tcgen05::fence_before_thread_sync();
    sync::sync_threads();
    tcgen05::fence_after_thread_sync();
    if warp == 2 {
        unsafe { tcgen05::dealloc(tmem, TC_TMEM_COLUMNS) };
    }
}

/// Stores 32 accumulator bits as f32 to row `row`, columns `col0 ..` of C (masked at n; 16-byte
/// stores where the row's pitch and the columns allow).
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
#[inline(always)]
fn store_row32(c: DevicePtrMut<f32>, s: GemmShape, row: u32, col0: u32, v: &[u32; 32]) {
    let at = row as usize * s.n as usize + col0 as usize;
    let mut i = 0;
    while i < 32 {
        let col = col0 + i;
        let q = [
            f32::from_bits(v[i as usize]),
            f32::from_bits(v[i as usize + 1]),
            f32::from_bits(v[i as usize + 2]),
            f32::from_bits(v[i as usize + 3]),
        ];
        if col + 4 <= s.n && (at + i as usize).is_multiple_of(4) {
            unsafe { c.write4((at + i as usize) / 4, q) };
        } else {
            let mut e = 0;
            while e < 4 {
                if col + e < s.n {
                    unsafe { c.write(at + (i + e) as usize, q[e as usize]) };
                }
                e += 1;
            }
        }
        i += 4;
    }
}
