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
//! Status: all three kernels pass their GPU tests on the H200; the wide one reaches 0.82-0.95 / 0.81-0.95 of
//! cuBLAS at 4096^3 / 8192^3, the persistent one with its staged epilogue 1.00-1.03 / 0.89-0.92
//! (`benches/results/gemm.md`).

use super::gemm::GemmShape;
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
/// Consumer warpgroups per block (each releases every stage once).
pub const WG_CONSUMERS: u32 = 2;
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
/// then B tile), followed by the `full` and `empty` mbarriers of each stage. Shared by the Hopper
/// kernels and the Blackwell one (`gemm_tcgen05`), whose `empty` arrivals come from `tcgen05.commit`.
#[cfg(all(target_arch = "nvptx64", any(target_feature = "sm_90a", target_feature = "sm_100a")))]
#[derive(Clone, Copy)]
pub(crate) struct Ring {
    pub(crate) base: u32,
    pub(crate) stage_bytes: u32,
}

#[cfg(all(target_arch = "nvptx64", any(target_feature = "sm_90a", target_feature = "sm_100a")))]
impl Ring {
    pub(crate) fn stage(self, st: u32) -> u32 {
        self.base + st * self.stage_bytes
    }
    pub(crate) fn full(self, st: u32) -> u32 {
        self.base + WG_STAGES * self.stage_bytes + st * 8
    }
    pub(crate) fn empty(self, st: u32) -> u32 {
        self.base + WG_STAGES * self.stage_bytes + (WG_STAGES + st) * 8
    }

    /// Checks the 1024-byte alignment 128-byte swizzling needs (it is computed from address bits),
    /// and has thread 0 initialize the barriers (`full`: one arrival plus the bytes; `empty`:
    /// `empty_arrivals`, one per consumer warpgroup that reads the stage); then a block barrier. All
    /// threads call it.
    pub(crate) fn init(self, empty_arrivals: u32) {
        if self.base % 1024 != 0 {
            thread::trap();
        }
        if thread::thread_idx_x() == 0 {
            let mut st = 0;
            while st < WG_STAGES {
                unsafe {
                    mbarrier::init(self.full(st), 1);
                    mbarrier::init(self.empty(st), empty_arrivals);
                }
                st += 1;
            }
            fence::mbarrier_init_release_cluster();
        }
        sync::sync_threads();
    }

    /// The producer (one thread): prefetches the maps, then [`Ring::fill`]s every k tile in order.
    #[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
    pub(crate) unsafe fn produce(
        self,
        a_map: DevicePtr<TensorMap>,
        b_map: DevicePtr<TensorMap>,
        k_tiles: u32,
        m0: u32,
        n0: u32,
    ) {
        unsafe {
            tma::prefetch(a_map.as_ptr());
            tma::prefetch(b_map.as_ptr());
        }
        let mut t = 0;
        while t < k_tiles {
            unsafe { self.fill(a_map, b_map, t, m0, n0) };
            t += 1;
        }
    }

    /// One producer step (one thread): waits until k tile `t`'s stage is empty (from the second lap
    /// on), announces the stage's bytes on `full`, and issues the TMA loads of the A box (rows
    /// `m0..`) and the B box (rows `n0..`). The wait is bounded and traps on a stall.
    ///
    /// # Safety
    /// The maps describe the operands with the boxes of this ring's A and B tiles; one thread fills
    /// each tile once, in order.
    #[inline(always)]
    #[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
    pub(crate) unsafe fn fill(
        self,
        a_map: DevicePtr<TensorMap>,
        b_map: DevicePtr<TensorMap>,
        t: u32,
        m0: u32,
        n0: u32,
    ) {
        unsafe { self.fill_at(a_map, b_map, t, t * WG_BK, m0, n0) }
    }

    /// [`Ring::fill`] for a ring that runs on across tiles (persistent kernels): use `t` of the
    /// ring loads the k columns from `k0`.
    ///
    /// # Safety
    /// As [`Ring::fill`]; `t` counts every fill of this ring, in order.
    #[inline(always)]
    pub(crate) unsafe fn fill_at(
        self,
        a_map: DevicePtr<TensorMap>,
        b_map: DevicePtr<TensorMap>,
        t: u32,
        k0: u32,
        m0: u32,
        n0: u32,
    ) {
        let st = t % WG_STAGES;
        if t >= WG_STAGES
            && !unsafe { mbarrier::wait_parity_bounded(self.empty(st), empty_parity(t), mbarrier::DEFAULT_WAIT_NS) }
        {
            thread::trap();
        }
        let dst = self.stage(st);
        unsafe {
            mbarrier::arrive_expect_tx(self.full(st), self.stage_bytes);
            tma::load_2d(dst, a_map.as_ptr(), k0 as i32, m0 as i32, self.full(st));
            tma::load_2d(dst + WG_TILE_BYTES, b_map.as_ptr(), k0 as i32, n0 as i32, self.full(st));
        }
    }

