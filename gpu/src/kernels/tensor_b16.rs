//! Tensor kernels for bf16 and f16 tensors: the CUDA backend's ops on 16-bit data, bf16 / f16 in
//! and out, f32 arithmetic inside (sums of many terms in f32 or f64, rounded once to the storage
//! type, nearest-even).
//!
//! Elements travel as their 16-bit patterns (`u16`). Each op is one generic `#[inline(always)]`
//! body over a `Half16` format (widen to f32 on load, round on store) and one monomorphic
//! `#[kernel]` per format (`unary_bf16`, `unary_f16`, ...). Ops that only move bits (strided copy,
//! fill, the argmax scatter, the embedding gather, the operand packing of the products) are one
//! kernel for both formats. The f32 kernels are in [`tensor_ops`](super::tensor_ops); the function
//! codes, parameter structs and block sizes are theirs.
//!
//! Every kernel reduces in a fixed order (no float atomics), so results are bit-reproducible for a
//! given launch configuration.

use super::convert::format;
use super::tensor_ops::{ROW_THREADS, ReduceDims, Strided2, offset_of, strided_offsets, welford_combine};
#[cfg(target_arch = "nvptx64")]
use super::tensor_ops::{apply_binary, apply_unary, block_reduce};
use crate::{DevicePtr, DevicePtrMut, convert, kernel, shared_array};
use crate::{math, sync, thread, warp};

/// A 16-bit float format of the typed kernels: how an element's bit pattern widens to f32 (exact)
/// and how an f32 rounds to it (nearest-even).
#[cfg(target_arch = "nvptx64")]
pub(crate) trait Half16 {
    /// The exact f32 value of `bits`.
    fn widen(bits: u16) -> f32;
    /// `v` rounded to nearest-even.
    fn narrow(v: f32) -> u16;
}

/// bfloat16 (a `Half16` format of the kernels).
pub struct Bf16;
/// IEEE half (a `Half16` format of the kernels).
pub struct F16;

#[cfg(target_arch = "nvptx64")]
impl Half16 for Bf16 {
    #[inline(always)]
    fn widen(bits: u16) -> f32 {
        convert::bf16_bits_to_f32(bits)
    }
    #[inline(always)]
    fn narrow(v: f32) -> u16 {
        convert::f32_to_bf16_bits(v)
    }
}

#[cfg(target_arch = "nvptx64")]
impl Half16 for F16 {
    #[inline(always)]
    fn widen(bits: u16) -> f32 {
        convert::f16_bits_to_f32(bits)
    }
    #[inline(always)]
    fn narrow(v: f32) -> u16 {
        (convert::pack_f16x2(v, 0.0) & 0xffff) as u16
    }
}

/// Element `i` of `p`, widened.
///
/// # Safety
/// `p` holds at least `i + 1` elements.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn ld<H: Half16>(p: DevicePtr<u16>, i: usize) -> f32 {
    H::widen(unsafe { p.read(i) })
}

/// Stores `v`, rounded, at element `i` of `p`.
///
/// # Safety
/// `p` holds at least `i + 1` elements.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn st<H: Half16>(p: DevicePtrMut<u16>, i: usize, v: f32) {
    unsafe { p.write(i, H::narrow(v)) }
}

/// Widens `bits` of the [`format`] code `f`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn widen_format(bits: u16, f: u32) -> f32 {
    if f == format::F16 { F16::widen(bits) } else { Bf16::widen(bits) }
}

/// Rounds `v` to the [`format`] code `f`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn narrow_format(v: f32, f: u32) -> u16 {
    if f == format::F16 { F16::narrow(v) } else { Bf16::narrow(v) }
}

// ---------------------------------------------------------------------------------------------
// Elementwise maps and copies: grid-stride over the output, one element per thread step.

/// `out[i] = f(x[i])` for the [`unary`](super::tensor_ops::unary) code `op` (scalar `s`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn unary<H: Half16>(x: DevicePtr<u16>, out: DevicePtrMut<u16>, n: u32, op: u32, s: f32) {
    let mut i = thread::global_idx_x();
    while i < n {
        unsafe { st::<H>(out, i as usize, apply_unary(op, ld::<H>(x, i as usize), s)) };
        i += thread::grid_stride_x();
    }
}

