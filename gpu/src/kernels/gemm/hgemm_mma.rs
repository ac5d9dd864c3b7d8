//! Tensor-core GEMM with `mma.sync` (the ladder's second part): `C = A B^T` with A (m x k) and
//! B (n x k) in bf16 or f16, row-major, and C (m x n) in f32 — the layout of `Y = X W^T`.
//!
//! One generic body, two block tiles ([`HgemmTile`]): the first rung, [`HGEMM_NARROW`] (128 x 128,
//! k step 32, 4 stages, warp tile 64 x 32), and the tuned one, [`HGEMM_WIDE`] (128 x 256, k step 64,
//! 4 stages, warp tile 64 x 64: twice the products per fragment loaded, half the block barriers
//! per k).
//!
//! - 8 warps as 2 (m) x 4 (n). A warp's tile is `MI` x `NI` products `m16n8k16` per 16 of k, with
//!   `4 MI NI` f32 accumulators per lane. A fragments come from one `ldmatrix.x4` per 16 rows, B
//!   fragments from one `ldmatrix.x4` per 16 columns (two `n8` products).
//! - Fragments are double-buffered in registers: the loads for the next 16 of k are issued before
//!   the products of the current ones, across stage boundaries too.
//! - A `STAGES`-deep `cp.async` pipeline: while the tensor cores work on stage s, the copies for
//!   the next `STAGES - 1` stages are in flight; one wait and one block barrier per stage.
//! - Shared rows are `2 BK` bytes (64 or 128); 16-byte chunk `c` of row `r` is stored where the
//!   64- or 128-byte swizzle puts it ([`chunk_offset`]), so the 8 rows an `ldmatrix` phase reads
//!   fall in 8 different bank groups.
//! - 1-D grid in grouped order ([`grouped_tile`]: blocks walk down 8 tile rows, then across), so
//!   the blocks resident together share panels of A and B in L2.
//! - `k % 8 == 0` (16-byte rows for `cp.async`); any m and n (edge rows are zero-filled, stores
//!   masked; two adjacent columns per 8-byte store where `n` is even).

use super::gemm::GemmShape;
use super::gemm_wgmma::grouped_tile;
use crate::swizzle::Swizzle;
use crate::{DevicePtr, DevicePtrMut, kernel};
use crate::{cp_async, hint, matrix, mma, shared, sync, thread};
use half::{bf16, f16};

/// Threads per block (8 warps).
pub const HGEMM_THREADS: u32 = 256;
/// Tile rows per group of the block order.
pub const HGEMM_GROUP_M: u32 = 8;

/// A block tile of the `mma.sync` GEMM: the numbers the host needs to launch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HgemmTile {
    /// Rows of C per block.
    pub bm: u32,
    /// Columns of C per block.
    pub bn: u32,
    /// k per stage (32 or 64: 64- or 128-byte shared rows).
    pub bk: u32,
    /// Pipeline depth.
    pub stages: u32,
}

impl HgemmTile {
    /// Bytes of one stage: an A tile of `bm` rows and a B tile of `bn` rows, `2 bk` bytes each.
    pub const fn stage_bytes(self) -> u32 {
        (self.bm + self.bn) * self.bk * 2
    }
    /// Dynamic shared memory per block.
    pub const fn smem_bytes(self) -> u32 {
        self.stages * self.stage_bytes()
    }
    /// Blocks of the 1-D grid for `s`.
    pub const fn blocks(self, s: GemmShape) -> u64 {
        s.m.div_ceil(self.bm) as u64 * s.n.div_ceil(self.bn) as u64
    }
}

/// The first rung: 128 x 128, k step 32, 4 stages (64 KiB), warp tile 64 x 32.
pub const HGEMM_NARROW: HgemmTile = HgemmTile { bm: 128, bn: 128, bk: 32, stages: 4 };
/// The tuned rung: 128 x 256, k step 64, 4 stages (192 KiB), warp tile 64 x 64.
pub const HGEMM_WIDE: HgemmTile = HgemmTile { bm: 128, bn: 256, bk: 64, stages: 4 };

/// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of `row_bytes`-byte rows
/// (64 or 128; pure: host-tested).
pub const fn chunk_offset(row_bytes: u32, row: u32, chunk: u32) -> u32 {
    let sw = if row_bytes == 128 { Swizzle::B128 } else { Swizzle::B64 };
    sw.apply(row * row_bytes + chunk * 16)
}

/// [`chunk_offset`] for the first rung's 64-byte rows.
pub const fn swizzled_chunk(row: u32, chunk: u32) -> u32 {
    chunk_offset(64, row, chunk)
}

/// Where one thread's share of every stage comes from and goes, computed once per block: the
/// thread copies 16-byte chunk `t % (BK / 8)` of rows `t / (BK / 8) + i * ROWS_PER_PASS` of the A
/// and B tiles. The rows it visits differ by multiples of 8, so their swizzle is the same and the
/// shared offset of pass `i` is `dst + i * ROWS_PER_PASS * 2 BK`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyPlan {
    /// First global row of A this thread copies.
    pub a_row: u32,
    /// First global row of B this thread copies.
    pub b_row: u32,
    /// Column (element) of its chunk within the stage's k range.
    pub col: u32,
    /// Byte offset of its first chunk in a tile.
    pub dst: u32,
}

/// Rows of a tile one pass of the 256 threads copies, for a k step of `bk`.
pub const fn rows_per_pass(bk: u32) -> u32 {
    HGEMM_THREADS / (bk / 8)
}

impl CopyPlan {
    /// Thread `t`'s plan in the block whose tile starts at row `m0` of A and `n0` of B.
    #[inline(always)]
    pub fn new<const BK: u32>(t: u32, m0: u32, n0: u32) -> Self {
        let per_row = BK / 8;
        let (row, chunk) = (t / per_row, t % per_row);
        CopyPlan { a_row: m0 + row, b_row: n0 + row, col: chunk * 8, dst: chunk_offset(BK * 2, row, chunk) }
    }

    /// The plan through [`hint::launder`]: its per-pass values are then computed in the loop,
    /// where they are used, instead of being hoisted into dozens of live registers.
    #[inline(always)]
    pub fn laundered(self) -> Self {
        CopyPlan {
            a_row: hint::launder(self.a_row),
            b_row: hint::launder(self.b_row),
            col: self.col,
            dst: hint::launder(self.dst),
        }
    }
}

/// Issues this thread's copies of passes `first..first + count` of one stage (k from `k0`) into
/// the stage at `base`: passes `0..BM / ROWS_PER_PASS` are A's, the rest B's. Rows or k past the
/// edge are zero-filled (their source row is clamped into the matrix and not read).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn copy_passes<const BM: u32, const BK: u32>(
    a: *const u16,
    b: *const u16,
    s: GemmShape,
    plan: CopyPlan,
    k0: u32,
    base: shared::SharedAddr,
    first: u32,
    count: u32,
) {
    let rows_per_pass = rows_per_pass(BK);
    let a_passes = BM / rows_per_pass;
    let kc = k0 + plan.col;
    let k_ok = kc < s.k;
    let mut i = first;
    while i < first + count {
        let (src, rows, row, dst) = if i < a_passes {
            (a, s.m, plan.a_row + i * rows_per_pass, base + plan.dst + i * rows_per_pass * BK * 2)
        } else {
            let j = i - a_passes;
            (b, s.n, plan.b_row + j * rows_per_pass, base + BM * BK * 2 + plan.dst + j * rows_per_pass * BK * 2)
        };
        let ok = row < rows && k_ok;
        let r = if row < rows { row } else { rows - 1 };
        let kk = if k_ok { kc } else { 0 };
        let p = unsafe { src.add(r as usize * s.k as usize + kk as usize) };
        unsafe { cp_async::copy_16_zfill(dst, p as *const u8, if ok { 16 } else { 0 }) };
        i += 1;
    }
}

