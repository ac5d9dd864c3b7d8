//! Tensor kernels (f32): the CUDA backend of kiln's tensors. Elementwise maps with broadcasting,
//! strided copies, reductions over any dimensions, row-wise softmax / cross-entropy / layer norm,
//! embedding gather and deterministic scatter, and the fused optimizer updates.
//!
//! Every kernel reduces in a fixed order (no float atomics), so results are bit-reproducible for a
//! given launch configuration, which the host keeps fixed per shape.

use crate::{DevicePtr, DevicePtrMut, KernelParam, kernel, shared_array};
use crate::{math, sync, thread, warp};

/// Most dimensions a strided or broadcast kernel handles (the host merges or pads to this).
pub const MAX_DIMS: usize = 4;
/// Threads per block for the row kernels (one block per row).
pub const ROW_THREADS: u32 = 256;
/// 16-byte quads of a row each thread holds in registers on the row kernels' cached path: rows of
/// `d % 4 == 0` and `d <= 4 * ROW_THREADS * ROW_QUADS` (8192) are read from memory once.
pub const ROW_QUADS: u32 = 8;

/// Whether the row kernels keep rows of `d` elements in registers (one read of the row) rather
/// than reading the row once per pass.
pub const fn row_cached(d: u32) -> bool {
    d.is_multiple_of(4) && d / 4 <= ROW_THREADS * ROW_QUADS
}

/// Unary function codes for `unary_f32`.
pub mod unary {
    /// -x
    pub const NEG: u32 = 0;
    /// e^x
    pub const EXP: u32 = 1;
    /// ln x
    pub const LOG: u32 = 2;
    /// sqrt x
    pub const SQRT: u32 = 3;
    /// max(x, 0)
    pub const RELU: u32 = 4;
    /// GELU, tanh form
    pub const GELU: u32 = 5;
    /// d GELU / dx
    pub const GELU_GRAD: u32 = 6;
    /// tanh x
    pub const TANH: u32 = 7;
    /// logistic sigmoid
    pub const SIGMOID: u32 = 8;
    /// 1 where x > 0
    pub const STEP: u32 = 9;
    /// x + s
    pub const ADD_SCALAR: u32 = 10;
    /// x * s
    pub const MUL_SCALAR: u32 = 11;
}

/// Binary function codes for `binary_f32`.
pub mod binary {
    /// a + b
    pub const ADD: u32 = 0;
    /// a - b
    pub const SUB: u32 = 1;
    /// a * b
    pub const MUL: u32 = 2;
    /// a / b
    pub const DIV: u32 = 3;
    /// a * step(b): `a` where `b > 0`, else `a * 0` (ReLU's backward from its output `b`; the
    /// bits of `a * (b > 0 ? 1 : 0)`, the composition it replaces).
    pub const RELU_GRAD: u32 = 4;
}

/// An output of `n` elements with dimensions `dims` (row-major, padded on the left with 1s to
/// [`MAX_DIMS`]) and, for each input, the stride of each dimension (0 where it broadcasts).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Strided2 {
    /// Output elements.
    pub n: u32,
    /// Output dimensions.
    pub dims: [u32; MAX_DIMS],
    /// Input A's strides.
    pub a: [u32; MAX_DIMS],
    /// Input B's strides (unused by one-input kernels).
    pub b: [u32; MAX_DIMS],
    /// Function code ([`binary`]).
    pub op: u32,
}
// SAFETY: repr(C), u32 fields only.
unsafe impl KernelParam for Strided2 {}

/// The input offsets of output element `i` (pure: host-tested).
#[inline(always)]
pub const fn strided_offsets(p: &Strided2, mut i: u32) -> (u32, u32) {
    let (mut oa, mut ob) = (0, 0);
    let mut d = MAX_DIMS;
    while d > 0 {
        d -= 1;
        let c = i % p.dims[d];
        i /= p.dims[d];
        oa += c * p.a[d];
        ob += c * p.b[d];
    }
    (oa, ob)
}

/// A sum over some dimensions: output element `o` (of `out_n`) has kept coordinates in `kept_dims`
/// read through `kept_strides`, and sums the `red_n` input elements at `red_dims` / `red_strides`
/// from there, in row-major order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReduceDims {
    /// Output elements.
    pub out_n: u32,
    /// Kept dimensions (output shape, padded).
    pub kept_dims: [u32; MAX_DIMS],
    /// Input strides of the kept dimensions.
    pub kept_strides: [u32; MAX_DIMS],
    /// Elements summed per output.
    pub red_n: u32,
    /// Reduced dimensions (padded).
    pub red_dims: [u32; MAX_DIMS],
    /// Input strides of the reduced dimensions.
    pub red_strides: [u32; MAX_DIMS],
}
// SAFETY: repr(C), u32 fields only.
unsafe impl KernelParam for ReduceDims {}

