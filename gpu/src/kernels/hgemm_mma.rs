//! Tensor-core GEMM with `mma.sync` (the ladder's second part): `C = A B^T` with A (m x k) and
//! B (n x k) in bf16 or f16, row-major, and C (m x n) in f32 — the layout of `Y = X W^T`.
//!
//! - Block tile 128 x 128, k step 32, 8 warps as 2 x 4, each warp a 64 x 32 tile of 4 x 4
//!   `m16n8k16` products per 16 of k (64 f32 accumulators per lane).
//! - A 3-stage `cp.async` pipeline: while the tensor cores work on stage s, the copies for stage
//!   s + 2 are in flight (`cp.async.wait_group 1` keeps one group outstanding).
//! - Shared rows are 64 bytes (32 elements); 16-byte chunk `c` of row `r` is stored at chunk
//!   `c ^ ((r / 2) % 4)`, so the 8 rows an `ldmatrix` phase reads fall in 8 different bank groups.
//! - `k % 8 == 0` (16-byte rows for `cp.async`); any m and n (edge rows are zero-filled, stores
//!   masked).

use super::mma_tile::GemmShape;
use crate::{DevicePtr, DevicePtrMut, kernel};
use crate::{cp_async, matrix, mma, shared, sync, thread};
use half::{bf16, f16};

/// Rows of C per block.
pub const HGEMM_BM: u32 = 128;
/// Columns of C per block.
pub const HGEMM_BN: u32 = 128;
/// k per stage.
pub const HGEMM_BK: u32 = 32;
/// Pipeline depth.
pub const HGEMM_STAGES: u32 = 3;
/// Threads per block (8 warps).
pub const HGEMM_THREADS: u32 = 256;
/// Bytes of one stage (an A and a B tile of 128 rows x 64 bytes).
pub const HGEMM_STAGE_BYTES: u32 = (HGEMM_BM + HGEMM_BN) * HGEMM_BK * 2;
/// Dynamic shared memory per block.
pub const HGEMM_SMEM_BYTES: u32 = HGEMM_STAGES * HGEMM_STAGE_BYTES;

/// Byte offset of 16-byte chunk `chunk` (0..4) of row `row` in a swizzled tile of 64-byte rows
/// (pure: host-tested).
pub const fn swizzled_chunk(row: u32, chunk: u32) -> u32 {
    row * 64 + ((chunk ^ ((row / 2) % 4)) * 16)
}