/// `out[i] = f(x[i])` on bf16 (`op`: a [`unary`](super::tensor_ops::unary) code, `s` the scalar
/// of the scalar codes). Grid-stride over the `n` elements, one per thread step.
#[kernel]
pub unsafe fn unary_bf16(x: DevicePtr<u16>, out: DevicePtrMut<u16>, n: u32, op: u32, s: f32) {
    unsafe { unary::<Bf16>(x, out, n, op, s) }
}

/// [`unary_bf16`] on f16.
#[kernel]
pub unsafe fn unary_f16(x: DevicePtr<u16>, out: DevicePtrMut<u16>, n: u32, op: u32, s: f32) {
    unsafe { unary::<F16>(x, out, n, op, s) }
}

/// `out[i] = a[i] (op) b[i]` for operands of the output's shape.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn binary_flat<H: Half16>(a: DevicePtr<u16>, b: DevicePtr<u16>, out: DevicePtrMut<u16>, n: u32, op: u32) {
    let mut i = thread::global_idx_x();
    while i < n {
        let (x, y) = unsafe { (ld::<H>(a, i as usize), ld::<H>(b, i as usize)) };
        unsafe { st::<H>(out, i as usize, apply_binary(op, x, y)) };
        i += thread::grid_stride_x();
    }
}

/// `out[i] = a[i] (op) b[i]` on bf16, no broadcasting (`op`: a
/// [`binary`](super::tensor_ops::binary) code). Grid-stride over the `n` elements.
#[kernel]
pub unsafe fn binary_flat_bf16(a: DevicePtr<u16>, b: DevicePtr<u16>, out: DevicePtrMut<u16>, n: u32, op: u32) {
    unsafe { binary_flat::<Bf16>(a, b, out, n, op) }
}

/// [`binary_flat_bf16`] on f16.
#[kernel]
pub unsafe fn binary_flat_f16(a: DevicePtr<u16>, b: DevicePtr<u16>, out: DevicePtrMut<u16>, n: u32, op: u32) {
    unsafe { binary_flat::<F16>(a, b, out, n, op) }
}

/// `out[i] = a[off_a(i)] (op) b[off_b(i)]` with broadcasting strides.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn binary<H: Half16>(a: DevicePtr<u16>, b: DevicePtr<u16>, out: DevicePtrMut<u16>, p: Strided2) {
    let mut i = thread::global_idx_x();
    while i < p.n {
        let (oa, ob) = strided_offsets(&p, i);
        let (x, y) = unsafe { (ld::<H>(a, oa as usize), ld::<H>(b, ob as usize)) };
        unsafe { st::<H>(out, i as usize, apply_binary(p.op, x, y)) };
        i += thread::grid_stride_x();
    }
}

/// `out[i] = a[off_a(i)] (op) b[off_b(i)]` on bf16 with broadcasting strides ([`Strided2`]).
/// Grid-stride over the `p.n` outputs.
#[kernel]
pub unsafe fn binary_bf16(a: DevicePtr<u16>, b: DevicePtr<u16>, out: DevicePtrMut<u16>, p: Strided2) {
    unsafe { binary::<Bf16>(a, b, out, p) }
}

/// [`binary_bf16`] on f16.
#[kernel]
pub unsafe fn binary_f16(a: DevicePtr<u16>, b: DevicePtr<u16>, out: DevicePtrMut<u16>, p: Strided2) {
    unsafe { binary::<F16>(a, b, out, p) }
}

/// `out[i] = x[off_a(i)]` for 16-bit elements of either format (bits copied): transposes,
/// broadcasts and copies. Grid-stride over the `p.n` outputs.
#[kernel]
pub unsafe fn strided_copy_b16(x: DevicePtr<u16>, out: DevicePtrMut<u16>, p: Strided2) {
    let mut i = thread::global_idx_x();
    while i < p.n {
        let (oa, _) = strided_offsets(&p, i);
        unsafe { out.write(i as usize, x.read(oa as usize)) };
        i += thread::grid_stride_x();
    }
}

