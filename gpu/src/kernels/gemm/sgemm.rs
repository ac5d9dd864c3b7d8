//! The FP32 GEMM ladder: `C = A B` with A (m x k), B (k x n) and C (m x n) row-major and dense, in
//! seven rungs from a naive kernel to warp tiling. Each rung changes one thing; the guide measures
//! what it buys. Any m, n, k work (edge tiles are zero-filled on load and masked on store); the
//! vectorized rungs also need `k % 4 == 0` and `n % 4 == 0` (16-byte rows), and the host falls back
//! to the previous rung otherwise.
//!
//! Tile parameters are const generics of one `#[inline(always)]` body per rung; each `#[kernel]` is
//! one instantiation, so the host can pick per shape class.

use super::gemm::GemmShape;
use crate::{DevicePtr, DevicePtrMut, kernel};
use crate::{hint, math, shared, sync, thread};

/// Rung 3's square tile edge.
pub const SMEM_TILE: u32 = 32;

/// `a[r][c]` of a row-major matrix with `cols` columns, or 0 outside `rows x cols`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn load_or_zero(p: DevicePtr<f32>, r: u32, c: u32, rows: u32, cols: u32) -> f32 {
    if r < rows && c < cols { unsafe { p.read((r as usize) * cols as usize + c as usize) } } else { 0.0 }
}

/// `c[row][col] = sum_p a[row][p] * b[p][col]` read straight from global memory (rungs 1 and 2),
/// when (row, col) is inside C.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn dot_one(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape, row: u32, col: u32) {
    if row < s.m && col < s.n {
        let mut acc = 0.0f32;
        let mut p = 0;
        while p < s.k {
            acc = math::fma(
                unsafe { a.read((row * s.k + p) as usize) },
                unsafe { b.read((p * s.n + col) as usize) },
                acc,
            );
            p += 1;
        }
        unsafe { c.write((row * s.n + col) as usize, acc) };
    }
}

/// Stages a BM x BK tile of A into `at` ([BM][BK]) and a BK x BN tile of B into `bt` ([BK][BN]),
/// one element per thread per step, zero past the edges.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_scalar<const BM: u32, const BN: u32, const BK: u32>(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    at: *mut f32,
    bt: *mut f32,
    s: GemmShape,
    row0: u32,
    col0: u32,
    k0: u32,
    threads: u32,
) {
    let t = thread::thread_idx_x();
    let mut i = t;
    while i < BM * BK {
        unsafe { *at.add(i as usize) = load_or_zero(a, row0 + i / BK, k0 + i % BK, s.m, s.k) };
        i += threads;
    }
    i = t;
    while i < BK * BN {
        unsafe { *bt.add(i as usize) = load_or_zero(b, k0 + i / BN, col0 + i % BN, s.k, s.n) };
        i += threads;
    }
}

/// Stages a BM x BK tile of A (rows row0.., k0..) transposed into `at` ([BK][BM]) with 16-byte
/// loads, zero past the edges (needs `k % 4 == 0`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn stage_a_vec4_transposed<const BM: u32, const BK: u32>(
    a: DevicePtr<f32>,
    at: *mut f32,
    s: GemmShape,
    row0: u32,
    k0: u32,
    threads: u32,
) {
    let mut i = thread::thread_idx_x();
    while i < BM * BK / 4 {
        let (r, c4) = (i / (BK / 4), (i % (BK / 4)) * 4);
        let (gr, gc) = (row0 + r, k0 + c4);
        let v = if gr < s.m && gc < s.k { unsafe { a.read4(((gr * s.k + gc) / 4) as usize) } } else { [0.0; 4] };
        let mut j = 0;
        while j < 4 {
            unsafe { *at.add(((c4 + j) * BM + r) as usize) = v[j as usize] };
            j += 1;
        }
        i += threads;
    }
}

/// Stages a BK x BN tile of B (rows k0.., columns col0..) into `bt` ([BK][BN]) with 16-byte loads
/// and stores, zero past the edges (needs `n % 4 == 0`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn stage_b_vec4<const BK: u32, const BN: u32>(
    b: DevicePtr<f32>,
    bt: *mut f32,
    s: GemmShape,
    k0: u32,
    col0: u32,
    threads: u32,
) {
    let mut i = thread::thread_idx_x();
    while i < BK * BN / 4 {
        let (r, c4) = (i / (BN / 4), (i % (BN / 4)) * 4);
        let (gr, gc) = (k0 + r, col0 + c4);
        let v = if gr < s.k && gc < s.n { unsafe { b.read4(((gr * s.n + gc) / 4) as usize) } } else { [0.0; 4] };
        unsafe { *(bt.add((r * BN + c4) as usize) as *mut crate::F32x4) = crate::F32x4(v) };
        i += threads;
    }
}

/// Rung 1, naive: thread (x, y) of a (32, 32) block computes `C[row][col]` with row from x. Adjacent
/// threads of a warp walk different rows of A and write different rows of C: nothing coalesces.
/// Grid (ceil(m / 32), ceil(n / 32)), block (32, 32).
#[kernel]
pub unsafe fn sgemm_naive(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape) {
    let row = thread::block_idx_x() * thread::block_dim_x() + thread::thread_idx_x();
    let col = thread::block_idx_y() * thread::block_dim_y() + thread::thread_idx_y();
    unsafe { dot_one(a, b, c, s, row, col) };
}

