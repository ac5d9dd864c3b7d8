//! Flash attention backward, rung 1: FlashAttention-2's backward on CUDA cores, deterministic (no
//! atomics: every gradient row is owned by one thread, its terms summed in a fixed order).
//!
//! The probabilities are recomputed from the forward's log-sum-exp: `p_ij = e^(scale q_i . k_j -
//! lse_i)`. With `delta_i = dO_i . O_i`:
//!
//! ```text
//! dV_j = sum_i p_ij dO_i      dS_ij = p_ij (dO_i . V_j - delta_i)
//! dQ_i = scale sum_j dS_ij K_j      dK_j = scale sum_i dS_ij Q_i
//! ```
//!
//! One generic body runs three passes ([`BwdMode`]), each a kernel in which a thread owns one row
//! of the gradient it computes and keeps it (`D` f32) in registers, as the forward rung does:
//!
//! - `Dq`: a block of [`FLASH_BWD_ROWS`] threads owns that many query rows (Q and dO rows in
//!   shared memory, padded by 16 bytes); it walks the keys in tiles of [`FLASH_BWD_TILE`] (K and V
//!   in shared memory, read as broadcasts), first computing `delta_i` from its O and dO rows (and
//!   writing it for the other passes);
//! - `Dk` and `Dv`: a block owns 64 key rows (K and V rows) and walks the query tiles that see them
//!   (Q, dO, the log-sum-exp and delta in shared memory). `Dk` reads the `delta` the `Dq` pass
//!   wrote, so `Dq` runs first.
//!
//! Per tile a thread computes its 32 scores (then `p`), for `Dq` and `Dk` its 32 `dO . V` (then
//! `dS`), writes the 32 weights to its column of a shared array, and adds the weighted tile rows
//! (K for `Dq`, Q for `Dk`, dO for `Dv`) to its accumulator. Masked pairs (past
//! the lengths, above the causal diagonal) get weight 0. The result is staged through shared memory
//! and stored coalesced. Grid `(ceil(rows / 64), batch * heads)` with rows `q_len` for `Dq`,
//! `kv_len` otherwise; block 64; dynamic shared memory [`flash_bwd_smem_bytes`].

use super::attention::AttentionParams;
use super::flash_simt::SimtElement;
use crate::{DevicePtr, DevicePtrMut, kernel};
use crate::{math, shared, sync, thread};
use half::bf16;

/// Gradient rows per block (one per thread).
pub const FLASH_BWD_ROWS: u32 = 64;
/// Threads per block.
pub const FLASH_BWD_THREADS: u32 = FLASH_BWD_ROWS;
/// Rows per tile of the other side.
pub const FLASH_BWD_TILE: u32 = 32;

/// Which gradient a backward kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BwdMode {
    /// dQ (and delta).
    Dq,
    /// dK.
    Dk,
    /// dV.
    Dv,
}

/// Dynamic shared memory of a backward kernel at head dim `d`: two owned row blocks (padded), two
/// tiles, the weights, and the tile's log-sum-exp and delta.
pub const fn flash_bwd_smem_bytes(d: u32) -> u32 {
    (2 * FLASH_BWD_ROWS * (d + 4) + 2 * FLASH_BWD_TILE * d + FLASH_BWD_TILE * FLASH_BWD_ROWS + 2 * FLASH_BWD_TILE) * 4
}

/// The backward kernels' pointers.
#[cfg(target_arch = "nvptx64")]
#[derive(Clone, Copy)]
struct Ptrs<T> {
    q: *const T,
    k: *const T,
    v: *const T,
    o: *const T,
    d_o: *const T,
    lse: *const f32,
    delta: *mut f32,
    out: *mut T,
}