/// Offset of coordinate index `i` in a (dims, strides) space (pure: host-tested).
#[inline(always)]
pub const fn offset_of(dims: &[u32; MAX_DIMS], strides: &[u32; MAX_DIMS], mut i: u32) -> u32 {
    let mut off = 0;
    let mut d = MAX_DIMS;
    while d > 0 {
        d -= 1;
        off += (i % dims[d]) * strides[d];
        i /= dims[d];
    }
    off
}

/// Batched matrix product shape: `c[b] = a[b] (m x k) . b[b] (k x n)`, `b_stride` 0 for a shared B.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulShape {
    /// Rows of A and C.
    pub m: u32,
    /// Columns of B and C.
    pub n: u32,
    /// The reduction.
    pub k: u32,
    /// Elements between consecutive A matrices.
    pub a_stride: u32,
    /// Elements between consecutive B matrices (0: one B for every batch).
    pub b_stride: u32,
}
// SAFETY: repr(C), u32 fields only.
unsafe impl KernelParam for MatmulShape {}

/// Tile edge of `matmul_f32`.
pub const MATMUL_TILE: u32 = 16;

/// Adam / AdamW hyper-parameters for one step, with the bias corrections precomputed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AdamStep {
    /// Elements.
    pub n: u32,
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Weight decay.
    pub weight_decay: f32,
    /// 1 - beta1^t.
    pub c1: f32,
    /// 1 - beta2^t.
    pub c2: f32,
    /// 1: AdamW (decoupled decay), 0: Adam (decay added to the gradient).
    pub decoupled: u32,
}
// SAFETY: repr(C), 4-byte fields only.
unsafe impl KernelParam for AdamStep {}

/// SGD hyper-parameters for one step.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SgdStep {
    /// Elements.
    pub n: u32,
    /// Learning rate.
    pub lr: f32,
    /// Momentum (0: none).
    pub momentum: f32,
    /// Weight decay.
    pub weight_decay: f32,
    /// 1: Nesterov.
    pub nesterov: u32,
    /// 1: the first step (the velocity starts as the gradient).
    pub first: u32,
}
// SAFETY: repr(C), 4-byte fields only.
unsafe impl KernelParam for SgdStep {}

/// `op` (a [`unary`] code) applied to `v` (`s`: the scalar of the `*_SCALAR` codes); traps on an
/// unknown code. Also the activation of the GEMM epilogues.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) fn apply_unary(op: u32, v: f32, s: f32) -> f32 {
    const C: f32 = 0.797_884_6;
    const A: f32 = 0.044_715;
    match op {
        unary::NEG => -v,
        unary::EXP => math::exp(v),
        unary::LOG => math::ln(v),
        unary::SQRT => math::sqrt(v),
        unary::RELU => {
            if v > 0.0 {
                v
            } else {
                0.0
            }
        }
        unary::GELU => 0.5 * v * (1.0 + math::tanh(C * (v + A * v * v * v))),
        unary::GELU_GRAD => {
            let t = math::tanh(C * (v + A * v * v * v));
            0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * C * (1.0 + 3.0 * A * v * v)
        }
        unary::TANH => math::tanh(v),
        unary::SIGMOID => math::sigmoid(v),
        unary::STEP => {
            if v > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        unary::ADD_SCALAR => v + s,
        unary::MUL_SCALAR => v * s,
        _ => thread::trap(),
    }
}

/// The grid-stride walk of the 16-byte elementwise kernels over `n` elements: `quad(q)` for each
/// whole quad `q` (elements `4q..4q+4`, one 16-byte access), then `one(i)` for the last `n % 4`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn for_each_quad(n: u32, mut quad: impl FnMut(usize), mut one: impl FnMut(usize)) {
    let (gid, stride) = (thread::global_idx_x() as usize, thread::grid_stride_x() as usize);
    let n4 = n as usize / 4;
    let mut q = gid;
    while q < n4 {
        quad(q);
        q += stride;
    }
    let i = n4 * 4 + gid;
    if i < n as usize {
        one(i);
    }
}