/// Rung 2, coalesced: the same work, but a warp's 32 threads take 32 adjacent columns of one row, so
/// B and C are read and written in 128-byte runs and A is a broadcast.
/// Grid (ceil(n / 32), ceil(m / 32)), block 1024.
#[kernel]
pub unsafe fn sgemm_coalesced(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape) {
    let t = thread::thread_idx_x();
    let row = thread::block_idx_y() * 32 + t / 32;
    let col = thread::block_idx_x() * 32 + t % 32;
    unsafe { dot_one(a, b, c, s, row, col) };
}

/// Rung 3, shared-memory blocking: the block stages 32 x 32 tiles of A and B in shared memory, so
/// each global element is read once per block instead of once per thread.
/// Grid (ceil(n / 32), ceil(m / 32)), block 1024, dynamic shared memory 8 KB.
#[kernel]
pub unsafe fn sgemm_smem(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape) {
    const T: u32 = SMEM_TILE;
    let t = thread::thread_idx_x();
    let (tr, tc) = (t / T, t % T);
    let (row0, col0) = (thread::block_idx_y() * T, thread::block_idx_x() * T);
    let at: *mut f32 = shared::dynamic_smem(0);
    let bt: *mut f32 = shared::dynamic_smem((T * T * 4) as usize);
    let mut acc = 0.0f32;
    let mut k0 = 0;
    while k0 < s.k {
        unsafe {
            *at.add((tr * T + tc) as usize) = load_or_zero(a, row0 + tr, k0 + tc, s.m, s.k);
            *bt.add((tr * T + tc) as usize) = load_or_zero(b, k0 + tr, col0 + tc, s.k, s.n);
        }
        sync::sync_threads();
        let mut p = 0;
        while p < T {
            acc = math::fma(unsafe { *at.add((tr * T + p) as usize) }, unsafe { *bt.add((p * T + tc) as usize) }, acc);
            p += 1;
        }
        sync::sync_threads();
        k0 += T;
    }
    if row0 + tr < s.m && col0 + tc < s.n {
        unsafe { c.write(((row0 + tr) * s.n + col0 + tc) as usize, acc) };
    }
}

/// Rung 4 body, 1-D block tiling: a BM x BN tile per block, BK deep; each of the BM * BN / TM
/// threads computes TM results down one column, reusing each B value TM times from a register.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn tile_1d<const BM: u32, const BN: u32, const BK: u32, const TM: u32>(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    let t = thread::thread_idx_x();
    let (row0, col0) = (thread::block_idx_y() * BM, thread::block_idx_x() * BN);
    let (tr, tc) = (t / BN, t % BN); // this thread's rows tr*TM .. tr*TM+TM, column tc
    let at: *mut f32 = shared::dynamic_smem(0);
    let bt: *mut f32 = shared::dynamic_smem((BM * BK * 4) as usize);
    let threads = BM * BN / TM;
    let mut acc = [0.0f32; 16];
    let mut k0 = 0;
    while k0 < s.k {
        unsafe { stage_scalar::<BM, BN, BK>(a, b, at, bt, s, row0, col0, k0, threads) };
        sync::sync_threads();
        let mut p = 0;
        while p < BK {
            let bv = unsafe { *bt.add((p * BN + tc) as usize) };
            let mut r = 0;
            while r < TM {
                acc[r as usize] = math::fma(unsafe { *at.add(((tr * TM + r) * BK + p) as usize) }, bv, acc[r as usize]);
                r += 1;
            }
            p += 1;
        }
        sync::sync_threads();
        k0 += BK;
    }
    let mut r = 0;
    while r < TM {
        let (row, col) = (row0 + tr * TM + r, col0 + tc);
        if row < s.m && col < s.n {
            unsafe { c.write((row * s.n + col) as usize, acc[r as usize]) };
        }
        r += 1;
    }
}

/// Rung 4: 1-D block tiling, BM = BN = 64, BK = 8, TM = 8. Grid (ceil(n / 64), ceil(m / 64)), block
/// 512, dynamic shared memory 4 KB.
#[kernel]
pub unsafe fn sgemm_tile1d_64x64x8_8(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape) {
    unsafe { tile_1d::<64, 64, 8, 8>(a, b, c, s) }
}