    /// A consumer's wait for k tile `t`'s stage to be full (bounded; traps on a stall).
    pub(crate) fn wait_full(self, t: u32) {
        if !unsafe {
            mbarrier::wait_parity_bounded(self.full(t % WG_STAGES), full_parity(t), mbarrier::DEFAULT_WAIT_NS)
        } {
            thread::trap();
        }
    }
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
impl Ring {
    /// Consumer warpgroup `cons`'s products on the stage of k tile `t` (A: its 64 rows, B: 256 rows):
    /// waits for the stage, issues the four `m64n256k16` wgmma (the first overwrites `acc` unless
    /// `accumulate`), commits them and waits until only this group is in flight, so the previous
    /// tile's stage may be released.
    #[inline(always)]
    fn mma_m64n256(self, t: u32, cons: u32, acc: &mut [f32; 128], accumulate: bool) {
        let st = t % WG_STAGES;
        self.wait_full(t);
        let a_tile = self.stage(st) + cons * 64 * 128;
        let b_tile = self.stage(st) + WG_TILE_BYTES;
        wgmma::fence();
        let mut kk = 0;
        while kk < WG_BK / 16 {
            unsafe {
                wgmma::mma_m64n256k16_bf16(
                    acc,
                    tile_descriptor(a_tile, kk),
                    tile_descriptor(b_tile, kk),
                    accumulate || kk > 0,
                )
            };
            kk += 1;
        }
        wgmma::commit_group();
        wgmma::wait_group::<1>();
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
    ring.init(WG_CONSUMERS);
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

/// Columns of C per block of the wide kernel (`gemm_wgmma_bf16_wide`).
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
    ring.init(WG_CONSUMERS);
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
        ring.mma_m64n256(t, cons, &mut acc, t > 0);
        // Tile t - 1's products are done: its stage can be refilled while tile t's run.
        if t > 0 && ct == 0 {
            unsafe { mbarrier::arrive(ring.empty((t - 1) % WG_STAGES)) };
        }
        t += 1;
    }
    wgmma::wait_group::<0>();

    store_m64n256(&acc, ct, m0 + cons * 64, n0, c, s, Epilogue::NONE);
}

/// What the GEMM epilogue does to each output before storing it: `c = act(acc + bias[col])`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Epilogue {
    /// `n` f32 biases, one per column of C (read only when `has_bias != 0`).
    pub bias: DevicePtr<f32>,
    /// Nonzero: add `bias[col]`.
    pub has_bias: u32,
    /// [`ACT_NONE`], or the activation as a `tensor_ops::unary` code (`RELU` or `GELU`).
    pub act: u32,
}
// SAFETY: repr(C): a pointer and two u32, the same on both sides.
unsafe impl crate::KernelParam for Epilogue {}

/// [`Epilogue::act`] for no activation.
pub const ACT_NONE: u32 = u32::MAX;

impl Epilogue {
    /// Store the products unchanged.
    pub const NONE: Epilogue = Epilogue { bias: DevicePtr::from_addr(0), has_bias: 0, act: ACT_NONE };

    /// Applies the epilogue to the output in column `col`. ReLU is inline; other activations are
    /// one out-of-line call per output ([`activate`]): inlined into all 128 accumulators of a
    /// thread, the full unary table made the module's PTX five times larger.
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    #[inline(always)]
    fn apply(self, v: f32, col: u32) -> f32 {
        let v = if self.has_bias != 0 { v + unsafe { self.bias.read(col as usize) } } else { v };
        self.activate(v)
    }

    /// The activation alone (the bias already added).
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    #[inline(always)]
    pub(crate) fn activate(self, v: f32) -> f32 {
        use crate::kernels::tensor_ops::unary;
        match self.act {
            ACT_NONE => v,
            unary::RELU => v.max(0.0),
            act => activate(act, v),
        }
    }
}

/// The activation `act` (a `tensor_ops::unary` code) of `v`, out of line.
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
#[inline(never)]
fn activate(act: u32, v: f32) -> f32 {
    crate::kernels::tensor_ops::apply_unary(act, v, 0.0)
}