/// Copies rows `row0..row0 + rows_tile` of a `[n, D]` matrix (`n` rows valid, the rest zero) into
/// shared memory at `dst` with rows of `stride` f32, widened to f32; `t` of `threads` threads.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn load_rows<T: SimtElement>(
    src: *const T,
    n: u32,
    row0: u32,
    rows_tile: u32,
    d: u32,
    dst: *mut f32,
    stride: u32,
    t: u32,
) {
    let mut e = t;
    while e < rows_tile * d {
        let (r, c) = (e / d, e % d);
        let x = if row0 + r < n { unsafe { T::load(src, ((row0 + r) * d + c) as usize) } } else { 0.0 };
        unsafe { *dst.add((r * stride + c) as usize) = x };
        e += FLASH_BWD_THREADS;
    }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn flash_bwd<T: SimtElement, const D: usize>(mode: BwdMode, ptr: Ptrs<T>, p: AttentionParams) {
    const R: u32 = FLASH_BWD_ROWS;
    const TL: u32 = FLASH_BWD_TILE;
    let d = D as u32;
    let stride = d + 4;
    let t = thread::thread_idx_x();
    let bh = thread::block_idx_y() as usize;
    let r0 = (thread::grid_dim_x() - 1 - thread::block_idx_x()) * R;
    let (q_len, kv_len) = (p.q_len, p.kv_len);
    let (qb, kb) = (bh * q_len as usize * D, bh * kv_len as usize * D);
    let lb = bh * q_len as usize;
    let by_query = mode == BwdMode::Dq;
    let smem = shared::dynamic_smem_addr();
    let own_a: *mut f32 = shared::dynamic_smem(0);
    let own_b_off = R * stride * 4;
    let own_b: *mut f32 = shared::dynamic_smem(own_b_off as usize);
    let ta_off = 2 * R * stride * 4;
    let tb_off = ta_off + TL * d * 4;
    let w_off = tb_off + TL * d * 4;
    let lse_off = w_off + TL * R * 4;
    let ta: *mut f32 = shared::dynamic_smem(ta_off as usize);
    let tb: *mut f32 = shared::dynamic_smem(tb_off as usize);
    let w_s: *mut f32 = shared::dynamic_smem(w_off as usize);
    let lse_s: *mut f32 = shared::dynamic_smem(lse_off as usize);
    let delta_s: *mut f32 = shared::dynamic_smem((lse_off + TL * 4) as usize);

    // the owned rows: Q and dO (dQ), K and V (dK, dV)
    let (own_n, a_src, b_src) = if by_query {
        (q_len, unsafe { ptr.q.add(qb) }, unsafe { ptr.d_o.add(qb) })
    } else {
        (kv_len, unsafe { ptr.k.add(kb) }, unsafe { ptr.v.add(kb) })
    };
    unsafe {
        load_rows(a_src, own_n, r0, R, d, own_a, stride, t);
        load_rows(b_src, own_n, r0, R, d, own_b, stride, t);
    }
    sync::sync_threads();
    let row = r0 + t;
    let a_row = smem + t * stride * 4;
    let b_row = smem + own_b_off + t * stride * 4;

    // dQ: the row's log-sum-exp and delta = dO . O (written for the dK pass)
    let (mut my_lse, mut my_delta) = (0.0f32, 0.0f32);
    if by_query && row < q_len {
        my_lse = unsafe { *ptr.lse.add(lb + row as usize) };
        let mut c = 0;
        while c < d {
            let o = unsafe { T::load(ptr.o, qb + (row * d + c) as usize) };
            my_delta = math::fma(unsafe { *own_b.add((t * stride + c) as usize) }, o, my_delta);
            c += 1;
        }
        unsafe { *ptr.delta.add(lb + row as usize) = my_delta };
    }

    // the other side's range: keys the block's queries see, or queries that see the block's keys
    let (begin, end) = if by_query {
        (0, p.keys_for_rows(r0, R))
    } else if p.causal != 0 {
        let first = r0 as i64 - (kv_len as i64 - q_len as i64);
        let first = if first < 0 {
            0
        } else if first > q_len as i64 {
            q_len
        } else {
            first as u32
        };
        (first / TL * TL, q_len)
    } else {
        (0, q_len)
    };
    let mut acc = [0.0f32; D];
    let mut x0 = begin;
    while x0 < end {
        sync::sync_threads(); // the previous tile is consumed
        let (tn, ta_src, tb_src) = if by_query {
            (kv_len, unsafe { ptr.k.add(kb) }, unsafe { ptr.v.add(kb) })
        } else {
            (q_len, unsafe { ptr.q.add(qb) }, unsafe { ptr.d_o.add(qb) })
        };
        unsafe {
            load_rows(ta_src, tn, x0, TL, d, ta, d, t);
            load_rows(tb_src, tn, x0, TL, d, tb, d, t);
        }
        if !by_query && t < TL {
            let i = x0 + t;
            let (l, dl) = if i < q_len {
                (
                    unsafe { *ptr.lse.add(lb + i as usize) },
                    if mode == BwdMode::Dk { unsafe { *ptr.delta.add(lb + i as usize) } } else { 0.0 },
                )
            } else {
                (0.0, 0.0)
            };
            unsafe {
                *lse_s.add(t as usize) = l;
                *delta_s.add(t as usize) = dl;
            }
        }
        sync::sync_threads();

        // p for the row against the tile: scores own_a . tile_a
        let mut s = [0.0f32; TL as usize];
        dot_rows::<D>(a_row, smem + ta_off, &mut s);
        let mut j = 0;
        while j < TL as usize {
            let x = x0 + j as u32;
            let (qi, kj) = if by_query { (row, x) } else { (x, row) };
            let seen = qi < q_len && kj < kv_len && kj < p.visible_keys(qi);
            let l = if by_query { my_lse } else { unsafe { *lse_s.add(j) } };
            s[j] = if seen { math::exp_fast(s[j] * p.scale - l) } else { 0.0 };
            j += 1;
        }
        // p to the row's column of the weights; then, for dQ and dK, the same registers for
        // dO_i . V_j (own_b . tile_b either way) and the weights become dS times the scale
        let mut j = 0;
        while j < TL as usize {
            unsafe { *w_s.add(j * R as usize + t as usize) = s[j] };
            j += 1;
        }
        if mode != BwdMode::Dv {
            let mut j = 0;
            while j < TL as usize {
                s[j] = 0.0;
                j += 1;
            }
            dot_rows::<D>(b_row, smem + tb_off, &mut s);
            let mut j = 0;
            while j < TL as usize {
                let dl = if by_query { my_delta } else { unsafe { *delta_s.add(j) } };
                let at = unsafe { w_s.add(j * R as usize + t as usize) };
                unsafe { *at = *at * (s[j] - dl) * p.scale };
                j += 1;
            }
        }
        // acc += sum_j w_j (tile row j): K (dQ), Q (dK), dO (dV)
        let src = if mode == BwdMode::Dv { smem + tb_off } else { smem + ta_off };
        let mut j = 0;
        while j < TL {
            let wj = unsafe { *w_s.add((j * R + t) as usize) };
            let mut c4 = 0;
            while c4 < D / 4 {
                let x = unsafe { shared::ld_shared_v4(src + (j * d + c4 as u32 * 4) * 4) };
                let mut i = 0;
                while i < 4 {
                    acc[c4 * 4 + i] = math::fma(wj, f32::from_bits(x[i]), acc[c4 * 4 + i]);
                    i += 1;
                }
                c4 += 1;
            }
            j += 1;
        }
        x0 += TL;
    }

    // the gradient rows through the owned A rows, then coalesced stores
    sync::sync_threads();
    let mut c = 0;
    while c < D {
        unsafe { *own_a.add((t * stride) as usize + c) = acc[c] };
        c += 1;
    }
    sync::sync_threads();
    let base = if by_query { qb } else { kb };
    let mut e = t;
    while e < R * d {
        let (r, c) = (e / d, e % d);
        if r0 + r < own_n {
            let x = unsafe { *own_a.add((r * stride + c) as usize) };
            unsafe { T::store(ptr.out, base + ((r0 + r) * d + c) as usize, x) };
        }
        e += R;
    }
}

/// `out[j] = sum_c row[c] tile[j][c]` for the `FLASH_BWD_TILE` rows of a tile: `row` a padded
/// shared row (16-byte reads), the tile's rows read as broadcasts.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn dot_rows<const D: usize>(
    row: shared::SharedAddr,
    tile: shared::SharedAddr,
    out: &mut [f32; FLASH_BWD_TILE as usize],
) {
    let d = D as u32;
    let mut c4 = 0;
    while c4 < d / 4 {
        let a = unsafe { shared::ld_shared_v4(row + c4 * 16) };
        let mut j = 0;
        while j < FLASH_BWD_TILE as usize {
            let b = unsafe { shared::ld_shared_v4(tile + (j as u32 * d + c4 * 4) * 4) };
            let mut x = out[j];
            let mut i = 0;
            while i < 4 {
                x = math::fma(f32::from_bits(a[i]), f32::from_bits(b[i]), x);
                i += 1;
            }
            out[j] = x;
            j += 1;
        }
        c4 += 1;
    }
}