/// Rung 5 and 6 body, 2-D block tiling: each of the (BM / TM) * (BN / TN) threads computes a TM x TN
/// block of results from TM values of A and TN values of B held in registers per step of k
/// (TM * TN multiply-adds per TM + TN shared loads). With `VEC`, A and B are loaded as 16-byte
/// vectors and A is stored transposed (k-major) so the register loads are contiguous too, read as
/// `ld.shared.v4` ([`load_fragments_v4`]); without it, shared memory is read through generic
/// pointers.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn tile_2d<const BM: u32, const BN: u32, const BK: u32, const TM: u32, const TN: u32, const VEC: bool>(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    let t = thread::thread_idx_x();
    let threads = (BM / TM) * (BN / TN);
    let (row0, col0) = (thread::block_idx_y() * BM, thread::block_idx_x() * BN);
    let (tr, tc) = (t / (BN / TN), t % (BN / TN));
    let at: *mut f32 = shared::dynamic_smem(0); // [BM][BK], or [BK][BM] transposed with VEC
    let bt: *mut f32 = shared::dynamic_smem((BM * BK * 4) as usize); // [BK][BN]
    let mut acc = [0.0f32; 64];
    let mut rm = [0.0f32; 8];
    let mut rn = [0.0f32; 8];
    let mut k0 = 0;
    while k0 < s.k {
        if VEC {
            unsafe {
                stage_a_vec4_transposed::<BM, BK>(a, at, s, row0, k0, threads);
                stage_b_vec4::<BK, BN>(b, bt, s, k0, col0, threads);
            }
        } else {
            unsafe { stage_scalar::<BM, BN, BK>(a, b, at, bt, s, row0, col0, k0, threads) };
        }
        sync::sync_threads();
        let mut p = 0;
        while p < BK {
            if VEC {
                unsafe { load_fragments_v4::<BM, BN, BK, TM, TN>(p, tr, tc, &mut rm, &mut rn) };
            } else {
                let mut r = 0;
                while r < TM {
                    rm[r as usize] = unsafe { *at.add(((tr * TM + r) * BK + p) as usize) };
                    r += 1;
                }
                let mut q = 0;
                while q < TN {
                    rn[q as usize] = unsafe { *bt.add((p * BN + tc * TN + q) as usize) };
                    q += 1;
                }
            }
            let mut r = 0;
            while r < TM {
                let mut q = 0;
                while q < TN {
                    acc[(r * TN + q) as usize] = math::fma(rm[r as usize], rn[q as usize], acc[(r * TN + q) as usize]);
                    q += 1;
                }
                r += 1;
            }
            p += 1;
        }
        sync::sync_threads();
        k0 += BK;
    }
    let mut r = 0;
    while r < TM {
        let mut q = 0;
        while q < TN {
            let (row, col) = (row0 + tr * TM + r, col0 + tc * TN + q);
            if row < s.m && col < s.n {
                unsafe { c.write((row * s.n + col) as usize, acc[(r * TN + q) as usize]) };
            }
            q += 1;
        }
        r += 1;
    }
}

/// Rung 6's register loads for step `p` of k: the thread's TM values of A (from the transposed
/// tile, `[BK][BM]`) and TN values of B (`[BK][BN]`), each run of four as one `ld.shared.v4`.
///
/// Read through the shared state space, not a generic pointer: a generic load of shared memory
/// runs on the L1TEX path (`LD.E.128` in SASS, waited for on the long scoreboard); `ld.shared`
/// is `LDS.128`, on the short scoreboard. With generic reads, the same kernel was 11 % slower
/// (`benches/results/gemm.md`, run 209).
///
/// # Safety
/// The block's dynamic shared memory holds the two tiles (A first), staged and synchronized;
/// `TM` and `TN` are multiples of 4 (16-byte-aligned runs).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn load_fragments_v4<const BM: u32, const BN: u32, const BK: u32, const TM: u32, const TN: u32>(
    p: u32,
    tr: u32,
    tc: u32,
    rm: &mut [f32; 8],
    rn: &mut [f32; 8],
) {
    let a_tile = shared::dynamic_smem_addr();
    let b_tile = a_tile + BM * BK * 4;
    let mut r = 0;
    while r < TM {
        let v = unsafe { shared::ld_shared_v4(a_tile + (p * BM + tr * TM + r) * 4) };
        let mut j = 0;
        while j < 4 {
            rm[(r + j) as usize] = f32::from_bits(v[j as usize]);
            j += 1;
        }
        r += 4;
    }
    let mut q = 0;
    while q < TN {
        let v = unsafe { shared::ld_shared_v4(b_tile + (p * BN + tc * TN + q) * 4) };
        let mut j = 0;
        while j < 4 {
            rn[(q + j) as usize] = f32::from_bits(v[j as usize]);
            j += 1;
        }
        q += 4;
    }
}

/// Rung 5: 2-D block tiling, 128 x 128 x 8 tiles, 8 x 8 results per thread. Grid (ceil(n / 128),
/// ceil(m / 128)), block 256, dynamic shared memory 8 KB.
#[kernel]
pub unsafe fn sgemm_tile2d_128x128x8_8x8(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape) {
    unsafe { tile_2d::<128, 128, 8, 8, 8, false>(a, b, c, s) }
}

/// Rung 5, smaller tiles for small matrices: 64 x 64 x 8, 4 x 4 per thread. Block 256, 4 KB.
#[kernel]
pub unsafe fn sgemm_tile2d_64x64x8_4x4(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape) {
    unsafe { tile_2d::<64, 64, 8, 4, 4, false>(a, b, c, s) }
}

/// Rung 6: rung 5 with 16-byte loads and A transposed in shared memory (`k % 4 == 0`,
/// `n % 4 == 0`). 128 x 128 x 8, 8 x 8 per thread; block 256, 8 KB.
#[kernel]
pub unsafe fn sgemm_vec_128x128x8_8x8(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape) {
    unsafe { tile_2d::<128, 128, 8, 8, 8, true>(a, b, c, s) }
}

/// Rung 6 with a deeper k step: 128 x 128 x 16, 8 x 8 per thread; block 256, 16 KB.
#[kernel]
pub unsafe fn sgemm_vec_128x128x16_8x8(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape) {
    unsafe { tile_2d::<128, 128, 16, 8, 8, true>(a, b, c, s) }
}

