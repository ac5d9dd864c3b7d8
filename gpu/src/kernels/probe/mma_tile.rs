//! Tensor-core tile products with `mma.sync`: the smallest complete use of `cp.async`, `ldmatrix`
//! and `mma`, one warp per 16x8 output tile. The GEMM ladder builds the fast kernels; these check the
//! building blocks against a CPU reference. The `mma.sync` peak-rate probes
//! (`mma_sync_peak_bf16`, `mma_sync_peak_tf32`) that the GEMM benchmark times are here too.

use crate::{DevicePtr, DevicePtrMut, kernel};
use crate::{convert, cp_async, matrix, mma, shared, sync, thread, warp};
use half::{bf16, f16};

/// Rows of C per block (one warp).
pub const MMA_TILE_M: u32 = 16;
/// Columns of C per block.
pub const MMA_TILE_N: u32 = 8;
/// Threads per block: one warp.
pub const MMA_THREADS: u32 = 32;
/// Dynamic shared memory: an A tile of 16 rows and a B tile of 8 rows, 32 bytes each.
pub const MMA_SMEM_BYTES: u32 = (MMA_TILE_M + MMA_TILE_N) * 32;

// The problem shape these kernels take is the GEMMs' (re-exported here, its old home).
pub use crate::kernels::gemm::GemmShape;

impl GemmShape {
    /// The grid of 16x8 tiles covering C: (ceil(n / 8), ceil(m / 16)).
    pub const fn tile_grid(self) -> (u32, u32) {
        (self.n.div_ceil(MMA_TILE_N), self.m.div_ceil(MMA_TILE_M))
    }
}

/// Shared body of the bf16 and f16 kernels: `F16` picks the instruction.
///
/// Per k-step of 16, lane `l` stages 16 bytes of A (row `l / 2`, half `l % 2`) and lanes 0-15 16
/// bytes of B with `cp.async` (zero-filled past the edges), `ldmatrix.x4` / `.x2` turn the tiles into
/// fragments, and one `mma.m16n8k16` accumulates. `k` must be a multiple of 8 (16-byte rows).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn tile_16bit<const F16: bool>(a: *const u16, b: *const u16, c: DevicePtrMut<f32>, s: GemmShape) {
    let lane = thread::lane_id();
    let (m0, n0) = (thread::block_idx_y() * MMA_TILE_M, thread::block_idx_x() * MMA_TILE_N);
    let a_s = shared::dynamic_smem_addr();
    let b_s = a_s + MMA_TILE_M * 32;
    let mut acc = [0.0f32; 4];
    let mut k0 = 0;
    while k0 < s.k {
        // Stage: each row of a tile is 16 elements = two 16-byte chunks.
        let (row, half) = (lane / 2, lane % 2);
        let kc = k0 + half * 8;
        let (ar, a_ok) = (m0 + row, m0 + row < s.m && kc < s.k);
        let src = if a_ok { unsafe { a.add((ar * s.k + kc) as usize) } } else { a };
        unsafe { cp_async::copy_16_zfill(a_s + row * 32 + half * 16, src as *const u8, if a_ok { 16 } else { 0 }) };
        if lane < 16 {
            let (br, b_ok) = (n0 + row, n0 + row < s.n && kc < s.k);
            let src = if b_ok { unsafe { b.add((br * s.k + kc) as usize) } } else { b };
            unsafe { cp_async::copy_16_zfill(b_s + row * 32 + half * 16, src as *const u8, if b_ok { 16 } else { 0 }) };
        }
        cp_async::commit_group();
        cp_async::wait_all();
        sync::sync_warp(warp::FULL_MASK);

        let (ar, ac) = matrix::ldmatrix_x4_a_row_col(lane);
        let (bn, bk) = matrix::ldmatrix_x2_b_row_col(lane);
        let fa = unsafe { matrix::ldmatrix_x4(a_s + ar * 32 + ac * 2) };
        let fb = unsafe { matrix::ldmatrix_x2(b_s + bn * 32 + bk * 2) };
        acc = if F16 { mma::mma_m16n8k16_f16(fa, fb, acc) } else { mma::mma_m16n8k16_bf16(fa, fb, acc) };
        sync::sync_warp(warp::FULL_MASK);
        k0 += 16;
    }
    store_c(c, s, m0, n0, lane, acc);
}