/// `out[off_b(i)] = x[off_a(i)]` for 16-bit elements of either format (bits copied): the strided
/// write of views into a slice of a larger tensor (`cat`, the zero-padded gradient of `narrow`),
/// as `strided_scatter_f32`. The destination offsets must be distinct. Grid-stride over `p.n`.
#[kernel]
pub unsafe fn strided_scatter_b16(x: DevicePtr<u16>, out: DevicePtrMut<u16>, p: Strided2) {
    let mut i = thread::global_idx_x();
    while i < p.n {
        let (oa, ob) = strided_offsets(&p, i);
        unsafe { out.write(ob as usize, x.read(oa as usize)) };
        i += thread::grid_stride_x();
    }
}

/// `out[i] = bits` (the low 16 bits: a value already rounded by the host) for `n` elements.
/// Grid-stride.
#[kernel]
pub unsafe fn fill_b16(out: DevicePtrMut<u16>, n: u32, bits: u32) {
    let mut i = thread::global_idx_x();
    while i < n {
        unsafe { out.write(i as usize, bits as u16) };
        i += thread::grid_stride_x();
    }
}

/// `out[i] = src[i]` converted from the [`format`] code `from` to `to` (widened exactly to f32,
/// rounded once, nearest-even) for `n` values. Grid-stride.
#[kernel]
pub unsafe fn convert_b16(src: DevicePtr<u16>, out: DevicePtrMut<u16>, n: u32, from: u32, to: u32) {
    let mut i = thread::global_idx_x();
    while i < n {
        let v = widen_format(unsafe { src.read(i as usize) }, from);
        unsafe { out.write(i as usize, narrow_format(v, to)) };
        i += thread::grid_stride_x();
    }
}

/// Packs a 16-bit matrix into the operand rows of the tensor-core GEMMs (k-major, each row
/// zero-padded to `ld`), transposing when asked: the 16-bit sibling of
/// [`pack_bf16`](super::convert::pack_bf16), for bf16 / f16 tensors (bits copied, no rounding).
///
/// `src` is `rows x cols`, row-major. With `transpose == 0` the output is `rows` rows of `ld >=
/// cols`: `dst[r ld + c] = src[r cols + c]` for `c < cols`, 0 beyond. With `transpose == 1` it is
/// `cols` rows of `ld >= rows`: `dst[c ld + r] = src[r cols + c]` for `r < rows`, 0 beyond.
/// Grid-stride over the output, one element per thread step (rows * ld < 2^32).
#[kernel]
pub unsafe fn pack_b16(src: DevicePtr<u16>, dst: DevicePtrMut<u16>, rows: u32, cols: u32, ld: u32, transpose: u32) {
    let out_rows = if transpose != 0 { cols } else { rows };
    let n = out_rows * ld;
    let mut i = thread::global_idx_x();
    while i < n {
        let (r, c) = (i / ld, i % ld);
        let v = if transpose == 0 {
            if c < cols { unsafe { src.read((r * cols + c) as usize) } } else { 0 }
        } else if c < rows {
            unsafe { src.read((c * cols + r) as usize) }
        } else {
            0
        };
        unsafe { dst.write(i as usize, v) };
        i += thread::grid_stride_x();
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions, max, embedding.

/// Sums over dimensions ([`ReduceDims`]): one output per thread, its inputs added in row-major
/// order in f64 and rounded once (through f32) to the format.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn reduce_sum_dims<H: Half16>(x: DevicePtr<u16>, out: DevicePtrMut<u16>, p: ReduceDims) {
    let mut o = thread::global_idx_x();
    while o < p.out_n {
        let base = offset_of(&p.kept_dims, &p.kept_strides, o);
        let mut acc = 0.0f64;
        let mut r = 0;
        while r < p.red_n {
            acc += unsafe { ld::<H>(x, (base + offset_of(&p.red_dims, &p.red_strides, r)) as usize) } as f64;
            r += 1;
        }
        unsafe { st::<H>(out, o as usize, acc as f32) };
        o += thread::grid_stride_x();
    }
}

/// Sums of bf16 over dimensions ([`ReduceDims`]): one thread per output element (grid-stride),
/// adding its `p.red_n` inputs in row-major order in f64 and rounding once.
#[kernel]
pub unsafe fn reduce_sum_dims_bf16(x: DevicePtr<u16>, out: DevicePtrMut<u16>, p: ReduceDims) {
    unsafe { reduce_sum_dims::<Bf16>(x, out, p) }
}

/// [`reduce_sum_dims_bf16`] on f16.
#[kernel]
pub unsafe fn reduce_sum_dims_f16(x: DevicePtr<u16>, out: DevicePtrMut<u16>, p: ReduceDims) {
    unsafe { reduce_sum_dims::<F16>(x, out, p) }
}

/// The first maximum along the middle of (outer, len, inner) and its input offset (a NaN wins).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn max_dim<H: Half16>(
    x: DevicePtr<u16>,
    out: DevicePtrMut<u16>,
    argmax: DevicePtrMut<u32>,
    outer: u32,
    len: u32,
    inner: u32,
) {
    let mut o = thread::global_idx_x();
    while o < outer * inner {
        let (a, b) = (o / inner, o % inner);
        let mut best = a * len * inner + b;
        let mut bv = unsafe { ld::<H>(x, best as usize) };
        let mut j = 1;
        while j < len {
            let idx = (a * len + j) * inner + b;
            let v = unsafe { ld::<H>(x, idx as usize) };
            if v > bv || (v.is_nan() && !bv.is_nan()) {
                best = idx;
                bv = v;
            }
            j += 1;
        }
        unsafe {
            out.write(o as usize, x.read(best as usize));
            argmax.write(o as usize, best);
        }
        o += thread::grid_stride_x();
    }
}