/// Stores a consumer warpgroup's `m64n256` accumulators (thread `ct` of the warpgroup) into the 64 x
/// 256 block of C at (`row0`, `n0`) through the epilogue: two adjacent columns per 8-byte store where
/// `n` is even, masked at the edges.
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
#[inline(always)]
fn store_m64n256(acc: &[f32; 128], ct: u32, row0: u32, n0: u32, c: DevicePtrMut<f32>, s: GemmShape, epi: Epilogue) {
    /// Accumulator elements `i` and `i + 1` (adjacent columns of one row).
    #[inline(always)]
    fn store(i: u32, v: [f32; 2], ct: u32, row0: u32, n0: u32, c: DevicePtrMut<f32>, s: GemmShape, epi: Epilogue) {
        let (r, col) = wgmma::acc_m64(ct, i);
        let (row, col) = (row0 + r, n0 + col);
        if row < s.m {
            let at = (row * s.n + col) as usize;
            // pairs need an even n and an 8-byte-aligned C (a batch's C may start at any element)
            if s.n % 2 == 0 && c.addr() % 8 == 0 && col + 1 < s.n {
                unsafe { c.write2(at, [epi.apply(v[0], col), epi.apply(v[1], col + 1)]) };
            } else {
                if col < s.n {
                    unsafe { c.write(at, epi.apply(v[0], col)) };
                }
                if col + 1 < s.n {
                    unsafe { c.write(at + 1, epi.apply(v[1], col + 1)) };
                }
            }
        }
    }
    // Element pairs (i, i + 1) of the accumulator, listed with constant indices so the array stays
    // in registers (a loop too long to unroll would index it dynamically and put it in local memory).
    macro_rules! store_pairs {
        ($($i:literal),*) => { $( store($i, [acc[$i], acc[$i + 1]], ct, row0, n0, c, s, epi); )* };
    }
    store_pairs!(
        0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56,
        58, 60, 62, 64, 66, 68, 70, 72, 74, 76, 78, 80, 82, 84, 86, 88, 90, 92, 94, 96, 98, 100, 102, 104, 106, 108,
        110, 112, 114, 116, 118, 120, 122, 124, 126
    );
}

/// One consumer warpgroup's staged epilogue for one tile: thread `ct` of warpgroup `cons`, whose 64
/// x 256 block of C starts at (`row0`, `n0`); `staging` is the warpgroup's first staging box.
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
#[derive(Clone, Copy)]
struct StagedStore {
    ct: u32,
    cons: u32,
    row0: u32,
    n0: u32,
    c_map: DevicePtr<TensorMap>,
    s: GemmShape,
    epi: Epilogue,
    staging: u32,
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
impl StagedStore {
    /// Stores the warpgroup's `m64n256` accumulators into C through shared memory and TMA: for each
    /// of the 8 subtiles of [`WP_EPI_COLS`] columns, every thread writes its 16 outputs (after the
    /// epilogue) to a 128-byte-swizzled staging box (conflict-free: the 8 rows a warp writes at once
    /// fall on 8 different 16-byte chunks), fences them to the async proxy, and after a warpgroup
    /// barrier one thread issues the box's TMA store, which clips rows and columns outside C. The
    /// boxes alternate (subtile `j` uses box `j % 2`; 8 subtiles per tile keep the alternation across
    /// tiles), and thread 0 waits until earlier stores have read their boxes before the barrier, so a
    /// box is never overwritten while a store reads it; stores still writing C overlap the next
    /// tile's products. The next subtile's biases are loaded before this one's barrier, so their
    /// latency hides behind its stores instead of stalling every subtile.
    #[inline(always)]
    fn store(self, acc: &[f32; 128]) {
        let mut bias = self.biases(0);
        macro_rules! subtiles {
            ($($j:literal),*) => {$({
                const B: usize = 16 * $j;
                let v = [
                    acc[B], acc[B + 1], acc[B + 2], acc[B + 3], acc[B + 4], acc[B + 5], acc[B + 6], acc[B + 7],
                    acc[B + 8], acc[B + 9], acc[B + 10], acc[B + 11], acc[B + 12], acc[B + 13], acc[B + 14], acc[B + 15],
                ];
                let next = if $j + 1 < 8 { self.biases($j + 1) } else { [[0.0; 2]; 4] };
                self.subtile($j, v, bias);
                bias = next;
            })*};
        }
        subtiles!(0, 1, 2, 3, 4, 5, 6, 7);
        let _ = bias;
    }