/// `out[i] = f(x[i])` for the function `op` ([`unary`]), with scalar `s` for the scalar ops.
/// Grid-stride over quads of 4 elements with 16-byte loads and stores (`x` and `out` must be
/// 16-byte aligned, as every kiln allocation is), then the last `n % 4` elements.
#[kernel]
pub unsafe fn unary_f32(x: DevicePtr<f32>, out: DevicePtrMut<f32>, n: u32, op: u32, s: f32) {
    for_each_quad(
        n,
        |q| {
            let v = unsafe { x.read4(q) };
            let r = [
                apply_unary(op, v[0], s),
                apply_unary(op, v[1], s),
                apply_unary(op, v[2], s),
                apply_unary(op, v[3], s),
            ];
            unsafe { out.write4(q, r) };
        },
        |i| unsafe { out.write(i, apply_unary(op, x.read(i), s)) },
    );
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) fn apply_binary(op: u32, x: f32, y: f32) -> f32 {
    match op {
        binary::ADD => x + y,
        binary::SUB => x - y,
        binary::MUL => x * y,
        binary::DIV => x / y,
        binary::RELU_GRAD => x * if y > 0.0 { 1.0 } else { 0.0 },
        _ => thread::trap(),
    }
}

/// `out[i] = a[i] (op) b[i]` for operands of the output's shape (no broadcasting): quads of 4 with
/// 16-byte accesses (16-byte aligned pointers), then the tail. Grid-stride.
#[kernel]
pub unsafe fn binary_flat_f32(a: DevicePtr<f32>, b: DevicePtr<f32>, out: DevicePtrMut<f32>, n: u32, op: u32) {
    for_each_quad(
        n,
        |q| {
            let (x, y) = unsafe { (a.read4(q), b.read4(q)) };
            let r = [
                apply_binary(op, x[0], y[0]),
                apply_binary(op, x[1], y[1]),
                apply_binary(op, x[2], y[2]),
                apply_binary(op, x[3], y[3]),
            ];
            unsafe { out.write4(q, r) };
        },
        |i| unsafe { out.write(i, apply_binary(op, a.read(i), b.read(i))) },
    );
}

/// `out[i] = a[off_a(i)] (op) b[off_b(i)]` with broadcasting strides ([`Strided2`]). Grid-stride.
#[kernel]
pub unsafe fn binary_f32(a: DevicePtr<f32>, b: DevicePtr<f32>, out: DevicePtrMut<f32>, p: Strided2) {
    let mut i = thread::global_idx_x();
    while i < p.n {
        let (oa, ob) = strided_offsets(&p, i);
        let (x, y) = unsafe { (a.read(oa as usize), b.read(ob as usize)) };
        unsafe { out.write(i as usize, apply_binary(p.op, x, y)) };
        i += thread::grid_stride_x();
    }
}

/// `out[i] = x[off_a(i)]`: transposes, broadcasts (expand) and other strided gathers. Grid-stride.
#[kernel]
pub unsafe fn strided_copy_f32(x: DevicePtr<f32>, out: DevicePtrMut<f32>, p: Strided2) {
    let mut i = thread::global_idx_x();
    while i < p.n {
        let (oa, _) = strided_offsets(&p, i);
        unsafe { out.write(i as usize, x.read(oa as usize)) };
        i += thread::grid_stride_x();
    }
}

/// `out[off_b(i)] = x[off_a(i)]` for `i < p.n`: a strided copy whose destination is strided too
/// (views written into a slice of a larger tensor: `cat`, the zero-padded gradient of `narrow`).
/// `p.dims` is the shape walked, `p.a` the source strides and `p.b` the destination strides (the
/// host offsets both pointers to the views' first elements); the destination offsets must be
/// distinct. One thread per element, grid-stride.
#[kernel]
pub unsafe fn strided_scatter_f32(x: DevicePtr<f32>, out: DevicePtrMut<f32>, p: Strided2) {
    let mut i = thread::global_idx_x();
    while i < p.n {
        let (oa, ob) = strided_offsets(&p, i);
        unsafe { out.write(ob as usize, x.read(oa as usize)) };
        i += thread::grid_stride_x();
    }
}

/// `out[i] = value`: quads with 16-byte stores (16-byte aligned `out`), then the tail. Grid-stride.
#[kernel]
pub unsafe fn fill_f32(out: DevicePtrMut<f32>, n: u32, value: f32) {
    for_each_quad(n, |q| unsafe { out.write4(q, [value; 4]) }, |i| unsafe { out.write(i, value) });
}