/// Maximum of bf16 along one dimension: input viewed as (outer, len, inner); one thread per
/// (outer, inner) (grid-stride) writes the first maximum (its bits) and its input offset.
#[kernel]
pub unsafe fn max_dim_bf16(
    x: DevicePtr<u16>,
    out: DevicePtrMut<u16>,
    argmax: DevicePtrMut<u32>,
    outer: u32,
    len: u32,
    inner: u32,
) {
    unsafe { max_dim::<Bf16>(x, out, argmax, outer, len, inner) }
}

/// [`max_dim_bf16`] on f16.
#[kernel]
pub unsafe fn max_dim_f16(
    x: DevicePtr<u16>,
    out: DevicePtrMut<u16>,
    argmax: DevicePtrMut<u32>,
    outer: u32,
    len: u32,
    inner: u32,
) {
    unsafe { max_dim::<F16>(x, out, argmax, outer, len, inner) }
}

/// `gx[argmax[o]] = g[o]` for 16-bit elements (bits copied; `gx` zeroed first, the offsets
/// distinct). Grid-stride over the `n` gradients.
#[kernel]
pub unsafe fn scatter_argmax_b16(g: DevicePtr<u16>, argmax: DevicePtr<u32>, gx: DevicePtrMut<u16>, n: u32) {
    let mut o = thread::global_idx_x() as usize;
    while o < n as usize {
        unsafe { gx.write(argmax.read(o) as usize, g.read(o)) };
        o += thread::grid_stride_x() as usize;
    }
}

/// `out[p][c] = table[ids[p]][c]` for `n` positions of `d` 16-bit features (bits copied).
/// Grid-stride over n * d.
#[kernel]
pub unsafe fn embedding_gather_b16(table: DevicePtr<u16>, ids: DevicePtr<u32>, out: DevicePtrMut<u16>, n: u32, d: u32) {
    let mut i = thread::global_idx_x();
    while i < n * d {
        let (p, c) = (i / d, i % d);
        unsafe { out.write(i as usize, table.read((ids.read(p as usize) * d + c) as usize)) };
        i += thread::grid_stride_x();
    }
}