/// Rung 7 body, warp tiling: the block tile (BM x BN) is split among warps (WM x WN each); a warp
/// sweeps its tile in WMITER x WNITER sub-tiles of (WM / WMITER) x (WN / WNITER), each lane computing
/// TM x TN results per sub-tile. Lanes of a warp read neighbouring shared-memory addresses, and the
/// warp's loads of A and B are reused across its sub-tiles. 16-byte loads as in rung 6.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn warptile<
    const BM: u32,
    const BN: u32,
    const BK: u32,
    const WM: u32,
    const WN: u32,
    const WNITER: u32,
    const TM: u32,
    const TN: u32,
>(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    const WARP: u32 = 32;
    let wmiter = (WM * WN) / (WARP * TM * TN * WNITER);
    let (wsub_m, wsub_n) = (WM / wmiter, WN / WNITER); // one sub-tile
    let t = thread::thread_idx_x();
    let threads = (BM / WM) * (BN / WN) * WARP;
    let (w, lane) = (t / WARP, t % WARP);
    let (wr, wc) = (w / (BN / WN), w % (BN / WN));
    let (lr, lc) = (lane / (wsub_n / TN), lane % (wsub_n / TN));
    let (row0, col0) = (thread::block_idx_y() * BM, thread::block_idx_x() * BN);
    let at: *mut f32 = shared::dynamic_smem(0); // [BK][BM] (transposed)
    let bt: *mut f32 = shared::dynamic_smem((BM * BK * 4) as usize); // [BK][BN]
    let mut acc = [0.0f32; 128];
    let mut rm = [0.0f32; 16];
    let mut rn = [0.0f32; 16];
    let mut k0 = 0;
    while k0 < s.k {
        unsafe {
            stage_a_vec4_transposed::<BM, BK>(a, at, s, row0, k0, threads);
            stage_b_vec4::<BK, BN>(b, bt, s, k0, col0, threads);
        }
        sync::sync_threads();
        let mut p = 0;
        while p < BK {
            let mut mi = 0;
            while mi < wmiter {
                let mut r = 0;
                while r < TM {
                    let m = wr * WM + mi * wsub_m + lr * TM + r;
                    rm[(mi * TM + r) as usize] = unsafe { *at.add((p * BM + m) as usize) };
                    r += 1;
                }
                mi += 1;
            }
            let mut ni = 0;
            while ni < WNITER {
                let mut q = 0;
                while q < TN {
                    let n = wc * WN + ni * wsub_n + lc * TN + q;
                    rn[(ni * TN + q) as usize] = unsafe { *bt.add((p * BN + n) as usize) };
                    q += 1;
                }
                ni += 1;
            }
            mi = 0;
            while mi < wmiter {
                ni = 0;
                while ni < WNITER {
                    let mut r = 0;
                    while r < TM {
                        let mut q = 0;
                        while q < TN {
                            let idx = ((mi * TM + r) * (WNITER * TN) + ni * TN + q) as usize;
                            acc[idx] = math::fma(rm[(mi * TM + r) as usize], rn[(ni * TN + q) as usize], acc[idx]);
                            q += 1;
                        }
                        r += 1;
                    }
                    ni += 1;
                }
                mi += 1;
            }
            p += 1;
        }
        sync::sync_threads();
        k0 += BK;
    }
    let mut mi = 0;
    while mi < wmiter {
        let mut ni = 0;
        while ni < WNITER {
            let mut r = 0;
            while r < TM {
                let mut q = 0;
                while q < TN {
                    let row = row0 + wr * WM + mi * wsub_m + lr * TM + r;
                    let col = col0 + wc * WN + ni * wsub_n + lc * TN + q;
                    if row < s.m && col < s.n {
                        let idx = ((mi * TM + r) * (WNITER * TN) + ni * TN + q) as usize;
                        unsafe { c.write((row * s.n + col) as usize, acc[idx]) };
                    }
                    q += 1;
                }
                r += 1;
            }
            ni += 1;
        }
        mi += 1;
    }
}

/// Rung 7: warp tiling, 128 x 128 x 16 block tile, 4 warps of 64 x 64, each swept in 4 sub-tiles of
/// 64 x 16 (WNITER = 4); a lane computes 8 x 4 of each (TM = 8, TN = 4). Block 128, dynamic shared
/// memory 16 KB.
#[kernel]
pub unsafe fn sgemm_warptile_128x128x16(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape) {
    unsafe { warptile::<128, 128, 16, 64, 64, 4, 8, 4>(a, b, c, s) }
}

/// Padding (floats) after each k-row of the transposed A tile in shared memory. A thread stores the
/// four k-values of one A row to four k-rows of the tile; with rows of exactly BM floats (a multiple
/// of 32 words) the threads of a warp that hold the same row index but different k land in one bank.
/// Four floats keep every row start 16-byte aligned for `ld.shared.v4` and move k-row `p` by `4 p`
/// banks, so the 32 scalar stores of a warp (16 rows x 2 k-groups when BK = 8) hit 32 banks; with
/// BK = 16 (8 rows x 4 k-groups) two k-groups share banks, a 2-way conflict on these stores only.
pub const WARPTILE_A_PAD: u32 = 4;

/// Dynamic shared memory (bytes) of a double-buffered warp-tile rung: two stages of the transposed A
/// tile (`[BK][BM + WARPTILE_A_PAD]`) and the B tile (`[BK][BN]`).
pub const fn warptile_db_smem(bm: u32, bn: u32, bk: u32) -> u32 {
    2 * (bk * (bm + WARPTILE_A_PAD) + bk * bn) * 4
}