    /// The biases of this thread's 4 column pairs in subtile `j` (zeros without a bias, or past n;
    /// n % 4 == 0 here, so an even in-bounds column has its right neighbour in bounds).
    #[inline(always)]
    fn biases(self, j: u32) -> [[f32; 2]; 4] {
        let mut out = [[0.0; 2]; 4];
        if self.epi.has_bias != 0 {
            let mut g = 0;
            while g < 4 {
                let col = self.n0 + wgmma::acc_m64(self.ct, 16 * j + 4 * g).1;
                if col < self.s.n {
                    out[g as usize] = unsafe { self.epi.bias.read2(col as usize) };
                }
                g += 1;
            }
        }
        out
    }

    /// Subtile `j`: accumulator elements `16 j .. 16 j + 16` as `v`, `bias` from [`Self::biases`].
    #[inline(always)]
    fn subtile(self, j: u32, v: [f32; 16], bias: [[f32; 2]; 4]) {
        use crate::swizzle::tile_offset;
        let (epi, ct) = (self.epi, self.ct);
        let buf = self.staging + (j % WP_EPI_BUFFERS) * WP_EPI_BOX_BYTES;
        let mut g = 0;
        while g < 4 {
            // elements 16 j + 4 g + (0, 1): row r, columns (col, col + 1); + (2, 3): row r + 8
            let (r, col) = wgmma::acc_m64(ct, 16 * j + 4 * g);
            let col = col - WP_EPI_COLS * j;
            let b = bias[g as usize];
            let mut h = 0;
            while h < 2 {
                let e = (4 * g + 2 * h) as usize;
                let (x, y) = if epi.has_bias != 0 { (v[e] + b[0], v[e + 1] + b[1]) } else { (v[e], v[e + 1]) };
                let out = [epi.activate(x), epi.activate(y)];
                let at = buf + tile_offset(WG_SWIZZLE, r + 8 * h, col, WP_EPI_COLS * 4, 4);
                unsafe { shared::st_shared_v2(at, [out[0].to_bits(), out[1].to_bits()]) };
                h += 1;
            }
            g += 1;
        }
        fence::proxy_async_shared_cta();
        if ct == 0 {
            // every earlier store has read its box, so the next subtile may refill the other one
            tma::wait_group_read::<0>();
        }
        unsafe { sync::named_barrier_sync(WP_EPI_BARRIER + self.cons, 128) };
        if ct == 0 {
            let col = self.n0 + WP_EPI_COLS * j;
            if self.row0 < self.s.m && col < self.s.n {
                unsafe { tma::store_2d(self.c_map.as_ptr(), col as i32, self.row0 as i32, buf) };
            }
            tma::commit_group();
        }
    }
}

/// CTAs per cluster of the persistent kernel (`gemm_wgmma_bf16_persistent`).
pub const WP_CLUSTER: u32 = 2;
/// Rows of C per cluster tile: the cluster's CTAs stack their 128-row tiles over one 256-column panel.
pub const WP_BM: u32 = WP_CLUSTER * WG_BM;
/// Rows of B each CTA loads per stage and multicasts to the cluster (its share of the 256).
pub const WP_B_SHARE: u32 = WW_BN / WP_CLUSTER;
/// Cluster-tile rows per group of the persistent kernel's tile order ([`grouped_tile`]).
pub const WP_GROUP_M: u32 = 4;
/// Arrivals that free a stage of the persistent kernel: every consumer warpgroup of the cluster,
/// since a stage holds B rows that the peer CTA's producer multicast into it.
pub const WP_EMPTY_ARRIVALS: u32 = WG_CONSUMERS * WP_CLUSTER;

/// Bytes of one B share in a stage.
pub const WP_B_SHARE_BYTES: u32 = WP_B_SHARE * WG_BK * 2;

/// Columns of C in one subtile of the persistent kernel's staged epilogue: 32 f32 = 128 bytes, the
/// 128-byte swizzle span of the staging box.
pub const WP_EPI_COLS: u32 = 32;
/// Bytes of one staging box: a consumer warpgroup's 64 rows x [`WP_EPI_COLS`] f32.
pub const WP_EPI_BOX_BYTES: u32 = 64 * WP_EPI_COLS * 4;
/// Staging boxes per consumer warpgroup (one is filled while the TMA store of the other reads it).
pub const WP_EPI_BUFFERS: u32 = 2;
/// Offset of the staging boxes in dynamic shared memory: after the wide kernel's stages and
/// barriers, at the next 1024-byte boundary (128-byte swizzling needs it).
pub const WP_EPI_OFFSET: u32 = (WW_SMEM_BYTES + 1023) / 1024 * 1024;
/// Dynamic shared memory of the persistent kernel: the wide kernel's ring and barriers, then
/// [`WP_EPI_BUFFERS`] staging boxes per consumer warpgroup (224.5 KiB of the 227 KiB a block may have).
pub const WP_SMEM_BYTES: u32 = WP_EPI_OFFSET + WG_CONSUMERS * WP_EPI_BUFFERS * WP_EPI_BOX_BYTES;
/// The named barrier of consumer warpgroup `c`'s epilogue is `WP_EPI_BARRIER + c` (0 is
/// `bar.sync 0`, the block barrier).
pub const WP_EPI_BARRIER: u32 = 1;

/// Whether C can take the staged epilogue's TMA stores: its row pitch (`n` f32) must be a multiple
/// of 16 bytes, and its address 16-byte aligned. Otherwise the kernel stores from registers.
pub const fn tma_store_fits(n: u32, c_addr: u64) -> bool {
    n % 4 == 0 && c_addr % 16 == 0
}

/// The bytes a stage of the persistent kernel receives in the CTA whose tile starts at (`m0`, `n0`):
/// its A box unless the tile lies wholly below the matrix, and each B share that starts inside it.
/// Boxes wholly outside the operands are not loaded at all (their rows and columns of C are never
/// stored), so no barrier depends on how the copy engine treats a box with nothing in bounds.
/// Both CTAs of a cluster compute the same B shares, so each expects exactly what is sent to it.
pub const fn persistent_stage_bytes(m0: u32, n0: u32, s: GemmShape) -> u32 {
    let mut bytes = if m0 < s.m { WG_TILE_BYTES } else { 0 };
    let mut share = 0;
    while share < WP_CLUSTER {
        if n0 + share * WP_B_SHARE < s.n {
            bytes += WP_B_SHARE_BYTES;
        }
        share += 1;
    }
    bytes
}

/// The work unit a cluster takes on its `i`-th turn, and whether there is one: the batch `b`, the
/// cluster tile `(tile_m, tile_n)` (in units of [`WP_BM`] x [`WW_BN`]) and the k split `split`
/// (0..`splits`). Cluster `cluster` of `clusters` walks units `cluster, cluster + clusters, ...`;
/// unit `u` is batch `u / (tiles * splits)`, then split `u % splits` of tile `(u / splits) % tiles`
/// in the grouped order over `tiles_m x tiles_n`.
pub const fn persistent_tile(
    cluster: u32,
    clusters: u32,
    i: u32,
    tiles_m: u32,
    tiles_n: u32,
    splits: u32,
    batches: u32,
) -> Option<(u32, u32, u32, u32)> {
    let u = cluster as u64 + i as u64 * clusters as u64;
    let tiles = tiles_m as u64 * tiles_n as u64;
    if u >= tiles * splits as u64 * batches as u64 {
        return None;
    }
    let per_batch = tiles * splits as u64;
    let (b, r) = (u / per_batch, u % per_batch);
    let (tile, split) = ((r / splits as u64) as u32, (r % splits as u64) as u32);
    let (tm, tn) = grouped_tile(tile, tiles_m, tiles_n, WP_GROUP_M);
    Some((b as u32, tm, tn, split))
}

/// Strided batches of the persistent kernel: `count` products, the `b`-th reading A from row
/// `b * a_rows` and B from row `b * b_rows` of their (stacked) tensor maps and writing C at
/// element `b * c_stride`. `b_rows = 0` shares one B across the batch. A tile's rows past m (or
/// columns past n) may read the next batch's rows; they only reach outputs that are not stored.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Products in the batch (at least 1).
    pub count: u32,
    /// Rows of A's map between batches (`a_stride / k`).
    pub a_rows: u32,
    /// Rows of B's map between batches (0: one B for all).
    pub b_rows: u32,
    /// Padding; keeps `c_stride` 8-byte aligned on both sides.
    pub pad: u32,
    /// Elements of C between batches.
    pub c_stride: u64,
}
// SAFETY: repr(C): four u32 and a u64, the same on both sides.
unsafe impl crate::KernelParam for Batch {}