/// The deterministic embedding scatter-add, summed in f32 in position order and rounded once.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn embedding_scatter<H: Half16>(
    g: DevicePtr<u16>,
    order: DevicePtr<u32>,
    offsets: DevicePtr<u32>,
    gw: DevicePtrMut<u16>,
    v: u32,
    d: u32,
) {
    let mut i = thread::global_idx_x();
    while i < v * d {
        let (row, c) = (i / d, i % d);
        let (lo, hi) = unsafe { (offsets.read(row as usize), offsets.read(row as usize + 1)) };
        let mut acc = 0.0f32;
        let mut j = lo;
        while j < hi {
            acc += unsafe { ld::<H>(g, (order.read(j as usize) * d + c) as usize) };
            j += 1;
        }
        unsafe { st::<H>(gw, i as usize, acc) };
        i += thread::grid_stride_x();
    }
}

/// The embedding gradient on bf16: `gw[v][c] = sum of g[p][c]` over the positions with `ids[p] ==
/// v` in position order (the host's counting sort: `order`, with `offsets[v]..offsets[v + 1]` the
/// positions of row v), summed in f32 and rounded once. One thread per (v, c), grid-stride.
#[kernel]
pub unsafe fn embedding_scatter_bf16(
    g: DevicePtr<u16>,
    order: DevicePtr<u32>,
    offsets: DevicePtr<u32>,
    gw: DevicePtrMut<u16>,
    v: u32,
    d: u32,
) {
    unsafe { embedding_scatter::<Bf16>(g, order, offsets, gw, v, d) }
}

/// [`embedding_scatter_bf16`] on f16.
#[kernel]
pub unsafe fn embedding_scatter_f16(
    g: DevicePtr<u16>,
    order: DevicePtr<u32>,
    offsets: DevicePtr<u32>,
    gw: DevicePtrMut<u16>,
    v: u32,
    d: u32,
) {
    unsafe { embedding_scatter::<F16>(g, order, offsets, gw, v, d) }
}

// ---------------------------------------------------------------------------------------------
// Row kernels: one block of ROW_THREADS per row; thread t takes columns t, t + ROW_THREADS, ...

/// The maximum `m` of a row of `d` (starting at element `row`) and `sum exp(x - m)` in f32,
/// block-wide (every thread gets both). All threads of the block must call it.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn row_max_sum_exp<H: Half16>(x: DevicePtr<u16>, row: usize, d: u32) -> (f32, f32) {
    let t = thread::thread_idx_x();
    let mut m = f32::NEG_INFINITY;
    let mut c = t;
    while c < d {
        m = m.max(unsafe { ld::<H>(x, row + c as usize) });
        c += ROW_THREADS;
    }
    let m = block_reduce(m, true);
    let mut s = 0.0f32;
    c = t;
    while c < d {
        s += math::exp_fast(unsafe { ld::<H>(x, row + c as usize) } - m);
        c += ROW_THREADS;
    }
    (m, block_reduce(s, false))
}

/// Softmax or log-softmax of the block's row.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn softmax_rows<H: Half16>(x: DevicePtr<u16>, out: DevicePtrMut<u16>, d: u32, log: u32) {
    let row = (thread::block_idx_x() * d) as usize;
    let (m, s) = unsafe { row_max_sum_exp::<H>(x, row, d) };
    let (ls, inv) = (math::ln(s), 1.0 / s);
    let mut c = thread::thread_idx_x();
    while c < d {
        let v = unsafe { ld::<H>(x, row + c as usize) } - m;
        unsafe { st::<H>(out, row + c as usize, if log != 0 { v - ls } else { math::exp_fast(v) * inv }) };
        c += ROW_THREADS;
    }
}

/// Softmax (`log = 0`) or log-softmax (`log = 1`) of each bf16 row of `d`, in f32: one block of
/// [`ROW_THREADS`] per row (grid = rows): block max, block sum of exp(x - max), then the write.
#[kernel]
pub unsafe fn softmax_rows_bf16(x: DevicePtr<u16>, out: DevicePtrMut<u16>, d: u32, log: u32) {
    unsafe { softmax_rows::<Bf16>(x, out, d, log) }
}

/// [`softmax_rows_bf16`] on f16.
#[kernel]
pub unsafe fn softmax_rows_f16(x: DevicePtr<u16>, out: DevicePtrMut<u16>, d: u32, log: u32) {
    unsafe { softmax_rows::<F16>(x, out, d, log) }
}