/// A lane's `ldmatrix` row offsets for each 16 of k in a stage (`KS = BK / 16` of them): A's for
/// its warp's first 16 rows, B's for its first 16 columns. The other fragments sit at fixed
/// distances (16 rows = `32 BK` bytes), since 16-row steps keep the swizzle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragPlan<const KS: usize> {
    /// Byte offset (in a stage) of the lane's `ldmatrix` row for A, per 16 of k.
    pub a: [u32; KS],
    /// Byte offset (in a stage) of the lane's `ldmatrix` row for B, per 16 of k.
    pub b: [u32; KS],
}

impl<const KS: usize> FragPlan<KS> {
    /// The plan of `lane` in warp (`wm`, `wn`) of the warp grid, for a block of `BM` A rows.
    #[inline(always)]
    pub fn new<const BM: u32, const MI: usize, const NI: usize>(wm: u32, wn: u32, lane: u32) -> Self {
        let row_bytes = KS as u32 * 32;
        let mut plan = FragPlan { a: [0; KS], b: [0; KS] };
        let mut ks = 0;
        while ks < KS {
            let k2 = ks as u32 * 2;
            // A x4: lanes 0-15 give rows 0-15 at the low 8 of k, lanes 16-31 the same rows at the high 8
            plan.a[ks] = chunk_offset(row_bytes, wm * 16 * MI as u32 + lane % 16, k2 + lane / 16);
            // B x4 over 16 columns: matrices (n 0-7, k lo), (n 0-7, k hi), (n 8-15, k lo), (n 8-15, k hi)
            let brow = wn * 8 * NI as u32 + lane % 8 + (lane / 16) * 8;
            plan.b[ks] = BM * row_bytes + chunk_offset(row_bytes, brow, k2 + (lane / 8) % 2);
            ks += 1;
        }
        plan
    }

    /// As [`CopyPlan::laundered`].
    #[inline(always)]
    pub fn laundered(self) -> Self {
        let mut p = self;
        let mut ks = 0;
        while ks < KS {
            p.a[ks] = hint::launder(p.a[ks]);
            p.b[ks] = hint::launder(p.b[ks]);
            ks += 1;
        }
        p
    }
}