/// Writes a lane's C fragment, masked to the matrix.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn store_c(c: DevicePtrMut<f32>, s: GemmShape, m0: u32, n0: u32, lane: u32, acc: [f32; 4]) {
    let mut i = 0;
    while i < 4 {
        let (r, col) = mma::m16n8_c(lane, i);
        if m0 + r < s.m && n0 + col < s.n {
            unsafe { c.write(((m0 + r) * s.n + n0 + col) as usize, acc[i as usize]) };
        }
        i += 1;
    }
}

/// `C = A B^T` with bf16 inputs and f32 accumulation on `mma.sync.m16n8k16`.
///
/// - Parameters: `a` (m x k, row-major), `b` (n x k, row-major: B^T), `c` (m x n f32, row-major),
///   `shape` with `k % 8 == 0`.
/// - Grid: [`GemmShape::tile_grid`]; block: one warp; dynamic shared memory [`MMA_SMEM_BYTES`].
#[kernel]
pub unsafe fn mma_tile_bf16(a: DevicePtr<bf16>, b: DevicePtr<bf16>, c: DevicePtrMut<f32>, shape: GemmShape) {
    unsafe { tile_16bit::<false>(a.as_ptr() as *const u16, b.as_ptr() as *const u16, c, shape) }
}

/// `C = A B^T` with f16 inputs and f32 accumulation; otherwise as [`mma_tile_bf16`].
#[kernel]
pub unsafe fn mma_tile_f16(a: DevicePtr<f16>, b: DevicePtr<f16>, c: DevicePtrMut<f32>, shape: GemmShape) {
    unsafe { tile_16bit::<true>(a.as_ptr() as *const u16, b.as_ptr() as *const u16, c, shape) }
}

/// `C = A B^T` with f32 inputs rounded to tf32 and f32 accumulation on `mma.sync.m16n8k8`.
///
/// - Parameters: as [`mma_tile_bf16`] with f32 inputs; `k % 4 == 0`.
/// - Per k-step of 8, A and B tiles (16 and 8 rows of 32 bytes) are staged with `cp.async`; each lane
///   reads its fragment elements at the positions [`mma::m16n8k8_tf32_a`] and
///   [`mma::m16n8k8_tf32_b`] give, rounding with [`convert::f32_to_tf32`] (`cvt.rn.tf32.f32` on sm_90, `cvt.rna` on sm_80).
/// - Grid, block and shared memory as [`mma_tile_bf16`].
#[kernel]
pub unsafe fn mma_tile_tf32(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, shape: GemmShape) {
    let s = shape;
    let lane = thread::lane_id();
    let (m0, n0) = (thread::block_idx_y() * MMA_TILE_M, thread::block_idx_x() * MMA_TILE_N);
    let a_s = shared::dynamic_smem_addr();
    let b_s = a_s + MMA_TILE_M * 32;
    let a_tile: *const f32 = shared::dynamic_smem(0);
    let b_tile: *const f32 = shared::dynamic_smem((MMA_TILE_M * 32) as usize);
    let mut acc = [0.0f32; 4];
    let mut k0 = 0;
    while k0 < s.k {
        let (row, half) = (lane / 2, lane % 2);
        let kc = k0 + half * 4;
        let a_ok = m0 + row < s.m && kc < s.k;
        let src = if a_ok { unsafe { a.as_ptr().add(((m0 + row) * s.k + kc) as usize) } } else { a.as_ptr() };
        unsafe { cp_async::copy_16_zfill(a_s + row * 32 + half * 16, src as *const u8, if a_ok { 16 } else { 0 }) };
        if lane < 16 {
            let b_ok = n0 + row < s.n && kc < s.k;
            let src = if b_ok { unsafe { b.as_ptr().add(((n0 + row) * s.k + kc) as usize) } } else { b.as_ptr() };
            unsafe { cp_async::copy_16_zfill(b_s + row * 32 + half * 16, src as *const u8, if b_ok { 16 } else { 0 }) };
        }
        cp_async::commit_group();
        cp_async::wait_all();
        sync::sync_warp(warp::FULL_MASK);

        let mut fa = [0u32; 4];
        let mut fb = [0u32; 2];
        let mut i = 0;
        while i < 4 {
            let (r, kk) = mma::m16n8k8_tf32_a(lane, i);
            fa[i as usize] = convert::f32_to_tf32(unsafe { *a_tile.add((r * 8 + kk) as usize) });
            if i < 2 {
                let (kk, n) = mma::m16n8k8_tf32_b(lane, i);
                fb[i as usize] = convert::f32_to_tf32(unsafe { *b_tile.add((n * 8 + kk) as usize) });
            }
            i += 1;
        }
        acc = mma::mma_m16n8k8_tf32(fa, fb, acc);
        sync::sync_warp(warp::FULL_MASK);
        k0 += 8;
    }
    store_c(c, s, m0, n0, lane, acc);
}

