//! Flash attention, rung 1: the tiled online softmax on CUDA cores, plainly.
//!
//! One block of [`FLASH_SIMT_THREADS`] threads owns [`FLASH_SIMT_BQ`] query rows of one (batch,
//! head): thread `t` owns row `q0 + t`, its running maximum `m`, its running sum `l` and its output
//! row `o[D]` in registers. The block walks the keys in tiles of [`FLASH_SIMT_BK`]:
//!
//! 1. all threads copy the tile's K and V rows (coalesced, widened to f32) into shared memory;
//! 2. each thread computes its row's `BK` scores `s_j = scale q . k_j` (its Q row from shared
//!    memory, 16 bytes at a time; every thread reads the same K element, a broadcast), masks keys
//!    past `kv_len` or above the causal diagonal with `-inf`;
//! 3. the online softmax: `m' = max(m, max_j s_j)`, `o *= e^(m - m')`, `l = l e^(m - m') +
//!    sum_j e^(s_j - m')`, and `o += sum_j e^(s_j - m') v_j` (its `p_j` through shared memory, the
//!    V row a broadcast).
//!
//! At the end `O = o / l` is staged through shared memory (the Q tile's rows) and stored
//! coalesced; the log-sum-exp `m + ln l` goes to `lse`. With the causal mask the block stops at
//! the last key its last row sees (tiles above the diagonal are skipped).
//!
//! Shared memory: Q `BQ x (D + 4)` f32 (rows padded by 16 bytes: conflict-free 16-byte reads),
//! K and V `BK x D` f32 each, P `BK x BQ` f32. Grid `(ceil(q_len / BQ), batch * heads)`.

use super::attention::AttentionParams;
use crate::{DevicePtr, DevicePtrMut, kernel};
use crate::{math, shared, sync, thread};
use half::bf16;

/// Query rows per block (one per thread).
pub const FLASH_SIMT_BQ: u32 = 64;
/// Threads per block.
pub const FLASH_SIMT_THREADS: u32 = FLASH_SIMT_BQ;
/// Keys per tile.
pub const FLASH_SIMT_BK: u32 = 32;

/// Dynamic shared memory of the rung-1 kernel for head dim `d`: Q (padded), K, V and P in f32.
pub const fn flash_simt_smem_bytes(d: u32) -> u32 {
    (FLASH_SIMT_BQ * (d + 4) + 2 * FLASH_SIMT_BK * d + FLASH_SIMT_BK * FLASH_SIMT_BQ) * 4
}

/// An element type the rung-1 kernel reads and writes: loaded as f32, stored from f32.
pub trait SimtElement: Copy + 'static {
    /// Element `i` of `p`, widened to f32.
    ///
    /// # Safety
    /// `p.add(i)` must be readable device memory.
    unsafe fn load(p: *const Self, i: usize) -> f32;
    /// Rounds `v` and stores it at element `i` of `p`.
    ///
    /// # Safety
    /// `p.add(i)` must be writable device memory.
    unsafe fn store(p: *mut Self, i: usize, v: f32);
}

