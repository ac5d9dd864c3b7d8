//! Flash attention, rung 2: FlashAttention-2's forward on `mma.sync` (bf16 or f16 inputs, f32
//! accumulation), `ldmatrix` fragments, `cp.async` double-buffered K/V tiles, swizzled shared memory.
//!
//! - **Block.** [`FLASH_MMA_THREADS`] threads (4 warps) own [`FLASH_MMA_BQ`] query rows of one
//!   (batch, head); warp `w` owns rows `16 w .. 16 w + 16`, and every product of those rows stays in
//!   its registers. Grid `(ceil(q_len / BQ), batch * heads)`, the query tiles taken last first so
//!   that with the causal mask the longest blocks start first.
//! - **Q.** Copied once by `cp.async`; each warp loads its 16 x D slice as `D / 16` A fragments
//!   (`ldmatrix.x4`) and keeps them for the whole key loop.
//! - **K/V tiles.** [`FLASH_MMA_BKV`] keys per tile, two stages: the copies of tile `j + 1` are in
//!   flight while the warps compute on tile `j` (one `cp.async` group per tile, `wait_group 1`,
//!   a block barrier before and after the compute). Keys past `kv_len` are zero-filled.
//! - **S = Q K^T.** Per warp a 16 x 64 tile: 8 `n8` accumulators (32 f32 per lane), `D / 16` k steps
//!   of 4 `ldmatrix.x4` (K rows are the B operand "n x k") and 8 `mma.m16n8k16`.
//! - **Softmax.** Scores in log2 units (`s scale log2 e`, one multiply-add). A lane holds rows
//!   `g = lane / 4` and `g + 8` of the warp's slice; the row maximum is reduced over the 4 lanes of a
//!   quad (two `shfl.xor`), the running sum stays per lane until the end. Masked scores (past
//!   `kv_len`, above the causal diagonal) are `-inf`, only on tiles that need it.
//! - **P V.** The accumulator layout of two adjacent `n8` tiles of S is the A fragment of one k step
//!   of `P V` (rows g and g + 8, columns 2t, 2t + 1 and 8 + 2t, 9 + 2t), so P is rounded to bf16
//!   (f16) and packed in registers, never through shared memory. V (stored key-major, the B operand
//!   "k x n") comes from `ldmatrix.x4.trans`. O is 16 x D per warp: `D / 8` accumulators of 4.
//! - **Swizzle.** Shared rows are `2 D` bytes (128 or 256); 16-byte chunk `c` of row `r` sits at
//!   chunk `c ^ (r % 8)` ([`flash_chunk_offset`]), so the 8 rows of each `ldmatrix` phase hit 8
//!   different bank groups.
//! - **Epilogue.** `O = o / l`, rounded, staged through the warp's own rows of the Q tile and stored
//!   16 bytes per lane; the log-sum-exp `(m + log2 l) ln 2` by the quad's first lane.
//!
//! Shared memory: [`flash_mma_smem_bytes`] (Q, and two stages of K and V: 40 KiB at D = 64, 80 KiB
//! at D = 128).

use super::attention::AttentionParams;
use crate::{DevicePtr, DevicePtrMut, kernel};
use crate::{convert, cp_async, math, matrix, mma, shared, sync, thread, warp};
use half::{bf16, f16};

/// Query rows per block (16 per warp).
pub const FLASH_MMA_BQ: u32 = 64;
/// Keys per K/V tile.
pub const FLASH_MMA_BKV: u32 = 64;
/// Threads per block (4 warps).
pub const FLASH_MMA_THREADS: u32 = 128;

/// Dynamic shared memory of the rung-2 kernel for head dim `d`: the Q tile and two stages of K and
/// V tiles, 16-bit elements.
pub const fn flash_mma_smem_bytes(d: u32) -> u32 {
    (FLASH_MMA_BQ + 4 * FLASH_MMA_BKV) * d * 2
}

/// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of `row_bytes`-byte rows (a multiple
/// of 128): the chunk's low three bits XOR the row's (pure: host-tested). Within any 8 consecutive
/// rows, one chunk column lands in 8 different 16-byte bank groups.
pub const fn flash_chunk_offset(row_bytes: u32, row: u32, chunk: u32) -> u32 {
    row * row_bytes + ((chunk ^ (row % 8)) * 16)
}

/// 16 bytes with 16-byte alignment: one `st.global.v4` store.
#[cfg(target_arch = "nvptx64")]
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub(super) struct U32x4(pub(super) [u32; 4]);