/// Loads a warp's fragments for the 16 of k at `ks` of the stage at `base`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn load_fragments<const BK: u32, const KS: usize, const MI: usize, const NI: usize>(
    base: shared::SharedAddr,
    plan: &FragPlan<KS>,
    ks: usize,
    fa: &mut [[u32; 4]; MI],
    fb: &mut [[u32; 2]; NI],
) {
    let (a, b) = (base + plan.a[ks], base + plan.b[ks]);
    let mut mi = 0;
    while mi < MI {
        fa[mi] = unsafe { matrix::ldmatrix_x4(a + mi as u32 * 32 * BK) };
        mi += 1;
    }
    let mut ni = 0;
    while ni < NI {
        let r = unsafe { matrix::ldmatrix_x4(b + ni as u32 / 2 * 32 * BK) };
        fb[ni] = [r[0], r[1]];
        fb[ni + 1] = [r[2], r[3]];
        ni += 2;
    }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn hgemm<
    const F16: bool,
    const BM: u32,
    const BN: u32,
    const BK: u32,
    const KS: usize,
    const STAGES: u32,
    const PENDING: u32,
    const MI: usize,
    const NI: usize,
>(
    a: *const u16,
    b: *const u16,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    const {
        assert!((BM / (16 * MI as u32)) * (BN / (8 * NI as u32)) == HGEMM_THREADS / 32);
        assert!(NI % 2 == 0 && (BK == 32 || BK == 64) && KS as u32 == BK / 16);
        assert!(STAGES >= 2 && PENDING == STAGES - 2);
        // whole passes of rows for A and B, spread evenly over the KS steps of a stage
        assert!(BM % (rows_per_pass(BK)) == 0 && BN % (rows_per_pass(BK)) == 0);
        assert!(((BM + BN) / (rows_per_pass(BK))) % KS as u32 == 0);
    }
    let passes_per_step = (BM + BN) / (rows_per_pass(BK)) / KS as u32;
    let stage_bytes = (BM + BN) * BK * 2;
    let (t, lane, w) = (thread::thread_idx_x(), thread::lane_id(), thread::warp_id());
    let warps_n = BN / (8 * NI as u32);
    let (tm, tn) = grouped_tile(thread::block_idx_x(), s.m.div_ceil(BM), s.n.div_ceil(BN), HGEMM_GROUP_M);
    let (m0, n0) = (tm * BM, tn * BN);
    let k_tiles = s.k.div_ceil(BK);
    let smem = shared::dynamic_smem_addr();
    let copies = CopyPlan::new::<BK>(t, m0, n0);
    let frags = FragPlan::<KS>::new::<BM, MI, NI>(w / warps_n, w % warps_n, lane);
    let mut acc = [[[0.0f32; 4]; NI]; MI];

    let mut st = 0;
    while st < STAGES - 1 {
        if st < k_tiles {
            let all = (BM + BN) / (rows_per_pass(BK));
            unsafe { copy_passes::<BM, BK>(a, b, s, copies, st * BK, smem + st * stage_bytes, 0, all) };
        }
        cp_async::commit_group();
        st += 1;
    }
    cp_async::wait_group::<PENDING>();
    sync::sync_threads();

    let mut fa = [[[0u32; 4]; MI]; 2];
    let mut fb = [[[0u32; 2]; NI]; 2];
    unsafe { load_fragments::<BK, KS, MI, NI>(smem, &frags, 0, &mut fa[0], &mut fb[0]) };

    let mut kt = 0;
    while kt < k_tiles {
        let base = smem + (kt % STAGES) * stage_bytes;
        // the slot every warp finished reading before the previous stage's barrier
        let fill = kt + STAGES - 1;
        let fill_base = smem + (fill % STAGES) * stage_bytes;
        let (cp, fp) = (copies.laundered(), frags.laundered());
        let mut ks = 0;
        while ks < KS {
            let cur = ks % 2;
            // a share of the refill copies at every step, so they interleave with the products
            if fill < k_tiles {
                let first = ks as u32 * passes_per_step;
                unsafe { copy_passes::<BM, BK>(a, b, s, cp, fill * BK, fill_base, first, passes_per_step) };
            }
            if ks == KS - 1 {
                // the next stage must have landed (and every warp be done with this one's last
                // fragments, loaded before this barrier) before its first fragments
                cp_async::commit_group();
                cp_async::wait_group::<PENDING>();
                sync::sync_threads();
                if kt + 1 < k_tiles {
                    let next = smem + ((kt + 1) % STAGES) * stage_bytes;
                    unsafe { load_fragments::<BK, KS, MI, NI>(next, &fp, 0, &mut fa[1 - cur], &mut fb[1 - cur]) };
                }
            } else {
                unsafe { load_fragments::<BK, KS, MI, NI>(base, &fp, ks + 1, &mut fa[1 - cur], &mut fb[1 - cur]) };
            }
            warp_mma::<F16, MI, NI>(&mut acc, &fa[cur], &fb[cur]);
            ks += 1;
        }
        kt += 1;
    }
    cp_async::wait_all();

    let (wm, wn) = (w / warps_n, w % warps_n);
    unsafe { store_acc::<MI, NI>(&acc, c, s, m0 + wm * 16 * MI as u32, n0 + wn * 8 * NI as u32, lane) };
}

/// A warp's products for one 16 of k: `MI x NI` `m16n8k16` (f16 inputs when `F16`, else bf16).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn warp_mma<const F16: bool, const MI: usize, const NI: usize>(
    acc: &mut [[[f32; 4]; NI]; MI],
    fa: &[[u32; 4]; MI],
    fb: &[[u32; 2]; NI],
) {
    let mut mi = 0;
    while mi < MI {
        let mut ni = 0;
        while ni < NI {
            acc[mi][ni] = if F16 {
                mma::mma_m16n8k16_f16(fa[mi], fb[ni], acc[mi][ni])
            } else {
                mma::mma_m16n8k16_bf16(fa[mi], fb[ni], acc[mi][ni])
            };
            ni += 1;
        }
        mi += 1;
    }
}