/// One k step of a lane's TM x TN products: `acc[r TN + q] = fma(am[r], bn[q], acc[r TN + q])`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn fma_step<const TM: u32, const TN: u32>(acc: &mut [f32; 128], (am, bn): &([f32; 16], [f32; 16])) {
    let mut r = 0;
    while r < TM {
        let mut q = 0;
        while q < TN {
            let x = (r * TN + q) as usize;
            acc[x] = math::fma(am[r as usize], bn[q as usize], acc[x]);
            q += 1;
        }
        r += 1;
    }
}

/// A lane's fragments through [`hint::launder`]: products that use them cannot be moved above
/// whatever precedes this call (such as a barrier).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn launder_frags<const TM: u32, const TN: u32>((am, bn): ([f32; 16], [f32; 16])) -> ([f32; 16], [f32; 16]) {
    let (mut am, mut bn) = (am, bn);
    let mut r = 0;
    while r < TM {
        am[r as usize] = f32::from_bits(hint::launder(am[r as usize].to_bits()));
        r += 1;
    }
    let mut q = 0;
    while q < TN {
        bn[q as usize] = f32::from_bits(hint::launder(bn[q as usize].to_bits()));
        q += 1;
    }
    (am, bn)
}

/// Rung 7, tuned body: warp tiling with a register-prefetched, double-buffered k loop.
///
/// Tiling: the block computes a BM x BN tile of C, BK deep per step, with (BM / WM) x (BN / WN)
/// warps; warp (wr, wc) owns a WM x WN sub-tile. Its 32 lanes form an (WM / TM) x (WN / TN) grid
/// (which must have 32 cells); lane (lm, ln) owns TM x TN results, as (TM / 4) x (TN / 4) blocks of
/// 4 x 4: rows `wr WM + i (4 WM / TM) + 4 lm + 0..4` for i < TM / 4, columns
/// `wc WN + j (4 WN / TN) + 4 ln + 0..4` for j < TN / 4. So each k step a lane reads its A values
/// as TM / 4 16-byte shared loads and its B values as TN / 4, and the 8 lanes of a quarter warp read
/// one A vector (broadcast) and 8 adjacent B vectors (128 contiguous bytes): no bank conflicts.
///
/// Pipeline: shared memory holds two stages; each stage is A transposed (`[BK][BM + pad]`, k-major,
/// so a lane's 4 rows are one vector) and B as is (`[BK][BN]`). While the block computes on one
/// stage, each thread holds the next k-tile in registers (16-byte global loads issued at the top of
/// the tile) and fragments are double-buffered in registers (step p + 1's shared loads issue before
/// step p's multiply-adds). Before a tile's last step the threads write the next tile into the other
/// stage and meet at the tile's one barrier; the last step's multiply-adds, kept after the barrier
/// with [`hint::launder`], then hide the next tile's first shared loads. Without that, ptxas put
/// every multiply-add before the barrier and each warp began its next tile waiting on shared memory
/// (Nsight Compute, 128 x 256 rung at 4096^3: issue slots 77 % busy against cuBLAS's 88 %, the
/// largest stall reason the short-scoreboard wait on shared loads). That is the `LATE = true` loop;
/// with `LATE = false` each tile runs its steps in order and stores the next tile after them (the
/// wide NT rung measured 0.95 of cuBLAS this way and 0.88 with the other loop).
///
/// Layouts: `TA` reads A stored transposed (k x m, row-major: `C = A^T B` of the stored matrix),
/// `TB` reads B stored transposed (n x k: `C = A B^T`); only the global loads and their shared
/// stores differ (and the loop, where an instantiation picks `LATE = false`), so every layout
/// computes the same chains, bit for bit. Alignment: 16-byte rows of every stored operand (`k % 4`
/// for A or B stored with k innermost, `m % 4` for A^T, `n % 4` for B and C).
///
/// Numerics: every C element is one chain `acc = fma(a[i][p], b[p][j], acc)` over p = 0, 1, ... in
/// order from +0; the last tile past k is zero-filled (fma(0, 0, acc) steps, which leave acc as it
/// is except a -0.0, which becomes +0.0: see `kiln::deterministic`). Edges in m and n are
/// zero-filled on load and masked on store; needs `k % 4 == 0`, `n % 4 == 0` and 16-byte-aligned
/// a, b, c (C is written with 16-byte stores).
///
/// Edges: a block whose tile lies inside C, of a product whose k is a multiple of BK, runs the body
/// instantiated without any bounds checks (`EDGE = false`); the others run it with them. Both
/// compute the same chains. Needs k > 0 (k = 0 counts as a multiple of BK, and the first tile's
/// loads would go unchecked): the host never launches a rung for k = 0 ([`GemmShape`] products
/// with k = 0 are all zeros, written without a kernel).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn warptile_db<
    const BM: u32,
    const BN: u32,
    const BK: u32,
    const WM: u32,
    const WN: u32,
    const TM: u32,
    const TN: u32,
    const TA: bool,
    const TB: bool,
    const LATE: bool,
>(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    let inside =
        (thread::block_idx_y() + 1) * BM <= s.m && (thread::block_idx_x() + 1) * BN <= s.n && s.k.is_multiple_of(BK);
    if inside {
        unsafe { warptile_db_body::<BM, BN, BK, WM, WN, TM, TN, TA, TB, LATE, false>(a, b, c, s) }
    } else {
        unsafe { warptile_db_body::<BM, BN, BK, WM, WN, TM, TN, TA, TB, LATE, true>(a, b, c, s) }
    }
}