impl Batch {
    /// One product.
    pub const ONE: Batch = Batch { count: 1, a_rows: 0, b_rows: 0, pad: 0, c_stride: 0 };
}

/// The k tiles of split `split` when `k_tiles` are cut into `splits` parts: `(first, count)`, the
/// first `splits - 1` parts of `ceil(k_tiles / splits)` tiles and the last one the rest. Every part
/// is non-empty when `(splits - 1) * ceil(k_tiles / splits) < k_tiles` ([`split_k_fits`]).
pub const fn split_k_range(k_tiles: u32, splits: u32, split: u32) -> (u32, u32) {
    let per = k_tiles.div_ceil(splits);
    let first = split * per;
    if first >= k_tiles {
        return (k_tiles, 0);
    }
    let end = if first + per < k_tiles { first + per } else { k_tiles };
    (first, end - first)
}

/// Whether `splits` parts of `k_tiles` are all non-empty.
pub const fn split_k_fits(k_tiles: u32, splits: u32) -> bool {
    splits >= 1 && (splits - 1) * k_tiles.div_ceil(splits) < k_tiles
}

/// The most k parts [`choose_split_k`] suggests.
pub const MAX_SPLIT_K: u32 = 64;

/// The k split suggested for `tiles` cluster tiles of `k_tiles` k tiles each on `clusters`
/// resident clusters: 1 unless the tiles leave at least half the clusters idle; then the `splits`
/// in 1..=[`MAX_SPLIT_K`] (all parts non-empty) that minimizes the estimated time `waves * (k tiles per part + 8
/// if split)`, where `waves = ceil(tiles * splits / clusters)` and the 8 stands for writing a
/// partial tile and reading it back in the reduction (a 128 x 256 f32 partial is 128 KiB, about
/// the A and B bytes of 4 k tiles, moved twice). The half: at 3072 x 768 x 16384 (36 tiles on 66
/// clusters) a 5-way split measured slower than none on the H200 (0.172 against 0.162 ms): with
/// 36 clusters busy the product already moves about 3.6 TB/s from L2, so more clusters add traffic,
/// not speed.
pub const fn choose_split_k(tiles: u32, k_tiles: u32, clusters: u32) -> u32 {
    if tiles as u64 * 2 > clusters as u64 {
        return 1;
    }
    let mut best = (1u32, u64::MAX);
    let mut s = 1;
    while s <= MAX_SPLIT_K {
        if split_k_fits(k_tiles, s) {
            let waves = ((tiles as u64) * s as u64).div_ceil(if clusters > 0 { clusters as u64 } else { 1 });
            let cost = waves * (k_tiles.div_ceil(s) as u64 + if s > 1 { 8 } else { 0 });
            if cost < best.1 {
                best = (s, cost);
            }
        }
        s += 1;
    }
    best.0
}

