//! Hopper GEMM (sm_90a): TMA loads into 128-byte-swizzled shared memory on an mbarrier ring, and
//! `wgmma.mma_async` from two consumer warpgroups while a producer warpgroup keeps the ring full.
//! `C = A B^T` with A (m x k) and B (n x k) bf16 row-major (both K-major), C (m x n) f32.
//!
//! - Block tile 128 x 128, k step 64 (one 128-byte swizzle span of bf16), [`WG_STAGES`] stages.
//! - Warpgroup 0 is the producer: its thread 0 waits for a stage to be empty, announces the stage's
//!   bytes and issues the two TMA loads (A rows m0.., B rows n0..), which complete on the stage's
//!   `full` barrier. Warpgroups 1 and 2 are consumers: each waits for `full`, runs 4 wgmma
//!   `m64n128k16` on its 64 rows of A and all of B, waits for them, and one thread per consumer
//!   arrives on the stage's `empty` barrier (count 2).
//! - Parity: use `t` of stage `s = t % STAGES` is that barrier's phase `t / STAGES`; consumers wait on
//!   `full[s]` with parity `(t / STAGES) & 1`; the producer, from the second lap on, waits on
//!   `empty[s]` with the parity of the previous lap. Every wait is bounded and traps on a stall.
//! - Descriptors: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart (SBO); each 16-wide k
//!   step advances the start address by 32 bytes inside the swizzle atom.
//! - Edges: TMA zero-fills rows and k past the tensor; stores are masked. `k % 8 == 0` (the tensor
//!   map's row pitch must be a multiple of 16 bytes).
//!
//! Status: both kernels pass their GPU tests on the H200; the wide one reaches 0.82-0.95 / 0.85-0.95 of cuBLAS
//! at 4096^3 / 8192^3 (`benches/results/gemm.md`).

use super::mma_tile::GemmShape;
use crate::swizzle::Swizzle;
use crate::tma::TensorMap;
use crate::{DevicePtr, DevicePtrMut, kernel};
use crate::{fence, mbarrier, shared, sync, thread, tma, wgmma};

/// Rows of C per block (two consumer warpgroups of 64).
pub const WG_BM: u32 = 128;
/// Columns of C per block.
pub const WG_BN: u32 = 128;
/// k per stage: 64 bf16 = 128 bytes, the swizzle span.
pub const WG_BK: u32 = 64;
/// Ring depth.
pub const WG_STAGES: u32 = 4;
/// Threads per block: three warpgroups.
pub const WG_THREADS: u32 = 384;
/// Bytes of the A tile in one stage (the B tile follows it).
pub const WG_TILE_BYTES: u32 = WG_BM * WG_BK * 2;
/// Bytes of one stage: the A tile and the B tile (both boxes the TMA delivers).
pub const WG_STAGE_BYTES: u32 = (WG_BM + WG_BN) * WG_BK * 2;
/// Offset of the barriers (after the stages).
pub const WG_BARRIERS: u32 = WG_STAGES * WG_STAGE_BYTES;
/// Dynamic shared memory per block: the stages and 2 x STAGES barriers.
pub const WG_SMEM_BYTES: u32 = WG_BARRIERS + 2 * WG_STAGES * 8;
/// The tensor maps' swizzle.
pub const WG_SWIZZLE: Swizzle = Swizzle::B128;

/// The descriptor of a K-major, 128-byte-swizzled tile at shared address `addr`, advanced to k step
/// `kk` (16 elements each).
pub const fn tile_descriptor(addr: u32, kk: u32) -> u64 {
    wgmma::smem_descriptor(addr + kk * 32, 16, 1024, 0, Swizzle::B128)
}

/// The parity a consumer waits for on `full[t % STAGES]` at use `t`.
pub const fn full_parity(t: u32) -> u32 {
    (t / WG_STAGES) & 1
}

/// The parity the producer waits for on `empty[t % STAGES]` before its use `t >= STAGES` (the
/// consumers' release of the previous lap).
pub const fn empty_parity(t: u32) -> u32 {
    ((t / WG_STAGES) + 1) & 1
}