/// [`warptile_db`]'s body; with `EDGE = false` the caller promises the block's tile is inside C and
/// k is a multiple of BK, and no load or store is checked.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn warptile_db_body<
    const BM: u32,
    const BN: u32,
    const BK: u32,
    const WM: u32,
    const WN: u32,
    const TM: u32,
    const TN: u32,
    const TA: bool,
    const TB: bool,
    const LATE: bool,
    const EDGE: bool,
>(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    const {
        assert!((WM / TM) * (WN / TN) == 32, "a warp's lanes must tile its sub-tile exactly");
        assert!(BM % WM == 0 && BN % WN == 0 && WM % TM == 0 && WN % TN == 0);
        assert!(TM % 4 == 0 && TN % 4 == 0 && TM <= 16 && TN <= 16 && TM * TN <= 128);
        assert!(BK % 4 == 0);
        // at most 4 16-byte loads per thread per operand and k-tile (the prefetch registers)
        assert!(BM * BK / 4 <= 4 * (BM / WM) * (BN / WN) * 32);
        assert!(BN * BK / 4 <= 4 * (BM / WM) * (BN / WN) * 32);
    }
    let threads = (BM / WM) * (BN / WN) * 32;
    let sa = BM + WARPTILE_A_PAD; // floats per k-row of the transposed A tile
    let (a_bytes, stage_bytes) = (BK * sa * 4, (BK * sa + BK * BN) * 4);
    let (sub_m, sub_n) = (WM / (TM / 4), WN / (TN / 4)); // distance between a lane's 4 x 4 blocks
    let t = thread::thread_idx_x();
    let (w, lane) = (t / 32, t % 32);
    let (wr, wc) = (w / (BN / WN), w % (BN / WN));
    let (lm, ln) = (lane / (WN / TN), lane % (WN / TN));
    let (row0, col0) = (thread::block_idx_y() * BM, thread::block_idx_x() * BN);
    let smem = shared::dynamic_smem_addr();
    // this lane's first A and B vector in a stage, bytes
    let a_rd = (wr * WM + lm * 4) * 4;
    let b_rd = a_bytes + (wc * WN + ln * 4) * 4;

    // The loads of one k-tile: 16-byte vector l of A is (row i / (BK / 4), k-column 4 (i % (BK / 4)))
    // with i = t + l * threads; of B, (k-row i / (BN / 4), column 4 (i % (BN / 4))).
    let (a_vecs, b_vecs) = (BM * BK / 4, BK * BN / 4);
    let mut pa = [[0.0f32; 4]; 4];
    let mut pb = [[0.0f32; 4]; 4];
    // With TA (A stored k x m), vector l is instead (k-row i / (BM / 4), rows 4 (i % (BM / 4)) of
    // C); with TB (B stored n x k), (column i / (BK / 4) of C, k-column 4 (i % (BK / 4))): vectors
    // always run along the stored rows.
    let load = |k0: u32, pa: &mut [[f32; 4]; 4], pb: &mut [[f32; 4]; 4]| {
        let mut l = 0;
        while l * threads < a_vecs {
            let i = t + l * threads;
            let live = a_vecs.is_multiple_of(threads) || i < a_vecs;
            pa[l as usize] = if TA {
                let (r, c4) = (i / (BM / 4), (i % (BM / 4)) * 4);
                let (gk, gm) = (k0 + r, row0 + c4);
                if live && (!EDGE || (gk < s.k && gm < s.m)) {
                    unsafe { a.read4(((gk * s.m + gm) / 4) as usize) }
                } else {
                    [0.0; 4]
                }
            } else {
                let (r, c4) = (i / (BK / 4), (i % (BK / 4)) * 4);
                let (gr, gc) = (row0 + r, k0 + c4);
                if live && (!EDGE || (gr < s.m && gc < s.k)) {
                    unsafe { a.read4(((gr * s.k + gc) / 4) as usize) }
                } else {
                    [0.0; 4]
                }
            };
            l += 1;
        }
        l = 0;
        while l * threads < b_vecs {
            let i = t + l * threads;
            let live = b_vecs.is_multiple_of(threads) || i < b_vecs;
            pb[l as usize] = if TB {
                let (r, c4) = (i / (BK / 4), (i % (BK / 4)) * 4);
                let (gn, gk) = (col0 + r, k0 + c4);
                if live && (!EDGE || (gn < s.n && gk < s.k)) {
                    unsafe { b.read4(((gn * s.k + gk) / 4) as usize) }
                } else {
                    [0.0; 4]
                }
            } else {
                let (r, c4) = (i / (BN / 4), (i % (BN / 4)) * 4);
                let (gr, gc) = (k0 + r, col0 + c4);
                if live && (!EDGE || (gr < s.k && gc < s.n)) {
                    unsafe { b.read4(((gr * s.n + gc) / 4) as usize) }
                } else {
                    [0.0; 4]
                }
            };
            l += 1;
        }
    };
    let store = |stage: u32, pa: &[[f32; 4]; 4], pb: &[[f32; 4]; 4]| {
        let base = smem + stage;
        let mut l = 0;
        let v4 = |v: [f32; 4]| [v[0].to_bits(), v[1].to_bits(), v[2].to_bits(), v[3].to_bits()];
        while l * threads < a_vecs {
            let i = t + l * threads;
            if a_vecs.is_multiple_of(threads) || i < a_vecs {
                if TA {
                    // already k-major: one vector store
                    let (r, c4) = (i / (BM / 4), (i % (BM / 4)) * 4);
                    unsafe { shared::st_shared_v4(base + (r * sa + c4) * 4, v4(pa[l as usize])) };
                } else {
                    let (r, c4) = (i / (BK / 4), (i % (BK / 4)) * 4);
                    let mut j = 0;
                    while j < 4 {
                        unsafe {
                            shared::st_shared_b32(base + ((c4 + j) * sa + r) * 4, pa[l as usize][j as usize].to_bits())
                        };
                        j += 1;
                    }
                }
            }
            l += 1;
        }
        l = 0;
        while l * threads < b_vecs {
            let i = t + l * threads;
            if b_vecs.is_multiple_of(threads) || i < b_vecs {
                if TB {
                    // n-major in memory, k-major in the tile: four scalar stores
                    let (r, c4) = (i / (BK / 4), (i % (BK / 4)) * 4);
                    let mut j = 0;
                    while j < 4 {
                        unsafe {
                            shared::st_shared_b32(
                                base + a_bytes + ((c4 + j) * BN + r) * 4,
                                pb[l as usize][j as usize].to_bits(),
                            )
                        };
                        j += 1;
                    }
                } else {
                    let (r, c4) = (i / (BN / 4), (i % (BN / 4)) * 4);
                    unsafe { shared::st_shared_v4(base + a_bytes + (r * BN + c4) * 4, v4(pb[l as usize])) };
                }
            }
            l += 1;
        }
    };

    // A lane's fragments at k step p of the stage at byte offset `st`: TM values of A, TN of B.
    let frag = |st: u32, p: u32| {
        let (a_st, b_st) = (smem + st + a_rd, smem + st + b_rd);
        let mut am = [0.0f32; 16];
        let mut bn = [0.0f32; 16];
        let mut i = 0;
        while i < TM / 4 {
            let v = unsafe { shared::ld_shared_v4(a_st + (p * sa + i * sub_m) * 4) };
            let mut e = 0;
            while e < 4 {
                am[(i * 4 + e) as usize] = f32::from_bits(v[e as usize]);
                e += 1;
            }
            i += 1;
        }
        let mut j = 0;
        while j < TN / 4 {
            let v = unsafe { shared::ld_shared_v4(b_st + (p * BN + j * sub_n) * 4) };
            let mut e = 0;
            while e < 4 {
                bn[(j * 4 + e) as usize] = f32::from_bits(v[e as usize]);
                e += 1;
            }
            j += 1;
        }
        (am, bn)
    };

    let mut acc = [0.0f32; 128]; // acc[r * TN + q]: row block r / 4, column block q / 4
    load(0, &mut pa, &mut pb);
    store(0, &pa, &pb);
    sync::sync_threads();
    let tiles = s.k.div_ceil(BK);
    let mut stage = 0;
    if LATE {
        // Fragments are double-buffered in registers: step p's multiply-adds run while step
        // p + 1's fragments load. At a tile's last step the next tile goes from the prefetch
        // registers into the other stage, one barrier publishes it, and its first fragments load
        // under the last step's multiply-adds (so no warp starts a tile waiting on shared memory).
        let mut cur = frag(stage, 0);
        let mut kt = 0;
        while kt < tiles {
            // the next k-tile into registers (none after the last)
            let more = kt + 1 < tiles;
            if more {
                load((kt + 1) * BK, &mut pa, &mut pb);
            }
            let mut p = 0;
            while p + 1 < BK {
                let next = frag(stage, p + 1);
                fma_step::<TM, TN>(&mut acc, &cur);
                cur = next;
                p += 1;
            }
            // Every warp finished reading the other stage before the last barrier. After the last
            // tile this stores and reads a stage nobody uses, which keeps the loop free of a
            // branch (ptxas would hoist the last step's products, common to both arms, above the
            // barrier).
            store(stage ^ stage_bytes, &pa, &pb);
            sync::sync_threads();
            let next = frag(stage ^ stage_bytes, 0);
            // the last step's products after the barrier, so they hide the loads above
            fma_step::<TM, TN>(&mut acc, &launder_frags::<TM, TN>(cur));
            cur = next;
            stage ^= stage_bytes;
            kt += 1;
        }
    } else {
        // Each tile's steps in order (ptxas schedules the shared loads), then the next tile into
        // the other stage and the tile's barrier.
        let mut kt = 0;
        while kt < tiles {
            let more = kt + 1 < tiles;
            if more {
                load((kt + 1) * BK, &mut pa, &mut pb);
            }
            let mut p = 0;
            while p < BK {
                fma_step::<TM, TN>(&mut acc, &frag(stage, p));
                p += 1;
            }
            stage ^= stage_bytes;
            if more {
                store(stage, &pa, &pb);
                sync::sync_threads();
            }
            kt += 1;
        }
    }

    let mut i = 0;
    while i < TM / 4 {
        let mut e = 0;
        while e < 4 {
            let row = row0 + wr * WM + i * sub_m + lm * 4 + e;
            if !EDGE || row < s.m {
                let mut j = 0;
                while j < TN / 4 {
                    let col = col0 + wc * WN + j * sub_n + ln * 4;
                    if !EDGE || col < s.n {
                        let x = ((i * 4 + e) * TN + j * 4) as usize;
                        unsafe {
                            c.write4(((row * s.n + col) / 4) as usize, [acc[x], acc[x + 1], acc[x + 2], acc[x + 3]])
                        };
                    }
                    j += 1;
                }
            }
            e += 1;
        }
        i += 1;
    }
}