/// Copies rows `row0..row0 + FLASH_MMA_BKV` (or the Q tile's `FLASH_MMA_BQ`) of a `[rows, D]`
/// 16-bit matrix into the swizzled tile at `dst`, 16 bytes per copy; rows past `rows` are
/// zero-filled (their source clamped into the matrix and not read).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(super) unsafe fn copy_tile<const D: u32, const ROWS: u32>(
    src: *const u16,
    rows: u32,
    row0: u32,
    dst: shared::SharedAddr,
    t: u32,
) {
    let per_row = D / 8;
    let mut e = t;
    while e < ROWS * per_row {
        let (r, c) = (e / per_row, e % per_row);
        let row = row0 + r;
        let ok = row < rows;
        let sr = if ok { row } else { rows - 1 };
        let p = unsafe { src.add((sr * D + c * 8) as usize) };
        unsafe {
            cp_async::copy_16_zfill(dst + flash_chunk_offset(D * 2, r, c), p as *const u8, if ok { 16 } else { 0 })
        };
        e += FLASH_MMA_THREADS;
    }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(super) fn mma16<const F16: bool>(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    if F16 { mma::mma_m16n8k16_f16(a, b, c) } else { mma::mma_m16n8k16_bf16(a, b, c) }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(super) fn pack<const F16: bool>(lo: f32, hi: f32) -> u32 {
    if F16 { convert::pack_f16x2(lo, hi) } else { convert::pack_bf16x2(lo, hi) }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn flash_mma<const F16: bool, const D: u32, const KS: usize, const NO: usize>(
    q: *const u16,
    k: *const u16,
    v: *const u16,
    o: *mut u16,
    lse: DevicePtrMut<f32>,
    p: AttentionParams,
) {
    const BQ: u32 = FLASH_MMA_BQ;
    const BKV: u32 = FLASH_MMA_BKV;
    const NS: usize = (FLASH_MMA_BKV / 8) as usize; // n8 tiles of S per warp
    const { assert!(KS as u32 == D / 16 && NO as u32 == D / 8 && (D == 64 || D == 128)) };
    let row_bytes = D * 2;
    let tile_bytes = BKV * row_bytes;
    let (t, lane, w) = (thread::thread_idx_x(), thread::lane_id(), thread::warp_id());
    let (g, tq) = (lane / 4, lane % 4);
    let bh = thread::block_idx_y() as usize;
    let q0 = (thread::grid_dim_x() - 1 - thread::block_idx_x()) * BQ;
    let (q_len, kv_len) = (p.q_len, p.kv_len);
    let (qb, kb) = (bh * q_len as usize * D as usize, bh * kv_len as usize * D as usize);
    let smem = shared::dynamic_smem_addr();
    let q_tile = smem;
    let stage = |j: u32| smem + BQ * row_bytes + (j % 2) * 2 * tile_bytes;
    let n_keys = p.keys_for_rows(q0, BQ);
    let n_tiles = n_keys.div_ceil(BKV);
    let (qp, kp, vp) = unsafe { (q.add(qb), k.add(kb), v.add(kb)) };

    unsafe { copy_tile::<D, BQ>(qp, q_len, q0, q_tile, t) };
    cp_async::commit_group();
    if n_tiles > 0 {
        unsafe {
            copy_tile::<D, BKV>(kp, kv_len, 0, stage(0), t);
            copy_tile::<D, BKV>(vp, kv_len, 0, stage(0) + tile_bytes, t);
        }
    }
    cp_async::commit_group();
    cp_async::wait_group::<1>();
    sync::sync_threads();

    // the warp's Q fragments, kept for the whole loop
    let wrow = w * 16;
    let mut qf = [[0u32; 4]; KS];
    let mut ks = 0;
    while ks < KS {
        let a = q_tile + flash_chunk_offset(row_bytes, wrow + lane % 16, 2 * ks as u32 + lane / 16);
        qf[ks] = unsafe { matrix::ldmatrix_x4(a) };
        ks += 1;
    }

    let scale_log2 = p.scale * core::f32::consts::LOG2_E;
    let mut m = [f32::NEG_INFINITY; 2];
    let mut l = [0.0f32; 2];
    let mut acc = [[0.0f32; 4]; NO];
    let rows = [q0 + wrow + g, q0 + wrow + g + 8];

    let mut j = 0;
    while j < n_tiles {
        if j + 1 < n_tiles {
            let next = stage(j + 1);
            unsafe {
                copy_tile::<D, BKV>(kp, kv_len, (j + 1) * BKV, next, t);
                copy_tile::<D, BKV>(vp, kv_len, (j + 1) * BKV, next + tile_bytes, t);
            }
        }
        cp_async::commit_group();
        cp_async::wait_group::<1>();
        sync::sync_threads();
        let (kt, vt) = (stage(j), stage(j) + tile_bytes);
        let k0 = j * BKV;

        // S = Q K^T, 16 x 64 per warp
        let mut s = [[0.0f32; 4]; NS];
        let mut ks = 0;
        while ks < KS {
            let mut np = 0;
            while np < NS / 2 {
                let key = np as u32 * 16 + lane % 8 + (lane / 16) * 8;
                let b = unsafe {
                    matrix::ldmatrix_x4(kt + flash_chunk_offset(row_bytes, key, 2 * ks as u32 + (lane / 8) % 2))
                };
                s[2 * np] = mma16::<F16>(qf[ks], [b[0], b[1]], s[2 * np]);
                s[2 * np + 1] = mma16::<F16>(qf[ks], [b[2], b[3]], s[2 * np + 1]);
                np += 1;
            }
            ks += 1;
        }
        if p.tile_needs_mask(q0, k0, BKV) {
            let vis = [p.visible_keys(rows[0]), p.visible_keys(rows[1])];
            let mut nt = 0;
            while nt < NS {
                let mut i = 0;
                while i < 4 {
                    // element i is in row g + 8 (i / 2), column 2 tq + i % 2 of its n8 tile
                    let c = mma::m16n8_c(lane, i as u32).1;
                    if k0 + nt as u32 * 8 + c >= vis[i / 2] {
                        s[nt][i] = f32::NEG_INFINITY;
                    }
                    i += 1;
                }
                nt += 1;
            }
        }

        // online softmax, rows g (h = 0) and g + 8 (h = 1)
        let mut h = 0;
        while h < 2 {
            let mut mx = f32::NEG_INFINITY;
            let mut nt = 0;
            while nt < NS {
                mx = mx.max(s[nt][2 * h]).max(s[nt][2 * h + 1]);
                nt += 1;
            }
            mx = mx.max(warp::shfl_xor_f32(warp::FULL_MASK, mx, 1));
            mx = mx.max(warp::shfl_xor_f32(warp::FULL_MASK, mx, 2));
            let m_new = m[h].max(mx * scale_log2);
            let m_use = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
            let alpha = math::exp2_fast(m[h] - m_use);
            let mut sum = 0.0f32;
            let mut nt = 0;
            while nt < NS {
                let e0 = math::exp2_fast(math::fma(s[nt][2 * h], scale_log2, -m_use));
                let e1 = math::exp2_fast(math::fma(s[nt][2 * h + 1], scale_log2, -m_use));
                s[nt][2 * h] = e0;
                s[nt][2 * h + 1] = e1;
                sum += e0 + e1;
                nt += 1;
            }
            l[h] = l[h] * alpha + sum;
            m[h] = m_new;
            let mut n = 0;
            while n < NO {
                acc[n][2 * h] *= alpha;
                acc[n][2 * h + 1] *= alpha;
                n += 1;
            }
            h += 1;
        }

        // O += P V: two n8 tiles of S are one A fragment of P
        let mut kk = 0;
        while kk < NS / 2 {
            let (s0, s1) = (s[2 * kk], s[2 * kk + 1]);
            let pa = [
                pack::<F16>(s0[0], s0[1]),
                pack::<F16>(s0[2], s0[3]),
                pack::<F16>(s1[0], s1[1]),
                pack::<F16>(s1[2], s1[3]),
            ];
            let key = kk as u32 * 16 + lane % 8 + ((lane / 8) % 2) * 8;
            let mut dp = 0;
            while dp < NO / 2 {
                let b = unsafe {
                    matrix::ldmatrix_x4_trans(vt + flash_chunk_offset(row_bytes, key, 2 * dp as u32 + lane / 16))
                };
                acc[2 * dp] = mma16::<F16>(pa, [b[0], b[1]], acc[2 * dp]);
                acc[2 * dp + 1] = mma16::<F16>(pa, [b[2], b[3]], acc[2 * dp + 1]);
                dp += 1;
            }
            kk += 1;
        }
        // every warp is done with this stage before the next iteration refills it
        sync::sync_threads();
        j += 1;
    }
    cp_async::wait_all();
    // every thread's copies have landed before a warp reuses its rows of the owned tile (a tile
    // that sees no keys skips the loop and its barriers)
    sync::sync_threads();

    // epilogue: O = o / l into the warp's own rows of the Q tile (which only this warp read, for
    // its fragments), then 16-byte stores
    sync::sync_warp(warp::FULL_MASK);
    let mut h = 0;
    while h < 2 {
        let mut lt = l[h];
        lt += warp::shfl_xor_f32(warp::FULL_MASK, lt, 1);
        lt += warp::shfl_xor_f32(warp::FULL_MASK, lt, 2);
        let inv = if lt > 0.0 { 1.0 / lt } else { 0.0 };
        let r = wrow + g + 8 * h as u32;
        let mut n = 0;
        while n < NO {
            let col = n as u32 * 8 + 2 * tq;
            let word = pack::<F16>(acc[n][2 * h] * inv, acc[n][2 * h + 1] * inv);
            let at = q_tile + flash_chunk_offset(row_bytes, r, col / 8) + (col % 8) * 2;
            unsafe { shared::st_shared_b32(at, word) };
            n += 1;
        }
        if tq == 0 && rows[h] < q_len {
            let v = if lt > 0.0 {
                (m[h] + math::ln(lt) * core::f32::consts::LOG2_E) * core::f32::consts::LN_2
            } else {
                f32::NEG_INFINITY
            };
            unsafe { lse.write(bh * q_len as usize + rows[h] as usize, v) };
        }
        h += 1;
    }
    sync::sync_warp(warp::FULL_MASK);
    let per_row = D / 8;
    let mut e = lane;
    while e < 16 * per_row {
        let (r, c) = (e / per_row, e % per_row);
        let row = q0 + wrow + r;
        if row < q_len {
            let x = unsafe { shared::ld_shared_v4(q_tile + flash_chunk_offset(row_bytes, wrow + r, c)) };
            let dst = unsafe { o.add(qb + (row * D + c * 8) as usize) } as *mut U32x4;
            unsafe { dst.write(U32x4(x)) };
        }
        e += 32;
    }
}

macro_rules! flash_mma_kernels {
    ($($(#[$doc:meta])+ $name:ident: $ty:ty, $f16:literal, $d:literal;)*) => {$(
        $(#[$doc])+
        ///
        /// Parameters: `q`, `k`, `v` (inputs, 16-byte aligned; see [`super::attention`] for the
        /// layout), `o` (output, the shape of `q`, 16-byte aligned), `lse` (`batch * heads * q_len`
        /// f32), `p` (the problem). Grid `(ceil(q_len / FLASH_MMA_BQ), batch * heads)`; block
        /// [`FLASH_MMA_THREADS`]; dynamic shared memory `flash_mma_smem_bytes(head_dim)`. Tiling and
        /// thread mapping: the module docs.
        #[kernel(max_threads = 128)]
        pub unsafe fn $name(
            q: DevicePtr<$ty>,
            k: DevicePtr<$ty>,
            v: DevicePtr<$ty>,
            o: DevicePtrMut<$ty>,
            lse: DevicePtrMut<f32>,
            p: AttentionParams,
        ) {
            unsafe {
                flash_mma::<$f16, $d, { $d / 16 }, { $d / 8 }>(
                    q.as_ptr() as *const u16,
                    k.as_ptr() as *const u16,
                    v.as_ptr() as *const u16,
                    o.as_mut_ptr() as *mut u16,
                    lse,
                    p,
                )
            }
        }
    )*};
}

flash_mma_kernels! {
    /// FlashAttention-2 forward on `mma.sync`, bf16 in and out (f32 accumulation), head dim 64.
    flash_fwd_mma_bf16_d64: bf16, false, 64;
    /// FlashAttention-2 forward on `mma.sync`, bf16 in and out (f32 accumulation), head dim 128.
    flash_fwd_mma_bf16_d128: bf16, false, 128;
    /// FlashAttention-2 forward on `mma.sync`, f16 in and out (f32 accumulation), head dim 64.
    flash_fwd_mma_f16_d64: f16, true, 64;
    /// FlashAttention-2 forward on `mma.sync`, f16 in and out (f32 accumulation), head dim 128.
    flash_fwd_mma_f16_d128: f16, true, 128;
}