/// Sums over dimensions ([`ReduceDims`]): one thread per output element, adding its inputs in
/// row-major order in f64 and rounding once, so the result matches the CPU backend's order.
#[kernel]
pub unsafe fn reduce_sum_dims_f32(x: DevicePtr<f32>, out: DevicePtrMut<f32>, p: ReduceDims) {
    let mut o = thread::global_idx_x();
    while o < p.out_n {
        let base = offset_of(&p.kept_dims, &p.kept_strides, o);
        let mut acc = 0.0f64;
        let mut r = 0;
        while r < p.red_n {
            acc += unsafe { x.read((base + offset_of(&p.red_dims, &p.red_strides, r)) as usize) } as f64;
            r += 1;
        }
        unsafe { out.write(o as usize, acc as f32) };
        o += thread::grid_stride_x();
    }
}

/// The first pass of a split sum over dimensions ([`ReduceDims`]), for few outputs over long
/// reductions (a bias gradient: hundreds of columns summed over thousands of rows), where one
/// thread per output leaves the GPU nearly idle. The reduction is cut into chunks of `chunk`
/// consecutive reduced elements; thread `i` (grid-stride) owns output `o = i % out_n` and chunk
/// `c = i / out_n`, so neighbouring threads read neighbouring columns, and writes the f64 sum of
/// its chunk (row-major order) to `partial[i]`. [`reduce_partials_f64`] adds the chunks in order:
/// a fixed order for a given shape, so the same inputs give the same bits.
#[kernel]
pub unsafe fn reduce_sum_dims_partial_f32(x: DevicePtr<f32>, partial: DevicePtrMut<f64>, p: ReduceDims, chunk: u32) {
    let chunks = p.red_n.div_ceil(chunk);
    let mut i = thread::global_idx_x();
    while i < p.out_n * chunks {
        let (o, c) = (i % p.out_n, i / p.out_n);
        let base = offset_of(&p.kept_dims, &p.kept_strides, o);
        let end = if (c + 1) * chunk < p.red_n { (c + 1) * chunk } else { p.red_n };
        let mut acc = 0.0f64;
        let mut r = c * chunk;
        while r < end {
            acc += unsafe { x.read((base + offset_of(&p.red_dims, &p.red_strides, r)) as usize) } as f64;
            r += 1;
        }
        unsafe { partial.write(i as usize, acc) };
        i += thread::grid_stride_x();
    }
}

/// The second pass of the split sum: `out[o] = sum over c of partial[c * out_n + o]` in order of
/// `c`, rounded once to f32. One thread per output, grid-stride.
#[kernel]
pub unsafe fn reduce_partials_f64(partial: DevicePtr<f64>, out: DevicePtrMut<f32>, out_n: u32, chunks: u32) {
    let mut o = thread::global_idx_x();
    while o < out_n {
        let mut acc = 0.0f64;
        let mut c = 0;
        while c < chunks {
            acc += unsafe { partial.read((c * out_n + o) as usize) };
            c += 1;
        }
        unsafe { out.write(o as usize, acc as f32) };
        o += thread::grid_stride_x();
    }
}

/// Maximum along one dimension: input viewed as (outer, len, inner); one thread per (outer, inner)
/// writes the first maximum and its input offset.
#[kernel]
pub unsafe fn max_dim_f32(
    x: DevicePtr<f32>,
    out: DevicePtrMut<f32>,
    argmax: DevicePtrMut<u32>,
    outer: u32,
    len: u32,
    inner: u32,
) {
    let mut o = thread::global_idx_x();
    while o < outer * inner {
        let (a, b) = (o / inner, o % inner);
        let mut best = a * len * inner + b;
        let mut bv = unsafe { x.read(best as usize) };
        let mut j = 1;
        while j < len {
            let idx = (a * len + j) * inner + b;
            let v = unsafe { x.read(idx as usize) };
            if v > bv || (v.is_nan() && !bv.is_nan()) {
                best = idx;
                bv = v;
            }
            j += 1;
        }
        unsafe {
            out.write(o as usize, bv);
            argmax.write(o as usize, best);
        }
        o += thread::grid_stride_x();
    }
}

/// `gx[argmax[o]] = g[o]` (gx zeroed first; argmax offsets are distinct, so no two threads write
/// one element).
#[kernel]
pub unsafe fn scatter_argmax_f32(g: DevicePtr<f32>, argmax: DevicePtr<u32>, gx: DevicePtrMut<f32>, n: u32) {
    let mut o = thread::global_idx_x() as usize;
    while o < n as usize {
        unsafe { gx.write(argmax.read(o) as usize, g.read(o)) };
        o += thread::grid_stride_x() as usize;
    }
}

shared_array!(fn mm_a() -> [f32; 256], align 16);
shared_array!(fn mm_b() -> [f32; 256], align 16);