/// Stores a warp's `MI x NI` accumulator tiles whose top-left output is (`row0`, `col0`), masked at
/// the edges, two adjacent columns per 8-byte store where `n` is even.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn store_acc<const MI: usize, const NI: usize>(
    acc: &[[[f32; 4]; NI]; MI],
    c: DevicePtrMut<f32>,
    s: GemmShape,
    row0: u32,
    col0: u32,
    lane: u32,
) {
    let paired = s.n % 2 == 0;
    let mut mi = 0;
    while mi < MI {
        let mut ni = 0;
        while ni < NI {
            let mut half = 0;
            while half < 2 {
                // registers 2 half, 2 half + 1: row g + 8 half, columns 2t, 2t + 1
                let (r, cc) = mma::m16n8_c(lane, 2 * half);
                let row = row0 + mi as u32 * 16 + r;
                let col = col0 + ni as u32 * 8 + cc;
                let v = [acc[mi][ni][2 * half as usize], acc[mi][ni][2 * half as usize + 1]];
                if row < s.m {
                    let i = (row * s.n + col) as usize;
                    if paired && col + 1 < s.n {
                        unsafe { c.write2(i, v) };
                    } else {
                        if col < s.n {
                            unsafe { c.write(i, v[0]) };
                        }
                        if col + 1 < s.n {
                            unsafe { c.write(i + 1, v[1]) };
                        }
                    }
                }
                half += 1;
            }
            ni += 1;
        }
        mi += 1;
    }
}