/// Issues the copies of one stage: the A tile (rows m0.., k0..k0+32) and the B tile (rows n0..).
/// Each of the 256 threads copies two 16-byte chunks of each tile; rows or k past the edge are
/// zero-filled.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn load_stage(a: *const u16, b: *const u16, s: GemmShape, m0: u32, n0: u32, k0: u32, stage: u32) {
    let t = thread::thread_idx_x();
    let base = shared::dynamic_smem_addr() + stage * HGEMM_STAGE_BYTES;
    let b_base = base + HGEMM_BM * HGEMM_BK * 2;
    let mut i = 0;
    while i < 2 {
        let idx = t + i * HGEMM_THREADS; // 0..512: row idx / 4, chunk idx % 4
        let (row, chunk) = (idx / 4, idx % 4);
        let kc = k0 + chunk * 8;
        let (ar, br) = (m0 + row, n0 + row);
        let a_ok = ar < s.m && kc < s.k;
        let b_ok = br < s.n && kc < s.k;
        let asrc = if a_ok { unsafe { a.add((ar * s.k + kc) as usize) } } else { a };
        let bsrc = if b_ok { unsafe { b.add((br * s.k + kc) as usize) } } else { b };
        unsafe {
            cp_async::copy_16_zfill(base + swizzled_chunk(row, chunk), asrc as *const u8, if a_ok { 16 } else { 0 });
            cp_async::copy_16_zfill(b_base + swizzled_chunk(row, chunk), bsrc as *const u8, if b_ok { 16 } else { 0 });
        }
        i += 1;
    }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn hgemm<const F16: bool>(a: *const u16, b: *const u16, c: DevicePtrMut<f32>, s: GemmShape) {
    let lane = thread::lane_id();
    let w = thread::warp_id();
    let (wm, wn) = (w / 4, w % 4); // warp tile: rows wm*64, cols wn*32
    let (m0, n0) = (thread::block_idx_y() * HGEMM_BM, thread::block_idx_x() * HGEMM_BN);
    let k_tiles = s.k.div_ceil(HGEMM_BK);
    let mut acc = [[[0.0f32; 4]; 4]; 4];

    let mut st = 0;
    while st < HGEMM_STAGES - 1 {
        if st < k_tiles {
            unsafe { load_stage(a, b, s, m0, n0, st * HGEMM_BK, st) };
        }
        cp_async::commit_group();
        st += 1;
    }

    let mut kt = 0;
    while kt < k_tiles {
        cp_async::wait_group::<{ HGEMM_STAGES - 2 }>();
        sync::sync_threads();
        let next = kt + HGEMM_STAGES - 1;
        if next < k_tiles {
            unsafe { load_stage(a, b, s, m0, n0, next * HGEMM_BK, next % HGEMM_STAGES) };
        }
        cp_async::commit_group();

        let base = shared::dynamic_smem_addr() + (kt % HGEMM_STAGES) * HGEMM_STAGE_BYTES;
        let b_base = base + HGEMM_BM * HGEMM_BK * 2;
        let mut ks = 0;
        while ks < HGEMM_BK / 16 {
            let mut fa = [[0u32; 4]; 4];
            let mut fb = [[0u32; 2]; 4];
            let mut mi = 0;
            while mi < 4 {
                let row = wm * 64 + mi * 16 + lane % 16;
                let chunk = ks * 2 + lane / 16;
                fa[mi as usize] = unsafe { matrix::ldmatrix_x4(base + swizzled_chunk(row, chunk)) };
                mi += 1;
            }
            let mut ni = 0;
            while ni < 4 {
                let row = wn * 32 + ni * 8 + lane % 8;
                let chunk = ks * 2 + (lane / 8) % 2;
                fb[ni as usize] = unsafe { matrix::ldmatrix_x2(b_base + swizzled_chunk(row, chunk)) };
                ni += 1;
            }
            mi = 0;
            while mi < 4 {
                ni = 0;
                while ni < 4 {
                    let (x, y) = (mi as usize, ni as usize);
                    acc[x][y] = if F16 {
                        mma::mma_m16n8k16_f16(fa[x], fb[y], acc[x][y])
                    } else {
                        mma::mma_m16n8k16_bf16(fa[x], fb[y], acc[x][y])
                    };
                    ni += 1;
                }
                mi += 1;
            }
            ks += 1;
        }
        kt += 1;
    }
    cp_async::wait_all();

    let mut mi = 0;
    while mi < 4 {
        let mut ni = 0;
        while ni < 4 {
            let mut i = 0;
            while i < 4 {
                let (r, cc) = mma::m16n8_c(lane, i);
                let row = m0 + wm * 64 + mi * 16 + r;
                let col = n0 + wn * 32 + ni * 8 + cc;
                if row < s.m && col < s.n {
                    unsafe { c.write((row * s.n + col) as usize, acc[mi as usize][ni as usize][i as usize]) };
                }
                i += 1;
            }
            ni += 1;
        }
        mi += 1;
    }
}

/// `C = A B^T`, bf16 inputs, f32 accumulation and output (see the module docs). Grid
/// (ceil(n / 128), ceil(m / 128)); block 256; dynamic shared memory [`HGEMM_SMEM_BYTES`].
#[kernel]
pub unsafe fn hgemm_mma_bf16(a: DevicePtr<bf16>, b: DevicePtr<bf16>, c: DevicePtrMut<f32>, s: GemmShape) {
    unsafe { hgemm::<false>(a.as_ptr() as *const u16, b.as_ptr() as *const u16, c, s) }
}

/// `C = A B^T`, f16 inputs; otherwise as [`hgemm_mma_bf16`].
#[kernel]
pub unsafe fn hgemm_mma_f16(a: DevicePtr<f16>, b: DevicePtr<f16>, c: DevicePtrMut<f32>, s: GemmShape) {
    unsafe { hgemm::<true>(a.as_ptr() as *const u16, b.as_ptr() as *const u16, c, s) }
}