/// Batched matrix product with 16x16 shared-memory tiles (the simple kernel the GEMM ladder
/// replaces). Block (16, 16): thread (tx, ty) computes `c[b][row0 + ty][col0 + tx]`; grid
/// (ceil(n / 16), ceil(m / 16), batch). The k loop runs in ascending order.
#[kernel]
pub unsafe fn matmul_f32(a: DevicePtr<f32>, b: DevicePtr<f32>, c: DevicePtrMut<f32>, s: MatmulShape) {
    let (tx, ty) = (thread::thread_idx_x(), thread::thread_idx_y());
    let bz = thread::block_idx_z();
    let row = thread::block_idx_y() * MATMUL_TILE + ty;
    let col = thread::block_idx_x() * MATMUL_TILE + tx;
    let a0 = (bz * s.a_stride) as usize;
    let b0 = (bz * s.b_stride) as usize;
    let (sa, sb) = (mm_a(), mm_b());
    let mut acc = 0.0f32;
    let mut k0 = 0;
    while k0 < s.k {
        let (ka, kb) = (k0 + tx, k0 + ty);
        let va = if row < s.m && ka < s.k { unsafe { a.read(a0 + (row * s.k + ka) as usize) } } else { 0.0 };
        let vb = if kb < s.k && col < s.n { unsafe { b.read(b0 + (kb * s.n + col) as usize) } } else { 0.0 };
        unsafe {
            (*sa)[(ty * MATMUL_TILE + tx) as usize] = va;
            (*sb)[(ty * MATMUL_TILE + tx) as usize] = vb;
        }
        sync::sync_threads();
        let mut kk = 0;
        while kk < MATMUL_TILE {
            acc = math::fma(
                unsafe { (*sa)[(ty * MATMUL_TILE + kk) as usize] },
                unsafe { (*sb)[(kk * MATMUL_TILE + tx) as usize] },
                acc,
            );
            kk += 1;
        }
        sync::sync_threads();
        k0 += MATMUL_TILE;
    }
    if row < s.m && col < s.n {
        unsafe { c.write((bz * s.m * s.n + row * s.n + col) as usize, acc) };
    }
}

shared_array!(fn row_red() -> [f32; 32], align 16);

/// Block-wide reduction of one value per thread (sum or max), every thread gets the result.
/// All threads of the block must call it.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) fn block_reduce(v: f32, max: bool) -> f32 {
    let (lane, w) = (thread::lane_id(), thread::warp_id());
    let warps = thread::block_dim_x() / warp::WARP_SIZE;
    let r = if max { warp::reduce_max_f32(v) } else { warp::reduce_sum_f32(v) };
    let sh = row_red();
    if lane == 0 {
        unsafe { (*sh)[w as usize] = r };
    }
    sync::sync_threads();
    let init = if max { f32::NEG_INFINITY } else { 0.0 };
    let x = if lane < warps { unsafe { (*sh)[lane as usize] } } else { init };
    let total = if max { warp::reduce_max_f32(x) } else { warp::reduce_sum_f32(x) };
    sync::sync_threads(); // the shared slots are reused by the next call
    total
}

/// The maximum `m` of a row of `d` elements starting at `row`, and `sum exp(x - m)`, block-wide
/// (every thread gets both). All threads of the block must call it.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn row_max_sum_exp(x: DevicePtr<f32>, row: usize, d: u32) -> (f32, f32) {
    let t = thread::thread_idx_x();
    let mut m = f32::NEG_INFINITY;
    let mut c = t;
    while c < d {
        m = m.max(unsafe { x.read(row + c as usize) });
        c += ROW_THREADS;
    }
    let m = block_reduce(m, true);
    let mut s = 0.0f32;
    c = t;
    while c < d {
        s += math::exp_fast(unsafe { x.read(row + c as usize) } - m);
        c += ROW_THREADS;
    }
    (m, block_reduce(s, false))
}

/// This thread's quads of the row starting at element `row` (a multiple of 4): quad `j` is the
/// row's quad `t + j * ROW_THREADS`, or `[fill; 4]` past the row's `d / 4` quads. Rows must
/// satisfy [`row_cached`].
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn load_row_quads(x: DevicePtr<f32>, row: usize, d: u32, fill: f32) -> [[f32; 4]; ROW_QUADS as usize] {
    let t = thread::thread_idx_x();
    let mut v = [[fill; 4]; ROW_QUADS as usize];
    let mut j = 0;
    while j < ROW_QUADS {
        let q = t + j * ROW_THREADS;
        if q < d / 4 {
            v[j as usize] = unsafe { x.read4(row / 4 + q as usize) };
        }
        j += 1;
    }
    v
}