macro_rules! hgemm_kernels {
    ($($(#[$doc:meta])+ $name:ident: $ty:ty, $f16:literal, $tile:ident, $mi:literal, $ni:literal;)*) => {$(
        $(#[$doc])+
        #[kernel(max_threads = 256)]
        pub unsafe fn $name(a: DevicePtr<$ty>, b: DevicePtr<$ty>, c: DevicePtrMut<f32>, s: GemmShape) {
            const T: HgemmTile = $tile;
            unsafe {
                hgemm::<$f16, { T.bm }, { T.bn }, { T.bk }, { (T.bk / 16) as usize }, { T.stages }, { T.stages - 2 }, $mi, $ni>(
                    a.as_ptr() as *const u16, b.as_ptr() as *const u16, c, s,
                )
            }
        }
    )*};
}

hgemm_kernels! {
    /// `C = A B^T`, bf16 inputs, f32 accumulation and output, the first rung's tile
    /// ([`HGEMM_NARROW`]; see the module docs). Grid `HGEMM_NARROW.blocks(s)` (1-D); block 256;
    /// dynamic shared memory `HGEMM_NARROW.smem_bytes()`.
    hgemm_mma_bf16: bf16, false, HGEMM_NARROW, 4, 4;
    /// `C = A B^T`, f16 inputs; otherwise as `hgemm_mma_bf16`.
    hgemm_mma_f16: f16, true, HGEMM_NARROW, 4, 4;
    /// `C = A B^T`, bf16 inputs, with the tuned tile ([`HGEMM_WIDE`]: 128 x 256, warp tile 64 x 64,
    /// 128 accumulators per lane). Grid `HGEMM_WIDE.blocks(s)` (1-D); block 256; dynamic shared
    /// memory `HGEMM_WIDE.smem_bytes()` (192 KiB: one block per SM).
    hgemm_mma_bf16_wide: bf16, false, HGEMM_WIDE, 4, 8;
    /// `C = A B^T`, f16 inputs; otherwise as `hgemm_mma_bf16_wide`.
    hgemm_mma_f16_wide: f16, true, HGEMM_WIDE, 4, 8;
}

/// How many k tiles ahead of the one being multiplied `hgemm_mma_bf16_tma`'s producer fills: at
/// most the ring's stages - 1 (then the producer waits for the slot the warps released last).
pub const HGEMM_TMA_LOOKAHEAD: u32 = super::gemm_wgmma::WG_STAGES - 1;

/// At which 16-wide k step of a tile `hgemm_mma_bf16_tma`'s producer issues its fill. The fill
/// waits for every warp to release the slot of the tile before (their last fragment loads of it);
/// half-way through the tile they have, so warp 0 rarely waits. (Step 2 measured faster than steps
/// 0 and 1.)
pub const HGEMM_TMA_FILL_STEP: u32 = 2;

/// Threads of `hgemm_mma_bf16_tma`: the wide tile's 8 warps.
pub const HGEMM_TMA_THREADS: u32 = 256;

/// `C = A B^T`, bf16 inputs, with the wide tile's products ([`HGEMM_WIDE`]: 128 x 256, warp tile
/// 64 x 64, `mma.sync` from `ldmatrix` fragments) fed by the Hopper copy engine instead of
/// `cp.async`: the rung between this chapter and the `wgmma` kernels, changing only the loads.
///
/// - The `wgmma` kernels' ring (`gemm_wgmma::Ring`: 4 stages of 48 KiB, `full` and `empty`
///   mbarriers per stage). Thread 0 also produces: at k step [`HGEMM_TMA_FILL_STEP`] of k tile t
///   it waits until the slot of tile `t + 3` is empty (released by all 8 warps after their last
///   fragment loads of tile `t - 1`), announces 48 KiB on its `full` barrier and issues two TMA
///   loads (A box 64 x 128, B box 64 x 256, 128-byte swizzle: the layout [`chunk_offset`]
///   computes).
/// - Every warp waits on `full` (parity per lap), loads its fragments (double-buffered across
///   stages, as in the `cp.async` kernel) and, once its last fragment of a stage is loaded, arrives
///   on `empty`. No block barrier in the loop, and 255 threads do no copy work.
/// - Registers: a warp's 128 accumulators and double-buffered fragments take about 215. A quarter
///   of the SM holds 16 384 registers and warps are dealt to the quarters in turn, so a separate
///   producer warp (9 warps: 3 in one quarter) would cap every thread at 168 (a 9-warp version
///   failed to launch with 213); a producer warpgroup with `setmaxnreg`, as the `wgmma` kernels
///   have, did not help either: ptxas still compiled the consumers for 168 and spilled 5 KiB.
///   Hence one producer thread inside the 8 warps.
/// - Parameters: `a_map` (A, box 64 x 128), `b_map` (B, box 64 x 256), `c` (m x n f32), the shape
///   (`k % 8 == 0`). Grid `HGEMM_WIDE.blocks(s)` (1-D, grouped order); block
///   [`HGEMM_TMA_THREADS`]; dynamic shared memory `gemm_wgmma::WW_SMEM_BYTES`.
#[kernel(arch = "sm_90a", max_threads = 256)]
pub unsafe fn hgemm_mma_bf16_tma(
    a_map: DevicePtr<crate::tma::TensorMap>,
    b_map: DevicePtr<crate::tma::TensorMap>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    use super::gemm_wgmma::{Ring, WG_STAGES, WG_TILE_BYTES, WW_STAGE_BYTES};
    use crate::{mbarrier, tma};
    const BM: u32 = HGEMM_WIDE.bm;
    const BN: u32 = HGEMM_WIDE.bn;
    const BK: u32 = HGEMM_WIDE.bk;
    const KS: usize = (BK / 16) as usize;
    const MI: usize = 4;
    const NI: usize = 8;
    const WARPS: u32 = HGEMM_TMA_THREADS / 32;
    const { assert!(WW_STAGE_BYTES == HGEMM_WIDE.stage_bytes() && WG_STAGES == HGEMM_WIDE.stages) };
    const { assert!(WG_TILE_BYTES == BM * BK * 2) };
    const { assert!((HGEMM_TMA_FILL_STEP as usize) < KS, "the fill step is one of a tile's k steps") };
    let (lane, w, tid) = (thread::lane_id(), thread::warp_id(), thread::thread_idx_x());
    let (tm, tn) = grouped_tile(thread::block_idx_x(), s.m.div_ceil(BM), s.n.div_ceil(BN), HGEMM_GROUP_M);
    let (m0, n0) = (tm * BM, tn * BN);
    let k_tiles = s.k.div_ceil(BK);
    let ring = Ring { base: shared::dynamic_smem_addr(), stage_bytes: WW_STAGE_BYTES };
    ring.init(WARPS);
    // Thread 0 fills the slot of k tile `f` once every warp has released its previous lap.
    let fill = |f: u32| {
        if tid == 0 && f < k_tiles {
            unsafe { ring.fill(a_map, b_map, f, m0, n0) };
        }
        sync::sync_warp(crate::warp::FULL_MASK);
    };
    if tid == 0 {
        unsafe {
            tma::prefetch(a_map.as_ptr());
            tma::prefetch(b_map.as_ptr());
        }
    }
    let mut f = 0;
    while f < HGEMM_TMA_LOOKAHEAD {
        fill(f);
        f += 1;
    }
    let warps_n = BN / (8 * NI as u32);
    let (wm, wn) = (w / warps_n, w % warps_n);
    let frags = FragPlan::<KS>::new::<BM, MI, NI>(wm, wn, lane);
    let mut acc = [[[0.0f32; 4]; NI]; MI];
    let mut fa = [[[0u32; 4]; MI]; 2];
    let mut fb = [[[0u32; 2]; NI]; 2];
    ring.wait_full(0);
    unsafe { load_fragments::<BK, KS, MI, NI>(ring.stage(0), &frags, 0, &mut fa[0], &mut fb[0]) };
    let mut t = 0;
    while t < k_tiles {
        let base = ring.stage(t % WG_STAGES);
        let fp = frags.laundered();
        let mut ks = 0;
        while ks < KS {
            let cur = ks % 2;
            if ks == HGEMM_TMA_FILL_STEP as usize {
                fill(t + HGEMM_TMA_LOOKAHEAD);
            }
            if ks == KS - 1 {
                // every fragment of this stage is loaded: hand it back, then start on the next
                sync::sync_warp(crate::warp::FULL_MASK);
                if lane == 0 {
                    unsafe { mbarrier::arrive(ring.empty(t % WG_STAGES)) };
                }
                if t + 1 < k_tiles {
                    ring.wait_full(t + 1);
                    let next = ring.stage((t + 1) % WG_STAGES);
                    unsafe { load_fragments::<BK, KS, MI, NI>(next, &fp, 0, &mut fa[1 - cur], &mut fb[1 - cur]) };
                }
            } else {
                unsafe { load_fragments::<BK, KS, MI, NI>(base, &fp, ks + 1, &mut fa[1 - cur], &mut fb[1 - cur]) };
            }
            warp_mma::<false, MI, NI>(&mut acc, &fa[cur], &fb[cur]);
            ks += 1;
        }
        t += 1;
    }
    unsafe { store_acc::<MI, NI>(&acc, c, s, m0 + wm * 16 * MI as u32, n0 + wn * 8 * NI as u32, lane) };
}