/// The block's row loss `logsumexp(x) - x[target]`, in f32.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn cross_entropy_rows<H: Half16>(
    logits: DevicePtr<u16>,
    targets: DevicePtr<u32>,
    row_loss: DevicePtrMut<f32>,
    d: u32,
) {
    let r = thread::block_idx_x();
    let row = (r * d) as usize;
    let (m, s) = unsafe { row_max_sum_exp::<H>(logits, row, d) };
    if thread::thread_idx_x() == 0 {
        let target = unsafe { targets.read(r as usize) };
        unsafe { row_loss.write(r as usize, m + math::ln(s) - ld::<H>(logits, row + target as usize)) };
    }
}

/// Per-row cross-entropy `logsumexp(x) - x[target]` of bf16 logits rows of `d`, written in f32
/// (the host averages the row losses in f32 and rounds the mean once). One block of
/// [`ROW_THREADS`] per row.
#[kernel]
pub unsafe fn cross_entropy_rows_bf16(
    logits: DevicePtr<u16>,
    targets: DevicePtr<u32>,
    row_loss: DevicePtrMut<f32>,
    d: u32,
) {
    unsafe { cross_entropy_rows::<Bf16>(logits, targets, row_loss, d) }
}

/// [`cross_entropy_rows_bf16`] on f16.
#[kernel]
pub unsafe fn cross_entropy_rows_f16(
    logits: DevicePtr<u16>,
    targets: DevicePtr<u32>,
    row_loss: DevicePtrMut<f32>,
    d: u32,
) {
    unsafe { cross_entropy_rows::<F16>(logits, targets, row_loss, d) }
}

/// The block's row of `(softmax(x) - onehot(target)) * g[0] * inv_n`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn cross_entropy_backward_rows<H: Half16>(
    logits: DevicePtr<u16>,
    targets: DevicePtr<u32>,
    g: DevicePtr<u16>,
    grad: DevicePtrMut<u16>,
    d: u32,
    inv_n: f32,
) {
    let r = thread::block_idx_x();
    let row = (r * d) as usize;
    let scale = unsafe { ld::<H>(g, 0) } * inv_n;
    let target = unsafe { targets.read(r as usize) };
    let (m, s) = unsafe { row_max_sum_exp::<H>(logits, row, d) };
    let inv = 1.0 / s;
    let mut c = thread::thread_idx_x();
    while c < d {
        let p = math::exp_fast(unsafe { ld::<H>(logits, row + c as usize) } - m) * inv;
        let onehot = if c == target { 1.0 } else { 0.0 };
        unsafe { st::<H>(grad, row + c as usize, (p - onehot) * scale) };
        c += ROW_THREADS;
    }
}

/// The fused cross-entropy gradient of bf16 logits, one row of `d` per block of [`ROW_THREADS`]:
/// `grad = (softmax(x) - onehot(target)) * g[0] * inv_n` in f32, rounded once per element (`g`:
/// the one-element upstream gradient of the mean loss, bf16).
#[kernel]
pub unsafe fn cross_entropy_backward_rows_bf16(
    logits: DevicePtr<u16>,
    targets: DevicePtr<u32>,
    g: DevicePtr<u16>,
    grad: DevicePtrMut<u16>,
    d: u32,
    inv_n: f32,
) {
    unsafe { cross_entropy_backward_rows::<Bf16>(logits, targets, g, grad, d, inv_n) }
}

/// [`cross_entropy_backward_rows_bf16`] on f16.
#[kernel]
pub unsafe fn cross_entropy_backward_rows_f16(
    logits: DevicePtr<u16>,
    targets: DevicePtr<u32>,
    g: DevicePtr<u16>,
    grad: DevicePtrMut<u16>,
    d: u32,
    inv_n: f32,
) {
    unsafe { cross_entropy_backward_rows::<F16>(logits, targets, g, grad, d, inv_n) }
}

shared_array!(fn ln16_stats() -> [f32; 96], align 16);