/// Writes this thread's quads (the layout of [`load_row_quads`]) with `f(column, value)`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn store_row_quads(
    out: DevicePtrMut<f32>,
    row: usize,
    d: u32,
    v: &[[f32; 4]; ROW_QUADS as usize],
    f: impl Fn(u32, f32) -> f32,
) {
    let t = thread::thread_idx_x();
    let mut j = 0;
    while j < ROW_QUADS {
        let q = t + j * ROW_THREADS;
        if q < d / 4 {
            let x = v[j as usize];
            let c = 4 * q;
            unsafe { out.write4(row / 4 + q as usize, [f(c, x[0]), f(c + 1, x[1]), f(c + 2, x[2]), f(c + 3, x[3])]) };
        }
        j += 1;
    }
}

/// The block-wide maximum `m` of the cached row `v` (padding is -inf), and `sum exp(x - m)`; with
/// `KEEP`, `v` is replaced by `exp(x - m)` (padding by 0).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn cached_max_sum_exp<const KEEP: bool>(v: &mut [[f32; 4]; ROW_QUADS as usize], d: u32) -> (f32, f32) {
    let t = thread::thread_idx_x();
    let mut m = f32::NEG_INFINITY;
    let mut j = 0;
    while j < ROW_QUADS as usize {
        m = m.max(v[j][0]).max(v[j][1]).max(v[j][2]).max(v[j][3]);
        j += 1;
    }
    let m = block_reduce(m, true);
    let mut s = 0.0f32;
    j = 0;
    while j < ROW_QUADS as usize {
        if t + j as u32 * ROW_THREADS < d / 4 {
            let mut l = 0;
            while l < 4 {
                let e = math::exp_fast(v[j][l] - m);
                s += e;
                if KEEP {
                    v[j][l] = e;
                }
                l += 1;
            }
        }
        j += 1;
    }
    (m, block_reduce(s, false))
}

/// Softmax (`log = 0`) or log-softmax (`log = 1`) of each row of `d` elements. One block of
/// [`ROW_THREADS`] per row: block max, block sum of exp(x - max), then the write. Rows that fit
/// ([`row_cached`]) are read once into registers with 16-byte loads; others are read per pass.
#[kernel]
pub unsafe fn softmax_rows_f32(x: DevicePtr<f32>, out: DevicePtrMut<f32>, d: u32, log: u32) {
    let row = (thread::block_idx_x() * d) as usize;
    let t = thread::thread_idx_x();
    if row_cached(d) {
        let mut v = unsafe { load_row_quads(x, row, d, f32::NEG_INFINITY) };
        if log != 0 {
            let (m, s) = cached_max_sum_exp::<false>(&mut v, d);
            let ls = math::ln(s);
            unsafe { store_row_quads(out, row, d, &v, |_, x| (x - m) - ls) };
        } else {
            let (_, s) = cached_max_sum_exp::<true>(&mut v, d);
            let inv = 1.0 / s;
            unsafe { store_row_quads(out, row, d, &v, |_, e| e * inv) };
        }
        return;
    }
    let (m, s) = unsafe { row_max_sum_exp(x, row, d) };
    let (ls, inv) = (math::ln(s), 1.0 / s);
    let mut c = t;
    while c < d {
        let v = unsafe { x.read(row + c as usize) } - m;
        unsafe { out.write(row + c as usize, if log != 0 { v - ls } else { math::exp_fast(v) * inv }) };
        c += ROW_THREADS;
    }
}

/// Per-row cross-entropy `logsumexp(x) - x[target]` of logits rows of `d`; one block of
/// [`reduce_sum_f32`](crate::kernels::reduce::reduce_sum_f32) with scale `1 / n` then averages the row
/// losses. One block per row.
#[kernel]
pub unsafe fn cross_entropy_rows_f32(
    logits: DevicePtr<f32>,
    targets: DevicePtr<u32>,
    row_loss: DevicePtrMut<f32>,
    d: u32,
) {
    let r = thread::block_idx_x();
    let row = (r * d) as usize;
    let t = thread::thread_idx_x();
    let (m, s) = if row_cached(d) {
        let mut v = unsafe { load_row_quads(logits, row, d, f32::NEG_INFINITY) };
        cached_max_sum_exp::<false>(&mut v, d)
    } else {
        unsafe { row_max_sum_exp(logits, row, d) }
    };
    if t == 0 {
        let target = unsafe { targets.read(r as usize) };
        unsafe { row_loss.write(r as usize, m + math::ln(s) - logits.read(row + target as usize)) };
    }
}