/// Rung 7, tuned: 128 x 128 x 8 block tile, 256 threads (8 warps as 4 x 2, each 32 x 64), 8 x 8
/// results per lane as 2 x 2 blocks of 4 x 4 (lanes 4 x 8 in the warp); double-buffered shared
/// memory fed by register prefetch. Grid (ceil(n / 128), ceil(m / 128)), block 256, dynamic shared
/// memory `warptile_db_smem(128, 128, 8)` = 16,640 bytes. Needs `k % 4 == 0`, `n % 4 == 0`.
/// Launch bound: two blocks per SM (at most 128 registers; without the bound ptxas took 130, one
/// block per SM).
#[kernel(max_threads = 256, min_blocks = 2)]
pub unsafe fn sgemm_warptile_128x128x8_8x8_db(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    unsafe { warptile_db::<128, 128, 8, 32, 64, 8, 8, false, false, true>(a, b, c, s) }
}

/// Rung 7, tuned, deeper k step: 128 x 128 x 16, otherwise as `sgemm_warptile_128x128x8_8x8_db`
/// (warps 4 x 2 of 32 x 64, 8 x 8 per lane). Block 256, dynamic shared memory 33,280 bytes.
#[kernel]
pub unsafe fn sgemm_warptile_128x128x16_8x8_db(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    unsafe { warptile_db::<128, 128, 16, 32, 64, 8, 8, false, false, true>(a, b, c, s) }
}