impl SimtElement for f32 {
    #[inline(always)]
    unsafe fn load(p: *const Self, i: usize) -> f32 {
        unsafe { *p.add(i) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut Self, i: usize, v: f32) {
        unsafe { *p.add(i) = v }
    }
}

impl SimtElement for bf16 {
    #[inline(always)]
    unsafe fn load(p: *const Self, i: usize) -> f32 {
        crate::convert::bf16_bits_to_f32(unsafe { *(p as *const u16).add(i) })
    }
    #[inline(always)]
    unsafe fn store(p: *mut Self, i: usize, v: f32) {
        #[cfg(target_arch = "nvptx64")]
        unsafe {
            *(p as *mut u16).add(i) = crate::convert::f32_to_bf16_bits(v)
        };
        #[cfg(not(target_arch = "nvptx64"))]
        let _ = (p, i, v);
    }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn flash_simt<T: SimtElement, const D: usize>(
    q: *const T,
    k: *const T,
    v: *const T,
    o: *mut T,
    lse: DevicePtrMut<f32>,
    p: AttentionParams,
) {
    const BQ: u32 = FLASH_SIMT_BQ;
    const BK: u32 = FLASH_SIMT_BK;
    let d = D as u32;
    let qs_row = d + 4; // padded Q row, in f32
    let t = thread::thread_idx_x();
    let bh = thread::block_idx_y() as usize;
    // the longest blocks (most keys, with the mask) first
    let q0 = (thread::grid_dim_x() - 1 - thread::block_idx_x()) * BQ;
    let (q_len, kv_len) = (p.q_len, p.kv_len);
    let (qb, kb) = (bh * q_len as usize * D, bh * kv_len as usize * D);
    let smem = shared::dynamic_smem_addr();
    let q_s: *mut f32 = shared::dynamic_smem(0);
    let k_off = BQ * qs_row * 4;
    let v_off = k_off + BK * d * 4;
    let p_off = v_off + BK * d * 4;
    let k_s: *mut f32 = shared::dynamic_smem(k_off as usize);
    let v_s: *mut f32 = shared::dynamic_smem(v_off as usize);
    let p_s: *mut f32 = shared::dynamic_smem(p_off as usize);

    // Q tile, coalesced; rows past q_len are zeros
    let mut e = t;
    while e < BQ * d {
        let (r, c) = (e / d, e % d);
        let row = q0 + r;
        let x = if row < q_len { unsafe { T::load(q, qb + (row * d + c) as usize) } } else { 0.0 };
        unsafe { *q_s.add((r * qs_row + c) as usize) = x };
        e += BQ;
    }

    let row = q0 + t;
    let visible = p.visible_keys(row);
    let n_keys = p.keys_for_rows(q0, BQ);
    let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
    let mut acc = [0.0f32; D];
    let q_row = smem + t * qs_row * 4;
    let mut k0 = 0;
    while k0 < n_keys {
        sync::sync_threads(); // the previous tile is consumed (and, first time, Q is written)
        let mut e = t;
        while e < BK * d {
            let (r, c) = (e / d, e % d);
            let key = k0 + r;
            let (kx, vx) = if key < kv_len {
                let i = kb + (key * d + c) as usize;
                unsafe { (T::load(k, i), T::load(v, i)) }
            } else {
                (0.0, 0.0)
            };
            unsafe {
                *k_s.add(e as usize) = kx;
                *v_s.add(e as usize) = vx;
            }
            e += BQ;
        }
        sync::sync_threads();

        // scores of this thread's row against the tile's keys
        let mut s = [0.0f32; BK as usize];
        let mut c4 = 0;
        while c4 < d / 4 {
            let qv = unsafe { shared::ld_shared_v4(q_row + c4 * 16) };
            let mut j = 0;
            while j < BK as usize {
                let kv = unsafe { shared::ld_shared_v4(smem + k_off + (j as u32 * d + c4 * 4) * 4) };
                let mut x = s[j];
                let mut i = 0;
                while i < 4 {
                    x = math::fma(f32::from_bits(qv[i]), f32::from_bits(kv[i]), x);
                    i += 1;
                }
                s[j] = x;
                j += 1;
            }
            c4 += 1;
        }
        let mut tile_max = f32::NEG_INFINITY;
        let mut j = 0;
        while j < BK as usize {
            s[j] = if k0 + (j as u32) < visible { s[j] * p.scale } else { f32::NEG_INFINITY };
            tile_max = tile_max.max(s[j]);
            j += 1;
        }
        let m_new = m.max(tile_max);
        // a row that has seen no key yet keeps m = -inf: subtract 0 instead, so every p is 0
        let m_use = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
        let alpha = math::exp_fast(m - m_use);
        let mut sum = 0.0f32;
        let mut j = 0;
        while j < BK as usize {
            let pj = math::exp_fast(s[j] - m_use);
            sum += pj;
            unsafe { *p_s.add(j * BQ as usize + t as usize) = pj };
            j += 1;
        }
        l = l * alpha + sum;
        m = m_new;
        let mut c = 0;
        while c < D {
            acc[c] *= alpha;
            c += 1;
        }
        // o += sum_j p_j v_j: p_j from shared memory (own column), V row j a broadcast
        let mut j = 0;
        while j < BK {
            let pj = unsafe { *p_s.add((j * BQ + t) as usize) };
            let mut c4 = 0;
            while c4 < D / 4 {
                let vv = unsafe { shared::ld_shared_v4(smem + v_off + (j * d + c4 as u32 * 4) * 4) };
                let mut i = 0;
                while i < 4 {
                    acc[c4 * 4 + i] = math::fma(pj, f32::from_bits(vv[i]), acc[c4 * 4 + i]);
                    i += 1;
                }
                c4 += 1;
            }
            j += 1;
        }
        k0 += BK;
    }

    // O = o / l through the Q tile's rows, then coalesced stores; a row that saw no key gets 0
    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
    sync::sync_threads();
    let mut c = 0;
    while c < D {
        unsafe { *q_s.add((t * qs_row) as usize + c) = acc[c] * inv };
        c += 1;
    }
    if row < q_len {
        let lse_v = if l > 0.0 { m + math::ln(l) } else { f32::NEG_INFINITY };
        unsafe { lse.write(bh * q_len as usize + row as usize, lse_v) };
    }
    sync::sync_threads();
    let mut e = t;
    while e < BQ * d {
        let (r, c) = (e / d, e % d);
        if q0 + r < q_len {
            let x = unsafe { *q_s.add((r * qs_row + c) as usize) };
            unsafe { T::store(o, qb + ((q0 + r) * d + c) as usize, x) };
        }
        e += BQ;
    }
}

macro_rules! flash_simt_kernels {
    ($($(#[$doc:meta])+ $name:ident: $ty:ty, $d:literal;)*) => {$(
        $(#[$doc])+
        ///
        /// Parameters: `q`, `k`, `v` (inputs, see [`super::attention`] for the layout), `o` (output,
        /// the shape of `q`), `lse` (`batch * heads * q_len` f32), `p` (the problem). Grid
        /// `(ceil(q_len / FLASH_SIMT_BQ), batch * heads)`; block [`FLASH_SIMT_THREADS`]; dynamic shared
        /// memory `flash_simt_smem_bytes(head_dim)`. Tiling and thread mapping: the module docs.
        #[kernel(max_threads = 64)]
        pub unsafe fn $name(
            q: DevicePtr<$ty>,
            k: DevicePtr<$ty>,
            v: DevicePtr<$ty>,
            o: DevicePtrMut<$ty>,
            lse: DevicePtrMut<f32>,
            p: AttentionParams,
        ) {
            unsafe { flash_simt::<$ty, $d>(q.as_ptr(), k.as_ptr(), v.as_ptr(), o.as_mut_ptr(), lse, p) }
        }
    )*};
}

flash_simt_kernels! {
    /// Flash attention forward on CUDA cores, f32 in and out, head dim 64.
    flash_fwd_simt_f32_d64: f32, 64;
    /// Flash attention forward on CUDA cores, f32 in and out, head dim 128.
    flash_fwd_simt_f32_d128: f32, 128;
    /// Flash attention forward on CUDA cores, bf16 in and out (f32 math), head dim 64.
    flash_fwd_simt_bf16_d64: bf16, 64;
    /// Flash attention forward on CUDA cores, bf16 in and out (f32 math), head dim 128.
    flash_fwd_simt_bf16_d128: bf16, 128;
}