/// The cross-entropy gradient for one row per block: `grad = (softmax(x) - onehot(target)) * g[0] *
/// inv_n`, with `g` the upstream gradient of the (scalar) mean loss. Fused, so the backward reads the
/// logits once more and writes the gradient once, with no one-hot matrix.
#[kernel]
pub unsafe fn cross_entropy_backward_rows_f32(
    logits: DevicePtr<f32>,
    targets: DevicePtr<u32>,
    g: DevicePtr<f32>,
    grad: DevicePtrMut<f32>,
    d: u32,
    inv_n: f32,
) {
    let r = thread::block_idx_x();
    let row = (r * d) as usize;
    let t = thread::thread_idx_x();
    let scale = unsafe { g.read(0) } * inv_n;
    let target = unsafe { targets.read(r as usize) };
    if row_cached(d) {
        let mut v = unsafe { load_row_quads(logits, row, d, f32::NEG_INFINITY) };
        let (_, s) = cached_max_sum_exp::<true>(&mut v, d);
        let inv = 1.0 / s;
        unsafe { store_row_quads(grad, row, d, &v, |c, e| (e * inv - if c == target { 1.0 } else { 0.0 }) * scale) };
        return;
    }
    let (m, s) = unsafe { row_max_sum_exp(logits, row, d) };
    let inv = 1.0 / s;
    let mut c = t;
    while c < d {
        let p = math::exp_fast(unsafe { logits.read(row + c as usize) } - m) * inv;
        let onehot = if c == target { 1.0 } else { 0.0 };
        unsafe { grad.write(row + c as usize, (p - onehot) * scale) };
        c += ROW_THREADS;
    }
}

/// Combines two Welford states (count, mean, M2) (Chan et al.).
#[inline(always)]
pub fn welford_combine(a: (f32, f32, f32), b: (f32, f32, f32)) -> (f32, f32, f32) {
    let n = a.0 + b.0;
    if n == 0.0 {
        return (0.0, 0.0, 0.0);
    }
    let delta = b.1 - a.1;
    (n, a.1 + delta * b.0 / n, a.2 + b.2 + delta * delta * a.0 * b.0 / n)
}

shared_array!(fn ln_stats() -> [f32; 96], align 16);

/// Layer norm of each row of `d`: `out = (x - mean) * rstd * w + b`, writing the row's `mean` and
/// `rstd` for the backward. One block per row. Rows that fit ([`row_cached`]) are read once into
/// registers and reduced in two passes there (mean, then squared deviations); others keep a Welford
/// state per thread over its strided elements, combined by butterfly across the warp, then across
/// warps.
#[kernel]
pub unsafe fn layer_norm_rows_f32(
    x: DevicePtr<f32>,
    w: DevicePtr<f32>,
    b: DevicePtr<f32>,
    out: DevicePtrMut<f32>,
    mean_out: DevicePtrMut<f32>,
    rstd_out: DevicePtrMut<f32>,
    d: u32,
    eps: f32,
) {
    let r = thread::block_idx_x();
    let row = (r * d) as usize;
    let t = thread::thread_idx_x();
    if row_cached(d) {
        // The row in registers: the exact two-pass mean and variance, one read of the row.
        let v = unsafe { load_row_quads(x, row, d, 0.0) };
        let mut sum = 0.0f32;
        let mut q = 0;
        while q < ROW_QUADS as usize {
            sum += (v[q][0] + v[q][1]) + (v[q][2] + v[q][3]);
            q += 1;
        }
        let mean = block_reduce(sum, false) / d as f32;
        let mut sq = 0.0f32;
        q = 0;
        while q < ROW_QUADS as usize {
            if t + q as u32 * ROW_THREADS < d / 4 {
                let mut l = 0;
                while l < 4 {
                    let c = v[q][l] - mean;
                    sq = math::fma(c, c, sq);
                    l += 1;
                }
            }
            q += 1;
        }
        let rstd = 1.0 / math::sqrt(block_reduce(sq, false) / d as f32 + eps);
        if t == 0 {
            unsafe {
                mean_out.write(r as usize, mean);
                rstd_out.write(r as usize, rstd);
            }
        }
        unsafe { store_row_quads(out, row, d, &v, |c, x| (x - mean) * rstd * w.read(c as usize) + b.read(c as usize)) };
        return;
    }
    let mut st = (0.0f32, 0.0f32, 0.0f32);
    let mut c = t;
    while c < d {
        let v = unsafe { x.read(row + c as usize) };
        st.0 += 1.0;
        let delta = v - st.1;
        st.1 += delta / st.0;
        st.2 += delta * (v - st.1);
        c += ROW_THREADS;
    }
    let mut off = warp::WARP_SIZE / 2;
    while off > 0 {
        let o = (
            warp::shfl_xor_f32(warp::FULL_MASK, st.0, off),
            warp::shfl_xor_f32(warp::FULL_MASK, st.1, off),
            warp::shfl_xor_f32(warp::FULL_MASK, st.2, off),
        );
        st = welford_combine(st, o);
        off /= 2;
    }
    let sh = ln_stats();
    let (lane, wid) = (thread::lane_id(), thread::warp_id());
    if lane == 0 {
        unsafe {
            (*sh)[(wid * 3) as usize] = st.0;
            (*sh)[(wid * 3 + 1) as usize] = st.1;
            (*sh)[(wid * 3 + 2) as usize] = st.2;
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
            mean_out.write(r as usize, mean);
            rstd_out.write(r as usize, rstd);
        }
    }
    c = t;
    while c < d {
        let v = unsafe { x.read(row + c as usize) };
        unsafe { out.write(row + c as usize, (v - mean) * rstd * w.read(c as usize) + b.read(c as usize)) };
        c += ROW_THREADS;
    }
}