/// The stage ring in dynamic shared memory: `STAGES` stages of `stage_bytes` from `base` (A tile,
/// then B tile), followed by the `full` and `empty` mbarriers of each stage.
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
#[derive(Clone, Copy)]
struct Ring {
    base: u32,
    stage_bytes: u32,
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
impl Ring {
    fn stage(self, st: u32) -> u32 {
        self.base + st * self.stage_bytes
    }
    fn full(self, st: u32) -> u32 {
        self.base + WG_STAGES * self.stage_bytes + st * 8
    }
    fn empty(self, st: u32) -> u32 {
        self.base + WG_STAGES * self.stage_bytes + (WG_STAGES + st) * 8
    }

    /// Checks the 1024-byte alignment 128-byte swizzling needs (it is computed from address bits),
    /// and has thread 0 initialize the barriers (`full`: one arrival plus the bytes; `empty`: one
    /// arrival per consumer warpgroup); then a block barrier. All threads call it.
    fn init(self) {
        if self.base % 1024 != 0 {
            thread::trap();
        }
        if thread::thread_idx_x() == 0 {
            let mut st = 0;
            while st < WG_STAGES {
                unsafe {
                    mbarrier::init(self.full(st), 1);
                    mbarrier::init(self.empty(st), 2);
                }
                st += 1;
            }
            fence::mbarrier_init_release_cluster();
        }
        sync::sync_threads();
    }

    /// The producer (one thread): for each k tile, waits until its stage is empty (from the second
    /// lap on), announces the stage's bytes on `full`, and issues the TMA loads of the A box (rows
    /// `m0..`) and the B box (rows `n0..`). Every wait is bounded and traps on a stall.
    unsafe fn produce(self, a_map: DevicePtr<TensorMap>, b_map: DevicePtr<TensorMap>, k_tiles: u32, m0: u32, n0: u32) {
        unsafe {
            tma::prefetch(a_map.as_ptr());
            tma::prefetch(b_map.as_ptr());
        }
        let mut t = 0;
        while t < k_tiles {
            let st = t % WG_STAGES;
            if t >= WG_STAGES
                && !unsafe { mbarrier::wait_parity_bounded(self.empty(st), empty_parity(t), mbarrier::DEFAULT_WAIT_NS) }
            {
                thread::trap();
            }
            let dst = self.stage(st);
            unsafe {
                mbarrier::arrive_expect_tx(self.full(st), self.stage_bytes);
                tma::load_2d(dst, a_map.as_ptr(), (t * WG_BK) as i32, m0 as i32, self.full(st));
                tma::load_2d(dst + WG_TILE_BYTES, b_map.as_ptr(), (t * WG_BK) as i32, n0 as i32, self.full(st));
            }
            t += 1;
        }
    }