/// Independent `mma.sync` products per warp per iteration of `mma_sync_peak_bf16` and
/// `mma_sync_peak_tf32`.
pub const PEAK_MMAS_PER_ITER: u32 = 32;

/// The body of the `mma.sync` ceilings: `iters` x [`PEAK_MMAS_PER_ITER`] products on register
/// fragments (a 4 x 8 grid of accumulators, the wide GEMM's warp tile: A fragment `fa[mi]`, the one
/// B fragment `fb`), with no memory traffic; lane 0 of each warp writes one sum to `out[global
/// warp]` so the work is kept.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn mma_sync_peak<A: Copy, B: Copy>(
    out: DevicePtrMut<f32>,
    iters: u32,
    fa: [A; 4],
    fb: B,
    product: impl Fn(A, B, [f32; 4]) -> [f32; 4],
) {
    let mut acc = [[[0.0f32; 4]; 8]; 4];
    let mut it = 0;
    while it < iters {
        let mut mi = 0;
        while mi < 4 {
            let mut ni = 0;
            while ni < 8 {
                acc[mi][ni] = product(fa[mi], fb, acc[mi][ni]);
                ni += 1;
            }
            mi += 1;
        }
        it += 1;
    }
    let mut sum = 0.0f32;
    let mut mi = 0;
    while mi < 4 {
        let mut ni = 0;
        while ni < 8 {
            sum += acc[mi][ni][0] + acc[mi][ni][1] + acc[mi][ni][2] + acc[mi][ni][3];
            ni += 1;
        }
        mi += 1;
    }
    if thread::lane_id() == 0 {
        let warp = thread::block_idx_x() * (thread::block_dim_x() / 32) + thread::warp_id();
        unsafe { out.write(warp as usize, sum) };
    }
}

/// The bf16 `mma.sync` ceiling: every warp runs `iters` x [`PEAK_MMAS_PER_ITER`] `m16n8k16`
/// products on register fragments (see `mma_sync_peak`). FLOPs: `2 * 16 * 8 * 16 *
/// PEAK_MMAS_PER_ITER * iters` per warp. Any grid; blocks of any warp count (the benchmark uses 256
/// threads, as the GEMM).
#[kernel(max_threads = 256)]
pub unsafe fn mma_sync_peak_bf16(out: DevicePtrMut<f32>, iters: u32) {
    // fragments that stay finite: bf16 pairs of small values made from the lane
    let x = 0x3c00_3c00u32 ^ (thread::lane_id() & 7); // about (1.0, 1.0) bf16, perturbed in the last bits
    let fa = [[x; 4], [x ^ 1; 4], [x ^ 2; 4], [x ^ 3; 4]];
    unsafe { mma_sync_peak(out, iters, fa, [x ^ 4; 2], mma::mma_m16n8k16_bf16) };
}

/// The tf32 `mma.sync` ceiling, as [`mma_sync_peak_bf16`] with `m16n8k8` tf32 products (the
/// megakernel's instruction). FLOPs: `2 * 16 * 8 * 8 * PEAK_MMAS_PER_ITER * iters` per warp.
#[kernel(max_threads = 256)]
pub unsafe fn mma_sync_peak_tf32(out: DevicePtrMut<f32>, iters: u32) {
    // about 1/64 in tf32, perturbed in the lowest kept mantissa bits, so the sums stay finite
    let x = 0x3c80_0000u32 ^ ((thread::lane_id() & 7) << 13);
    let fa = [[x; 4], [x ^ (1 << 14); 4], [x ^ (1 << 15); 4], [x ^ (3 << 14); 4]];
    unsafe { mma_sync_peak(out, iters, fa, [x ^ (1 << 16); 2], mma::mma_m16n8k8_tf32) };
}