/// Layer norm of the block's row: Welford states per thread (f32), combined across the warp by
/// butterfly and across warps in shared memory; mean and rstd rounded to the format like `out`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn layer_norm_rows<H: Half16>(
    x: DevicePtr<u16>,
    w: DevicePtr<u16>,
    b: DevicePtr<u16>,
    out: DevicePtrMut<u16>,
    mean_out: DevicePtrMut<u16>,
    rstd_out: DevicePtrMut<u16>,
    d: u32,
    eps: f32,
) {
    let r = thread::block_idx_x();
    let row = (r * d) as usize;
    let t = thread::thread_idx_x();
    let mut st3 = (0.0f32, 0.0f32, 0.0f32);
    let mut c = t;
    while c < d {
        let v = unsafe { ld::<H>(x, row + c as usize) };
        st3.0 += 1.0;
        let delta = v - st3.1;
        st3.1 += delta / st3.0;
        st3.2 += delta * (v - st3.1);
        c += ROW_THREADS;
    }
    let mut off = warp::WARP_SIZE / 2;
    while off > 0 {
        let o = (
            warp::shfl_xor_f32(warp::FULL_MASK, st3.0, off),
            warp::shfl_xor_f32(warp::FULL_MASK, st3.1, off),
            warp::shfl_xor_f32(warp::FULL_MASK, st3.2, off),
        );
        st3 = welford_combine(st3, o);
        off /= 2;
    }
    let sh = ln16_stats();
    let (lane, wid) = (thread::lane_id(), thread::warp_id());
    if lane == 0 {
        unsafe {
            (*sh)[(wid * 3) as usize] = st3.0;
            (*sh)[(wid * 3 + 1) as usize] = st3.1;
            (*sh)[(wid * 3 + 2) as usize] = st3.2;
        }
    }
    sync::sync_threads();
    let mut all = (0.0f32, 0.0f32, 0.0f32);
    let mut i = 0;
    while i < ROW_THREADS / warp::WARP_SIZE {
        let s = unsafe { ((*sh)[(i * 3) as usize], (*sh)[(i * 3 + 1) as usize], (*sh)[(i * 3 + 2) as usize]) };
        all = welford_combine(all, s);
        i += 1;
    }
    let (mean, rstd) = (all.1, 1.0 / math::sqrt(all.2 / d as f32 + eps));
    if t == 0 {
        unsafe {
            st::<H>(mean_out, r as usize, mean);
            st::<H>(rstd_out, r as usize, rstd);
        }
    }
    c = t;
    while c < d {
        let v = unsafe { ld::<H>(x, row + c as usize) };
        let y = (v - mean) * rstd * unsafe { ld::<H>(w, c as usize) } + unsafe { ld::<H>(b, c as usize) };
        unsafe { st::<H>(out, row + c as usize, y) };
        c += ROW_THREADS;
    }
}

/// Layer norm of each bf16 row of `d`: `out = (x - mean) * rstd * w + b`, computed in f32 from the
/// unrounded mean and rstd, which are also written (rounded to bf16, as the CPU backend keeps them
/// in the tensor's dtype) for the backward. One block of [`ROW_THREADS`] per row; each thread keeps
/// a Welford state over its strided columns, combined by butterfly across the warp, then across
/// warps through shared memory.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub unsafe fn layer_norm_rows_bf16(
    x: DevicePtr<u16>,
    w: DevicePtr<u16>,
    b: DevicePtr<u16>,
    out: DevicePtrMut<u16>,
    mean_out: DevicePtrMut<u16>,
    rstd_out: DevicePtrMut<u16>,
    d: u32,
    eps: f32,
) {
    unsafe { layer_norm_rows::<Bf16>(x, w, b, out, mean_out, rstd_out, d, eps) }
}

/// [`layer_norm_rows_bf16`] on f16.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub unsafe fn layer_norm_rows_f16(
    x: DevicePtr<u16>,
    w: DevicePtr<u16>,
    b: DevicePtr<u16>,
    out: DevicePtrMut<u16>,
    mean_out: DevicePtrMut<u16>,
    rstd_out: DevicePtrMut<u16>,
    d: u32,
    eps: f32,
) {
    unsafe { layer_norm_rows::<F16>(x, w, b, out, mean_out, rstd_out, d, eps) }
}