/// Rung 7, tuned, wide tile: 128 x 256 x 8, 256 threads (warps 4 x 2, each 32 x 128), 8 x 16 per
/// lane as 2 x 4 blocks of 4 x 4 (lanes 4 x 8). Grid (ceil(n / 256), ceil(m / 128)), block 256,
/// dynamic shared memory 24,832 bytes.
#[kernel]
pub unsafe fn sgemm_warptile_128x256x8_8x16_db(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    unsafe { warptile_db::<128, 256, 8, 32, 128, 8, 16, false, false, true>(a, b, c, s) }
}

/// Rung 7, tuned, tall tile: 256 x 128 x 8, 256 threads (warps 4 x 2, each 64 x 64), 16 x 8 per
/// lane as 4 x 2 blocks of 4 x 4 (lanes 4 x 8). Grid (ceil(n / 128), ceil(m / 256)), block 256,
/// dynamic shared memory 24,832 bytes.
#[kernel]
pub unsafe fn sgemm_warptile_256x128x8_16x8_db(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    unsafe { warptile_db::<256, 128, 8, 64, 64, 16, 8, false, false, true>(a, b, c, s) }
}

/// Rung 7, tuned, small tile for products that would not fill the GPU with 128 x 128 tiles:
/// 64 x 128 x 8, 256 threads (warps 4 x 2, each 16 x 64), 4 x 8 per lane as 1 x 2 blocks of 4 x 4
/// (lanes 4 x 8); A's tile is 128 vectors, so half the threads load none. Grid (ceil(n / 128),
/// ceil(m / 64)), block 256, dynamic shared memory 12,544 bytes.
#[kernel]
pub unsafe fn sgemm_warptile_64x128x8_4x8_db(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: GemmShape) {
    unsafe { warptile_db::<64, 128, 8, 16, 64, 4, 8, false, false, true>(a, b, c, s) }
}

/// The wide tuned rung (`sgemm_warptile_128x256x8_8x16_db`) for `C = A B^T`: B stored n x k (the
/// layout of `Y = X W^T` and of `dX = dY W` read as `dY (W^T)^T`), read without a transposed copy.
/// Needs `k % 4 == 0`, `n % 4 == 0`; otherwise as the NN kernel, but on the `LATE = false` loop
/// (0.95 of cuBLAS NT with it, 0.88 with the NN kernel's loop).
#[kernel]
pub unsafe fn sgemm_warptile_128x256x8_8x16_db_nt(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    unsafe { warptile_db::<128, 256, 8, 32, 128, 8, 16, false, true, false>(a, b, c, s) }
}

/// The wide tuned rung for `C = A^T B`: A stored k x m (the layout of `dW = dY^T X`). Needs
/// `m % 4 == 0`, `n % 4 == 0`; otherwise as the NN kernel.
#[kernel]
pub unsafe fn sgemm_warptile_128x256x8_8x16_db_tn(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    unsafe { warptile_db::<128, 256, 8, 32, 128, 8, 16, true, false, true>(a, b, c, s) }
}

/// The small tuned rung (`sgemm_warptile_64x128x8_4x8_db`) for `C = A B^T` (B stored n x k).
#[kernel]
pub unsafe fn sgemm_warptile_64x128x8_4x8_db_nt(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    unsafe { warptile_db::<64, 128, 8, 16, 64, 4, 8, false, true, true>(a, b, c, s) }
}

/// The small tuned rung for `C = A^T B` (A stored k x m).
#[kernel]
pub unsafe fn sgemm_warptile_64x128x8_4x8_db_tn(
    a: DevicePtr<f32>,
    b: DevicePtr<f32>,
    c: DevicePtrMut<f32>,
    s: GemmShape,
) {
    unsafe { warptile_db::<64, 128, 8, 16, 64, 4, 8, true, false, true>(a, b, c, s) }
}