/// `out[p][c] = table[ids[p]][c]` for `n` positions of `d` features. Grid-stride over n * d.
#[kernel]
pub unsafe fn embedding_gather_f32(table: DevicePtr<f32>, ids: DevicePtr<u32>, out: DevicePtrMut<f32>, n: u32, d: u32) {
    let mut i = thread::global_idx_x();
    while i < n * d {
        let (p, c) = (i / d, i % d);
        unsafe { out.write(i as usize, table.read((ids.read(p as usize) * d + c) as usize)) };
        i += thread::grid_stride_x();
    }
}

/// Deterministic scatter-add for the embedding gradient: `gw[v][c] = sum of g[p][c]` over the
/// positions `p` with `ids[p] == v`, taken in position order. The host sorts positions by id
/// (`order`, with `offsets[v]..offsets[v + 1]` the positions of row v); one thread per (v, c).
#[kernel]
pub unsafe fn embedding_scatter_f32(
    g: DevicePtr<f32>,
    order: DevicePtr<u32>,
    offsets: DevicePtr<u32>,
    gw: DevicePtrMut<f32>,
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
            acc += unsafe { g.read((order.read(j as usize) * d + c) as usize) };
            j += 1;
        }
        unsafe { gw.write(i as usize, acc) };
        i += thread::grid_stride_x();
    }
}

/// One fused Adam / AdamW step over `n` parameters: updates `m`, `v` and `p` in place from `g`.
#[kernel]
pub unsafe fn adam_step_f32(
    p: DevicePtrMut<f32>,
    g: DevicePtr<f32>,
    m: DevicePtrMut<f32>,
    v: DevicePtrMut<f32>,
    h: AdamStep,
) {
    let mut i = thread::global_idx_x() as usize;
    while i < h.n as usize {
        unsafe {
            let mut w = p.as_const().read(i);
            let mut gi = g.read(i);
            if h.decoupled == 0 {
                gi += h.weight_decay * w;
            }
            let mi = h.beta1 * m.as_const().read(i) + (1.0 - h.beta1) * gi;
            let vi = h.beta2 * v.as_const().read(i) + (1.0 - h.beta2) * gi * gi;
            m.write(i, mi);
            v.write(i, vi);
            if h.decoupled != 0 {
                w -= h.lr * h.weight_decay * w;
            }
            w -= h.lr * (mi / h.c1) / (math::sqrt(vi / h.c2) + h.eps);
            p.write(i, w);
        }
        i += thread::grid_stride_x() as usize;
    }
}

/// One fused SGD step (momentum, weight decay, Nesterov) over `n` parameters.
#[kernel]
pub unsafe fn sgd_step_f32(p: DevicePtrMut<f32>, g: DevicePtr<f32>, vel: DevicePtrMut<f32>, h: SgdStep) {
    let mut i = thread::global_idx_x() as usize;
    while i < h.n as usize {
        unsafe {
            let w = p.as_const().read(i);
            let mut gi = g.read(i) + h.weight_decay * w;
            if h.momentum != 0.0 {
                let v = if h.first != 0 { gi } else { h.momentum * vel.as_const().read(i) + gi };
                vel.write(i, v);
                gi = if h.nesterov != 0 { gi + h.momentum * v } else { v };
            }
            p.write(i, w - h.lr * gi);
        }
        i += thread::grid_stride_x() as usize;
    }
}