/// `c = act(sum over s of ws[s * len + i] + bias[i % n])` for `i < len`, the sum in the order
/// `s = 0, 1, ..`: the fixed-order reduction of the persistent kernel's k splits (so a split
/// product is as reproducible as an unsplit one, though its bits differ from it). Grid-stride over
/// `len`; any grid; block 256.
#[kernel(arch = "sm_90a")]
pub unsafe fn gemm_split_k_reduce(
    ws: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    len: u32,
    n: u32,
    splits: u32,
    epi: Epilogue,
) {
    let stride = thread::grid_dim_x() * thread::block_dim_x();
    let mut i = thread::block_idx_x() * thread::block_dim_x() + thread::thread_idx_x();
    while i < len {
        let mut v = unsafe { ws.read(i as usize) };
        let mut sp = 1;
        while sp < splits {
            v += unsafe { ws.read(sp as usize * len as usize + i as usize) };
            sp += 1;
        }
        unsafe { c.write(i as usize, epi.apply(v, i % n)) };
        i += stride;
    }
}

/// `C = act(A B^T + bias)`: the wide kernel's 128 x 256 CTA tile made persistent, in clusters of two
/// that share B, with the bias and activation fused into the epilogue.
///
/// - Grid: [`WP_CLUSTER`]-CTA clusters (`#[kernel(cluster = 2)]`), as many as fit at once
///   (`cuOccupancyMaxActiveClusters`); cluster `c` computes cluster tiles `c, c + clusters, ...` of
///   the grouped order ([`persistent_tile`]). A cluster tile is 256 x 256: CTA rank `r` computes
///   rows `128 r..128 r + 128` of it, both over the same 256 columns.
/// - Loads: per k tile, each CTA's producer thread loads its own A box (128 x 64) and *half* of
///   the shared B panel (rows `128 r..`, 128 x 64), multicast into the same stage offset of both
///   CTAs (`.multicast::cluster`, mask 0b11). Each CTA's `full` barrier expects the whole stage
///   (48 KiB: its A, both B halves), so L2 serves 32 KiB per CTA per k tile instead of 48.
/// - Release: a stage holds data the peer's producer wrote, so `empty` counts
///   [`WP_EMPTY_ARRIVALS`] (both consumer warpgroups of both CTAs); each consumer warpgroup arrives
///   on its own CTA's barrier and, through `mapa`, on the peer's.
/// - Overlap: the k-tile counter `t` runs on across a CTA's tiles (stage `t % STAGES`, parity
///   `t / STAGES`), so the producer fills the next tile's stages while the consumers run the
///   epilogue; consumers keep one wgmma group in flight as in the wide kernel.
/// - Edges: a box wholly outside A or B is not loaded and not expected
///   ([`persistent_stage_bytes`]); the stale shared memory it leaves only reaches masked outputs.
/// - Epilogue: [`Epilogue`] applied to each output (`act(acc + bias[col])`). With a C tensor map
///   (`c_map` not null: f32, box 32 x 64, 128-byte swizzle; needs [`tma_store_fits`]) the outputs go
///   through swizzled staging boxes in shared memory and TMA stores (`StagedStore`), so a
///   consumer spends the epilogue on shared-memory writes and the global writes overlap the next
///   tile; without one, each thread stores its outputs from registers, masked.
/// - Lifetime: a cluster barrier after the barriers' initialization (no multicast or remote arrival
///   before the peer's barriers exist) and one before exit (no CTA leaves while its peer may still
///   write to it). Every mbarrier wait is bounded and traps on a stall.
///
/// - Split k: with `splits > 1` a work unit is one k part of a tile ([`persistent_tile`],
///   [`split_k_range`]); its products go unchanged (no epilogue), from registers, to the partial
///   `c + split * m * n`, and [`gemm_split_k_reduce`] sums the parts in order and applies the
///   epilogue. For long-k products with fewer tiles than clusters ([`choose_split_k`]).
///
/// - Batches: with `batch.count > 1` the units run over the batch ([`Batch`]); each product's C is
///   stored from registers (a staging box's TMA store could cross into the next product's rows).
///
/// Parameters: `a_map` (A, box 64 x 128), `b_map` (B, box 64 x 128), `c` (m x n f32, or with
/// `splits > 1` the `splits * m * n` partials), the shape, the epilogue, `multicast` (nonzero:
/// share B across the cluster as above; zero: each CTA loads both B shares itself and only its own
/// consumers release its stages), `c_map` (C's tensor map for the staged epilogue, or null for
/// stores from registers; ignored when split or batched), `splits` (at least 1, every part
/// non-empty: [`split_k_fits`]; 1 when batched), `batch` ([`Batch::ONE`] for one product). Block
/// 384; dynamic shared memory [`WP_SMEM_BYTES`]; grid x a multiple of 2.
#[kernel(arch = "sm_90a", max_threads = 384, cluster = 2)]
pub unsafe fn gemm_wgmma_bf16_persistent(
    a_map: DevicePtr<TensorMap>,
    b_map: DevicePtr<TensorMap>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
    epi: Epilogue,
    multicast: u32,
    c_map: DevicePtr<TensorMap>,
    splits: u32,
    batch: Batch,
) {
    use crate::cluster;
    let multicast = multicast != 0;
    let tid = thread::thread_idx_x();
    let wg = tid / 128;
    let rank = cluster::cta_rank();
    let (cid, clusters) = (cluster::cluster_idx_x(), cluster::cluster_count_x());
    let (tiles_m, tiles_n) = (s.m.div_ceil(WP_BM), s.n.div_ceil(WW_BN));
    let k_tiles = s.k.div_ceil(WG_BK);
    let ring = Ring { base: shared::dynamic_smem_addr(), stage_bytes: WW_STAGE_BYTES };
    ring.init(if multicast { WP_EMPTY_ARRIVALS } else { WG_CONSUMERS });
    // The peer's barriers exist before anything multicasts into it or arrives on them.
    cluster::sync();

    if wg == 0 {
        unsafe { wgmma::setmaxnreg_dec::<WW_PRODUCER_REGS>() };
        if tid == 0 {
            unsafe {
                tma::prefetch(a_map.as_ptr());
                tma::prefetch(b_map.as_ptr());
            }
            let mut t = 0;
            let mut i = 0;
            while let Some((bi, tm, tn, sp)) = persistent_tile(cid, clusters, i, tiles_m, tiles_n, splits, batch.count)
            {
                let (m0, n0) = (tm * WP_BM + rank * WG_BM, tn * WW_BN);
                let (a_row, b_row) = (bi * batch.a_rows + m0, bi * batch.b_rows + n0);
                let (first, count) = split_k_range(k_tiles, splits, sp);
                let mut kt = first;
                while kt < first + count {
                    let st = t % WG_STAGES;
                    if t >= WG_STAGES
                        && !unsafe {
                            mbarrier::wait_parity_bounded(ring.empty(st), empty_parity(t), mbarrier::DEFAULT_WAIT_NS)
                        }
                    {
                        thread::trap();
                    }
                    let dst = ring.stage(st);
                    unsafe {
                        mbarrier::arrive_expect_tx(ring.full(st), persistent_stage_bytes(m0, n0, s));
                        if m0 < s.m {
                            tma::load_2d(dst, a_map.as_ptr(), (kt * WG_BK) as i32, a_row as i32, ring.full(st));
                        }
                        let mut share = 0;
                        while share < WP_CLUSTER {
                            let (row, dst) = (n0 + share * WP_B_SHARE, dst + WG_TILE_BYTES + share * WP_B_SHARE_BYTES);
                            let (k0, map_row) = ((kt * WG_BK) as i32, (b_row + share * WP_B_SHARE) as i32);
                            if row < s.n {
                                if !multicast {
                                    tma::load_2d(dst, b_map.as_ptr(), k0, map_row, ring.full(st));
                                } else if share == rank {
                                    tma::load_2d_multicast(dst, b_map.as_ptr(), k0, map_row, ring.full(st), 0b11);
                                }
                            }
                            share += 1;
                        }
                    }
                    t += 1;
                    kt += 1;
                }
                i += 1;
            }
        }
    } else {
        unsafe { wgmma::setmaxnreg_inc::<WW_CONSUMER_REGS>() };
        let cons = wg - 1;
        let ct = tid - 128 * wg;
        // Hands stage `t % STAGES` back to both producers (each wrote part of it).
        let release = |t: u32| {
            if ct == 0 {
                let bar = ring.empty(t % WG_STAGES);
                if multicast {
                    let mut r = 0;
                    while r < WP_CLUSTER {
                        unsafe { mbarrier::arrive_cluster(cluster::map_shared(bar, r)) };
                        r += 1;
                    }
                } else {
                    unsafe { mbarrier::arrive(bar) };
                }
            }
        };
        let staged = c_map.addr() != 0;
        let staging = ring.base + WP_EPI_OFFSET + cons * WP_EPI_BUFFERS * WP_EPI_BOX_BYTES;
        let mut acc = [0.0f32; 128];
        let mut t = 0;
        let mut i = 0;
        while let Some((bi, tm, tn, sp)) = persistent_tile(cid, clusters, i, tiles_m, tiles_n, splits, batch.count) {
            let (m0, n0) = (tm * WP_BM + rank * WG_BM, tn * WW_BN);
            let (_, count) = split_k_range(k_tiles, splits, sp);
            let mut kt = 0;
            while kt < count {
                ring.mma_m64n256(t, cons, &mut acc, kt > 0);
                // Tile kt - 1's products are done: its stage can be refilled while kt's run.
                if kt > 0 {
                    release(t - 1);
                }
                t += 1;
                kt += 1;
            }
            // (every part has k tiles: `splits` satisfies split_k_fits)
            wgmma::wait_group::<0>();
            release(t - 1);
            if staged && splits == 1 && batch.count == 1 {
                StagedStore { ct, cons, row0: m0 + cons * 64, n0, c_map, s, epi, staging }.store(&acc);
            } else {
                // a split's part goes unchanged to its partial; the reduction applies the epilogue
                let (dst, e) = if splits > 1 {
                    (c.offset(sp as usize * s.m as usize * s.n as usize), Epilogue::NONE)
                } else {
                    (c.offset(bi as usize * batch.c_stride as usize), epi)
                };
                store_m64n256(&acc, ct, m0 + cons * 64, n0, dst, s, e);
            }
            i += 1;
        }
        if staged && splits == 1 && batch.count == 1 && ct == 0 {
            // the last stores have written C (and stopped reading shared memory) before the exit
            tma::wait_group::<0>();
        }
    }
    // No CTA leaves while its peer may still multicast into it or arrive on its barriers.
    cluster::sync();
}