macro_rules! flash_bwd_kernels {
    ($($(#[$doc:meta])+ $name:ident: $ty:ty, $mode:ident, $d:literal;)*) => {$(
        $(#[$doc])+
        ///
        /// Parameters: `q`, `k`, `v`, `o`, `d_o` (the forward's inputs and output and the output's
        /// gradient), `lse` (the forward's log-sum-exp), `delta` (`batch * heads * q_len` f32:
        /// written by the dQ pass, read by the dK pass), `out` (the gradient), `p`. Grid
        /// `(ceil(rows / FLASH_BWD_ROWS), batch * heads)`; block [`FLASH_BWD_THREADS`]; dynamic
        /// shared memory `flash_bwd_smem_bytes(head_dim)`. See the module docs.
        #[kernel(max_threads = 64)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name(
            q: DevicePtr<$ty>,
            k: DevicePtr<$ty>,
            v: DevicePtr<$ty>,
            o: DevicePtr<$ty>,
            d_o: DevicePtr<$ty>,
            lse: DevicePtr<f32>,
            delta: DevicePtrMut<f32>,
            out: DevicePtrMut<$ty>,
            p: AttentionParams,
        ) {
            let ptr = Ptrs {
                q: q.as_ptr(),
                k: k.as_ptr(),
                v: v.as_ptr(),
                o: o.as_ptr(),
                d_o: d_o.as_ptr(),
                lse: lse.as_ptr(),
                delta: delta.as_mut_ptr(),
                out: out.as_mut_ptr(),
            };
            unsafe { flash_bwd::<$ty, $d>(BwdMode::$mode, ptr, p) }
        }
    )*};
}

flash_bwd_kernels! {
    /// Flash attention backward on CUDA cores, dQ and delta, f32, head dim 64.
    flash_bwd_dq_simt_f32_d64: f32, Dq, 64;
    /// Flash attention backward on CUDA cores, dQ and delta, f32, head dim 128.
    flash_bwd_dq_simt_f32_d128: f32, Dq, 128;
    /// Flash attention backward on CUDA cores, dK, f32, head dim 64.
    flash_bwd_dk_simt_f32_d64: f32, Dk, 64;
    /// Flash attention backward on CUDA cores, dK, f32, head dim 128.
    flash_bwd_dk_simt_f32_d128: f32, Dk, 128;
    /// Flash attention backward on CUDA cores, dV, f32, head dim 64.
    flash_bwd_dv_simt_f32_d64: f32, Dv, 64;
    /// Flash attention backward on CUDA cores, dV, f32, head dim 128.
    flash_bwd_dv_simt_f32_d128: f32, Dv, 128;
    /// Flash attention backward on CUDA cores, dQ and delta, bf16 in and out (f32 math), head dim 64.
    flash_bwd_dq_simt_bf16_d64: bf16, Dq, 64;
    /// Flash attention backward on CUDA cores, dQ and delta, bf16 in and out, head dim 128.
    flash_bwd_dq_simt_bf16_d128: bf16, Dq, 128;
    /// Flash attention backward on CUDA cores, dK, bf16 in and out, head dim 64.
    flash_bwd_dk_simt_bf16_d64: bf16, Dk, 64;
    /// Flash attention backward on CUDA cores, dK, bf16 in and out, head dim 128.
    flash_bwd_dk_simt_bf16_d128: bf16, Dk, 128;
    /// Flash attention backward on CUDA cores, dV, bf16 in and out, head dim 64.
    flash_bwd_dv_simt_bf16_d64: bf16, Dv, 64;
    /// Flash attention backward on CUDA cores, dV, bf16 in and out, head dim 128.
    flash_bwd_dv_simt_bf16_d128: bf16, Dv, 128;
}