    /// A consumer's wait for k tile `t`'s stage to be full (bounded; traps on a stall).
    fn wait_full(self, t: u32) {
        if !unsafe {
            mbarrier::wait_parity_bounded(self.full(t % WG_STAGES), full_parity(t), mbarrier::DEFAULT_WAIT_NS)
        } {
            thread::trap();
        }
    }
}

/// `C = A B^T` (see the module docs). `a_map` / `b_map`: bf16 tensor maps (box 64 x 128, 128-byte
/// swizzle) in global memory. Grid (ceil(n / 128), ceil(m / 128)); block 384; dynamic shared memory
/// [`WG_SMEM_BYTES`].
#[kernel(arch = "sm_90a")]
pub unsafe fn gemm_wgmma_bf16(
    a_map: DevicePtr<TensorMap>,
    b_map: DevicePtr<TensorMap>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    let tid = thread::thread_idx_x();
    let wg = tid / 128;
    let (m0, n0) = (thread::block_idx_y() * WG_BM, thread::block_idx_x() * WG_BN);
    let ring = Ring { base: shared::dynamic_smem_addr(), stage_bytes: WG_STAGE_BYTES };
    let k_tiles = s.k.div_ceil(WG_BK);
    ring.init();
    if wg == 0 {
        if tid == 0 {
            unsafe { ring.produce(a_map, b_map, k_tiles, m0, n0) };
        }
        return;
    }

    // Consumers: warpgroup 1 takes rows 0..64 of the tile, warpgroup 2 rows 64..128.
    let cons = wg - 1;
    let ct = tid - 128 * wg; // thread within the warpgroup
    let mut acc = [0.0f32; 64];
    let mut t = 0;
    while t < k_tiles {
        let st = t % WG_STAGES;
        ring.wait_full(t);
        let a_tile = ring.stage(st) + cons * 64 * 128;
        let b_tile = ring.stage(st) + WG_TILE_BYTES;
        wgmma::fence();
        let mut kk = 0;
        while kk < WG_BK / 16 {
            unsafe {
                wgmma::mma_m64n128k16_bf16(
                    &mut acc,
                    tile_descriptor(a_tile, kk),
                    tile_descriptor(b_tile, kk),
                    t > 0 || kk > 0,
                )
            };
            kk += 1;
        }
        wgmma::commit_group();
        wgmma::wait_group::<0>();
        if ct == 0 {
            unsafe { mbarrier::arrive(ring.empty(st)) };
        }
        t += 1;
    }

    let mut i = 0;
    while i < 64 {
        let (r, col) = wgmma::acc_m64n128(ct, i);
        let (row, col) = (m0 + cons * 64 + r, n0 + col);
        if row < s.m && col < s.n {
            unsafe { c.write((row * s.n + col) as usize, acc[i as usize]) };
        }
        i += 1;
    }
}

/// Columns of C per block of the wide kernel ([`gemm_wgmma_bf16_wide`]).
pub const WW_BN: u32 = 256;
/// Bytes of one stage of the wide kernel: the 128 x 64 A tile, then the 256 x 64 B tile.
pub const WW_STAGE_BYTES: u32 = (WG_BM + WW_BN) * WG_BK * 2;
/// Offset of the wide kernel's barriers (after its stages).
pub const WW_BARRIERS: u32 = WG_STAGES * WW_STAGE_BYTES;
/// Dynamic shared memory of the wide kernel: 4 stages of 48 KiB and the barriers.
pub const WW_SMEM_BYTES: u32 = WW_BARRIERS + 2 * WG_STAGES * 8;
/// Tile rows per group of the wide kernel's block order ([`grouped_tile`]).
pub const WW_GROUP_M: u32 = 8;
/// Per-thread registers the wide kernel's producer warpgroup keeps (`setmaxnreg.dec`).
pub const WW_PRODUCER_REGS: u32 = 40;
/// Per-thread registers the wide kernel's consumer warpgroups take (`setmaxnreg.inc`): with the
/// producer's, 128 x 40 + 256 x 232 = 64 512 of the SM's 65 536.
pub const WW_CONSUMER_REGS: u32 = 232;

/// The tile `(tile_m, tile_n)` block `b` computes, in grouped order: blocks walk down `group` tile
/// rows, then to the next tile column, so the blocks resident at one time read a few panels of A
/// and B that stay in L2 instead of sweeping all of B (the last group may have fewer rows).
/// A bijection from `0..tiles_m * tiles_n` onto the tiles.
pub const fn grouped_tile(b: u32, tiles_m: u32, tiles_n: u32, group: u32) -> (u32, u32) {
    let per_group = group * tiles_n;
    let first_m = (b / per_group) * group;
    let rows = if tiles_m - first_m < group { tiles_m - first_m } else { group };
    let r = b % per_group;
    (first_m + r % rows, r / rows)
}

/// `C = A B^T` like [`gemm_wgmma_bf16`], with a 128 x 256 block tile and the tensor cores kept busy:
///
/// - Tile: 128 x 256 (each consumer warpgroup 64 x 256 with `wgmma m64n256k16`, 128 f32
///   accumulators per thread), k step 64, [`WG_STAGES`] stages of 48 KiB (TMA boxes 64 x 128 for A
///   and 64 x 256 for B, 128-byte swizzle).
/// - Registers: launch bound 384 threads; the producer warpgroup drops to [`WW_PRODUCER_REGS`] and
///   the consumers rise to [`WW_CONSUMER_REGS`] (`setmaxnreg`).
/// - Overlap: a consumer issues k tile t's four wgmma, commits, then waits only for tile t - 1's
///   group (`wait_group 1`) and releases t - 1's stage, so one group is always in flight.
/// - Order: 1-D grid of `ceil(m / 128) * ceil(n / 256)` blocks mapped by [`grouped_tile`].
/// - Epilogue: straight from the accumulators, two adjacent columns per 8-byte store where `n` is
///   even, masked at the edges. The reduction over k of every output is the same fixed sequence of
///   wgmma k16 steps whatever m is (batch-invariant).
///
/// Parameters as [`gemm_wgmma_bf16`] (`b_map`'s box is 64 x 256); block 384; dynamic shared memory
/// [`WW_SMEM_BYTES`].
#[kernel(arch = "sm_90a", max_threads = 384)]
pub unsafe fn gemm_wgmma_bf16_wide(
    a_map: DevicePtr<TensorMap>,
    b_map: DevicePtr<TensorMap>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    let tid = thread::thread_idx_x();
    let wg = tid / 128;
    let (tiles_m, tiles_n) = (s.m.div_ceil(WG_BM), s.n.div_ceil(WW_BN));
    let (tm, tn) = grouped_tile(thread::block_idx_x(), tiles_m, tiles_n, WW_GROUP_M);
    let (m0, n0) = (tm * WG_BM, tn * WW_BN);
    let ring = Ring { base: shared::dynamic_smem_addr(), stage_bytes: WW_STAGE_BYTES };
    let k_tiles = s.k.div_ceil(WG_BK);
    ring.init();
    if wg == 0 {
        unsafe { wgmma::setmaxnreg_dec::<WW_PRODUCER_REGS>() };
        if tid == 0 {
            unsafe { ring.produce(a_map, b_map, k_tiles, m0, n0) };
        }
        return;
    }
    unsafe { wgmma::setmaxnreg_inc::<WW_CONSUMER_REGS>() };

    // Consumers: warpgroup 1 takes rows 0..64 of the tile, warpgroup 2 rows 64..128.
    let cons = wg - 1;
    let ct = tid - 128 * wg;
    let mut acc = [0.0f32; 128];
    let mut t = 0;
    while t < k_tiles {
        let st = t % WG_STAGES;
        ring.wait_full(t);
        let a_tile = ring.stage(st) + cons * 64 * 128;
        let b_tile = ring.stage(st) + WG_TILE_BYTES;
        wgmma::fence();
        let mut kk = 0;
        while kk < WG_BK / 16 {
            unsafe {
                wgmma::mma_m64n256k16_bf16(
                    &mut acc,
                    tile_descriptor(a_tile, kk),
                    tile_descriptor(b_tile, kk),
                    t > 0 || kk > 0,
                )
            };
            kk += 1;
        }
        wgmma::commit_group();
        // Tile t - 1's products are done: its stage can be refilled while tile t's run.
        wgmma::wait_group::<1>();
        if t > 0 && ct == 0 {
            unsafe { mbarrier::arrive(ring.empty((t - 1) % WG_STAGES)) };
        }
        t += 1;
    }
    wgmma::wait_group::<0>();

    // Element pairs (i, i + 1) of the accumulator, listed with constant indices so the array stays
    // in registers (a loop too long to unroll would index it dynamically and put it in local memory).
    let pairs = s.n % 2 == 0;
    let store = |i: u32, v0: f32, v1: f32| {
        let (r, col) = wgmma::acc_m64(ct, i);
        let (row, col) = (m0 + cons * 64 + r, n0 + col);
        if row < s.m {
            let at = (row * s.n + col) as usize;
            if pairs && col + 1 < s.n {
                unsafe { c.write2(at, [v0, v1]) };
            } else {
                if col < s.n {
                    unsafe { c.write(at, v0) };
                }
                if col + 1 < s.n {
                    unsafe { c.write(at + 1, v1) };
                }
            }
        }
    };
    macro_rules! store_pairs {
        ($($i:literal),*) => { $( store($i, acc[$i], acc[$i + 1]); )* };
    }
    store_pairs!(
        0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56,
        58, 60, 62, 64, 66, 68, 70, 72, 74, 76, 78, 80, 82, 84, 86, 88, 90, 92, 94, 96, 98, 100, 102, 104, 106, 108,
        110, 112, 114, 116, 118, 120, 122, 124, 126
    );
}
