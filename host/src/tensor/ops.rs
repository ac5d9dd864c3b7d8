//! Every tensor op: its forward (on the CPU reference backend) and, in [`Op::backward`], its
//! backward rule, written with the same tensor ops.

use super::cpu::{self, CpuStorage, Float, Map1, Map2, par_rows, unsupported};
use super::{DType, Shape, Storage, Tensor};
use crate::cuda::DeviceBuffer;
use crate::cuda::gemm::Layout;
use crate::error::{Error, Result};
use kiln_gpu::kernels::tensor_ops as k;
use rand::Rng;
use std::sync::Arc;

/// Elementwise functions of one tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    /// -x
    Neg,
    /// e^x
    Exp,
    /// ln x
    Log,
    /// sqrt x
    Sqrt,
    /// max(x, 0)
    Relu,
    /// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    Gelu,
    /// d GELU / dx
    GeluGrad,
    /// tanh x
    Tanh,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// 1 where x > 0, else 0
    Step,
    /// x + s
    AddScalar(f64),
    /// x * s
    MulScalar(f64),
}

impl Unary {
    /// The CUDA kernel's function code and scalar.
    fn cuda_code(self) -> (u32, f32) {
        match self {
            Unary::Neg => (k::unary::NEG, 0.0),
            Unary::Exp => (k::unary::EXP, 0.0),
            Unary::Log => (k::unary::LOG, 0.0),
            Unary::Sqrt => (k::unary::SQRT, 0.0),
            Unary::Relu => (k::unary::RELU, 0.0),
            Unary::Gelu => (k::unary::GELU, 0.0),
            Unary::GeluGrad => (k::unary::GELU_GRAD, 0.0),
            Unary::Tanh => (k::unary::TANH, 0.0),
            Unary::Sigmoid => (k::unary::SIGMOID, 0.0),
            Unary::Step => (k::unary::STEP, 0.0),
            Unary::AddScalar(s) => (k::unary::ADD_SCALAR, s as f32),
            Unary::MulScalar(s) => (k::unary::MUL_SCALAR, s as f32),
        }
    }
}

const GELU_C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
const GELU_A: f64 = 0.044_715;

impl Map1 for Unary {
    const OP: &'static str = "unary";
    fn f<T: Float>(&self, x: &[T]) -> Result<Vec<T>> {
        let c = T::from_f64(GELU_C);
        let a = T::from_f64(GELU_A);
        let half = T::from_f64(0.5);
        Ok(match *self {
            Unary::Neg => x.iter().map(|&v| -v).collect(),
            Unary::Exp => x.iter().map(|&v| v.exp()).collect(),
            Unary::Log => x.iter().map(|&v| v.ln()).collect(),
            Unary::Sqrt => x.iter().map(|&v| v.sqrt()).collect(),
            Unary::Relu => x.iter().map(|&v| if v > T::ZERO { v } else { T::ZERO }).collect(),
            Unary::Gelu => x.iter().map(|&v| half * v * (T::ONE + (c * (v + a * v * v * v)).tanh())).collect(),
            Unary::GeluGrad => x
                .iter()
                .map(|&v| {
                    let t = (c * (v + a * v * v * v)).tanh();
                    half * (T::ONE + t) + half * v * (T::ONE - t * t) * c * (T::ONE + T::from_f64(3.0) * a * v * v)
                })
                .collect(),
            Unary::Tanh => x.iter().map(|&v| v.tanh()).collect(),
            Unary::Sigmoid => x.iter().map(|&v| T::ONE / (T::ONE + (-v).exp())).collect(),
            Unary::Step => x.iter().map(|&v| if v > T::ZERO { T::ONE } else { T::ZERO }).collect(),
            Unary::AddScalar(s) => {
                let s = T::from_f64(s);
                x.iter().map(|&v| v + s).collect()
            }
            Unary::MulScalar(s) => {
                let s = T::from_f64(s);
                x.iter().map(|&v| v * s).collect()
            }
        })
    }
}

/// Elementwise functions of two tensors (with broadcasting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
}

impl Binary {
    fn cuda_code(self) -> u32 {
        match self {
            Binary::Add => k::binary::ADD,
            Binary::Sub => k::binary::SUB,
            Binary::Mul => k::binary::MUL,
            Binary::Div => k::binary::DIV,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
        }
    }
}

struct BroadcastBinary<'a> {
    op: Binary,
    a: &'a Shape,
    b: &'a Shape,
    out: &'a Shape,
}

/// Visits every index of `out` in row-major order, with the matching offsets into two inputs read
/// through (possibly zero) strides.
fn for_each_broadcast(out: &Shape, sa: &[usize], sb: &[usize], mut f: impl FnMut(usize, usize)) {
    let dims = out.dims();
    let n = out.elem_count();
    if n == 0 {
        return;
    }
    let r = dims.len();
    let mut idx = vec![0usize; r];
    let (mut oa, mut ob) = (0usize, 0usize);
    for _ in 0..n {
        f(oa, ob);
        // odometer increment
        for d in (0..r).rev() {
            idx[d] += 1;
            oa += sa[d];
            ob += sb[d];
            if idx[d] < dims[d] {
                break;
            }
            oa -= sa[d] * dims[d];
            ob -= sb[d] * dims[d];
            idx[d] = 0;
        }
    }
}

impl Map2 for BroadcastBinary<'_> {
    const OP: &'static str = "binary";
    fn f<T: Float>(&self, a: &[T], b: &[T]) -> Result<Vec<T>> {
        let apply = |x: T, y: T| match self.op {
            Binary::Add => x + y,
            Binary::Sub => x - y,
            Binary::Mul => x * y,
            Binary::Div => x / y,
        };
        if self.a == self.b {
            return Ok(a.iter().zip(b).map(|(&x, &y)| apply(x, y)).collect());
        }
        let (sa, sb) = (self.a.broadcast_strides(self.out), self.b.broadcast_strides(self.out));
        let mut out = Vec::with_capacity(self.out.elem_count());
        for_each_broadcast(self.out, &sa, &sb, |i, j| out.push(apply(a[i], b[j])));
        Ok(out)
    }
}

/// Sum of `x` (shape `from`) into shape `to`, where `from` is a broadcast of `to` (same rank after
/// left-padding with 1s). Accumulates in f64, in row-major order of `from`.
fn sum_into<T: Float>(x: &[T], from: &Shape, to: &Shape) -> Vec<T> {
    let padded = Shape([vec![1; from.rank() - to.rank()], to.dims().to_vec()].concat());
    let st = padded.broadcast_strides(from);
    let mut acc = vec![0.0f64; to.elem_count()];
    let zeros = vec![0; from.rank()];
    let mut k = 0;
    for_each_broadcast(from, &st, &zeros, |o, _| {
        acc[o] += x[k].to_f64();
        k += 1;
    });
    acc.into_iter().map(T::from_f64).collect()
}

/// Where a max op's argmax offsets live (host for CPU tensors, device for CUDA tensors).
pub enum ArgMax {
    /// Host offsets.
    Host(Vec<usize>),
    /// Device offsets.
    Device(DeviceBuffer<u32>),
}

/// The op that made a tensor, holding its inputs and whatever its backward needs.
#[derive(Clone)]
pub enum Op {
    /// Elementwise function of one input.
    Unary(Tensor, Unary),
    /// Elementwise function of two inputs, broadcast.
    Binary(Tensor, Tensor, Binary),
    /// Matrix product (2-D, or batched 3-D).
    Matmul(Tensor, Tensor),
    /// `x w^T` with `w` (N x K) 2-D: a Linear layer's product, `w` read in place.
    MatmulT(Tensor, Tensor),
    /// Sum over dimensions.
    Sum {
        /// Input.
        x: Tensor,
        /// Reduced dimensions (sorted).
        dims: Vec<usize>,
        /// Whether reduced dimensions were kept as 1.
        keepdim: bool,
    },
    /// Maximum along one dimension.
    Max {
        /// Input.
        x: Tensor,
        /// The dimension.
        dim: usize,
        /// Whether it was kept as 1.
        keepdim: bool,
        /// For each output element, the input offset of the (first) maximum.
        argmax: Arc<ArgMax>,
    },
    /// Broadcast to a larger shape.
    Expand(Tensor),
    /// Sum down to a smaller shape (the reverse of `Expand`).
    SumTo(Tensor),
    /// Same data, new shape.
    Reshape(Tensor),
    /// Two dimensions swapped (materialized).
    Transpose(Tensor, usize, usize),
    /// Softmax over the last dimension.
    Softmax(Tensor),
    /// Log-softmax over the last dimension.
    LogSoftmax(Tensor),
    /// Mean cross-entropy of logits (N x C) with integer targets.
    CrossEntropy {
        /// Logits.
        logits: Tensor,
        /// Class per row (with its device copy, shared by the forward and the backward).
        targets: super::Targets,
    },
    /// Layer normalization over the last dimension.
    LayerNorm {
        /// Input.
        x: Tensor,
        /// Scale (D).
        weight: Tensor,
        /// Shift (D).
        bias: Tensor,
        /// Per-row mean, shape (..., 1).
        mean: Tensor,
        /// Per-row 1 / sqrt(var + eps), shape (..., 1).
        rstd: Tensor,
    },
    /// Rows of `weight` gathered by index.
    Embedding {
        /// The table (V x D).
        weight: Tensor,
        /// Row per output position.
        ids: Arc<Vec<usize>>,
    },
    /// `x * mask` with a seeded keep-mask already scaled by 1 / (1 - p).
    Dropout(Tensor, Tensor),
    /// dtype conversion.
    ToDType(Tensor),
    /// Copy to another device.
    ToDevice(Tensor),
}

impl Op {
    /// A short name for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary(..) => "unary",
            Op::Binary(_, _, b) => b.name(),
            Op::Matmul(..) => "matmul",
            Op::MatmulT(..) => "matmul_t",
            Op::Sum { .. } => "sum",
            Op::Max { .. } => "max",
            Op::Expand(_) => "expand",
            Op::SumTo(_) => "sum_to",
            Op::Reshape(_) => "reshape",
            Op::Transpose(..) => "transpose",
            Op::Softmax(_) => "softmax",
            Op::LogSoftmax(_) => "log_softmax",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Embedding { .. } => "embedding",
            Op::Dropout(..) => "dropout",
            Op::ToDType(_) => "to_dtype",
            Op::ToDevice(_) => "to_device",
        }
    }

    /// The inputs gradients flow to.
    pub fn inputs(&self) -> Vec<&Tensor> {
        match self {
            Op::Unary(x, _)
            | Op::Expand(x)
            | Op::SumTo(x)
            | Op::Reshape(x)
            | Op::Transpose(x, ..)
            | Op::Softmax(x)
            | Op::LogSoftmax(x)
            | Op::Dropout(x, _)
            | Op::ToDType(x)
            | Op::ToDevice(x) => vec![x],
            Op::Binary(a, b, _) | Op::Matmul(a, b) | Op::MatmulT(a, b) => vec![a, b],
            Op::Sum { x, .. } | Op::Max { x, .. } => vec![x],
            Op::CrossEntropy { logits, .. } => vec![logits],
            Op::LayerNorm { x, weight, bias, .. } => vec![x, weight, bias],
            Op::Embedding { weight, .. } => vec![weight],
        }
    }

    /// The tensors the op holds, by value (for dropping a graph without recursion).
    pub(crate) fn into_inputs(self) -> Vec<Tensor> {
        match self {
            Op::Unary(x, _)
            | Op::Expand(x)
            | Op::SumTo(x)
            | Op::Reshape(x)
            | Op::Transpose(x, ..)
            | Op::Softmax(x)
            | Op::LogSoftmax(x)
            | Op::ToDType(x)
            | Op::ToDevice(x)
            | Op::Sum { x, .. }
            | Op::Max { x, .. } => vec![x],
            Op::Dropout(x, m) => vec![x, m],
            Op::Binary(a, b, _) | Op::Matmul(a, b) | Op::MatmulT(a, b) => vec![a, b],
            Op::CrossEntropy { logits, .. } => vec![logits],
            Op::LayerNorm { x, weight, bias, mean, rstd } => vec![x, weight, bias, mean, rstd],
            Op::Embedding { weight, .. } => vec![weight],
        }
    }

    /// The backward rule: given the op's output `out` and the gradient `g` of the loss with respect
    /// to it, the gradient with respect to each input.
    pub(crate) fn backward(&self, out: &Tensor, g: &Tensor) -> Result<Vec<(Tensor, Tensor)>> {
        Ok(match self {
            Op::Unary(x, u) => {
                let gx = match *u {
                    Unary::Neg => g.neg()?,
                    Unary::Exp => g.mul(out)?,
                    Unary::Log => g.div(x)?,
                    Unary::Sqrt => g.div(&out.mul_scalar(2.0)?)?,
                    Unary::Relu => g.mul(&x.unary(Unary::Step)?)?,
                    Unary::Gelu => g.mul(&x.unary(Unary::GeluGrad)?)?,
                    Unary::Tanh => g.mul(&out.mul(out)?.neg()?.add_scalar(1.0)?)?,
                    Unary::Sigmoid => g.mul(&out.mul(&out.neg()?.add_scalar(1.0)?)?)?,
                    Unary::AddScalar(_) => g.clone(),
                    Unary::MulScalar(s) => g.mul_scalar(s)?,
                    Unary::Step | Unary::GeluGrad => {
                        return Err(Error::Unsupported { op: "backward", what: format!("differentiating {u:?}") });
                    }
                };
                vec![(x.clone(), gx)]
            }
            Op::Binary(a, b, op) => {
                let (ga, gb) = match op {
                    Binary::Add => (g.clone(), g.clone()),
                    Binary::Sub => (g.clone(), g.neg()?),
                    Binary::Mul => (g.mul(b)?, g.mul(a)?),
                    Binary::Div => (g.div(b)?, g.mul(a)?.div(&b.mul(b)?)?.neg()?),
                };
                vec![(a.clone(), ga.sum_to(a.shape())?), (b.clone(), gb.sum_to(b.shape())?)]
            }
            Op::Matmul(a, b) => {
                // On CUDA, f32 products against a 2-D b read the transposed operand in place (the
                // ladder's NT and TN rungs: the same chains as transposing first, bit for bit);
                // each gradient falls back to a transposed copy on its own.
                let (k, n) = (a.dims()[a.shape().rank() - 1], g.dims()[g.shape().rank() - 1]);
                let rows = a.elem_count() / k.max(1);
                let two_d = b.shape().rank() == 2;
                // da (rows x k) = g (rows x n) b^T, b stored k x n
                let ga = if two_d { product_in_place(g, b, (rows, n, k), Layout::NT, a.shape())? } else { None };
                let ga = match ga {
                    Some(ga) => ga,
                    None => g.matmul(&b.transpose(-1, -2)?)?,
                };
                // db (k x n) = a^T g over all rows, a stored rows x k
                let gb = if two_d { product_in_place(a, g, (k, rows, n), Layout::TN, b.shape())? } else { None };
                let gb = match gb {
                    Some(gb) => gb,
                    None if a.shape().rank() == 3 && two_d => {
                        a.reshape([rows, k])?.transpose(0, 1)?.matmul(&g.reshape([rows, n])?)?
                    }
                    None => a.transpose(-1, -2)?.matmul(g)?,
                };
                vec![(a.clone(), ga), (b.clone(), gb)]
            }
            Op::MatmulT(x, w) => {
                // y = x w^T: dx = g w (NN); dw (n x k) = g^T x over all rows (TN, in place on CUDA).
                let (n, k) = (w.dims()[0], w.dims()[1]);
                let rows = x.elem_count() / k.max(1);
                let gx = g.matmul(w)?;
                let gw = match product_in_place(g, x, (n, rows, k), Layout::TN, w.shape())? {
                    Some(gw) => gw,
                    None => g.reshape([rows, n])?.transpose(0, 1)?.matmul(&x.reshape([rows, k])?)?,
                };
                vec![(x.clone(), gx), (w.clone(), gw)]
            }
            Op::Sum { x, dims, keepdim } => {
                let kept = if *keepdim { g.clone() } else { g.reshape(keep_shape(x.shape(), dims))? };
                vec![(x.clone(), kept.expand(x.shape())?)]
            }
            Op::Max { x, argmax, .. } => {
                let gx = match (&**argmax, &*g.storage()) {
                    (ArgMax::Host(arg), Storage::Cpu(gs)) => {
                        let gv = gs.to_f64_vec();
                        let mut gx = vec![0.0; x.elem_count()];
                        for (o, &src) in arg.iter().enumerate() {
                            gx[src] += gv[o];
                        }
                        Tensor::from_f64(&gx, x.shape().clone(), x.dtype())?
                    }
                    (ArgMax::Device(arg), Storage::Cuda(gs)) => Tensor::from_storage(
                        Storage::Cuda(gs.scatter_argmax(arg, x.elem_count())?),
                        x.shape().clone(),
                        None,
                    ),
                    _ => return Err(Error::Device { op: "max backward", a: x.device().name(), b: g.device().name() }),
                };
                vec![(x.clone(), gx)]
            }
            Op::Expand(x) => vec![(x.clone(), g.sum_to(x.shape())?)],
            Op::SumTo(x) => vec![(x.clone(), g.expand(x.shape())?)],
            Op::Reshape(x) => vec![(x.clone(), g.reshape(x.shape().clone())?)],
            Op::Transpose(x, d0, d1) => vec![(x.clone(), g.transpose(*d0 as isize, *d1 as isize)?)],
            Op::Softmax(x) => {
                let dot = g.mul(out)?.sum_keepdim(-1)?;
                vec![(x.clone(), out.mul(&g.sub(&dot)?)?)]
            }
            Op::LogSoftmax(x) => {
                let s = g.sum_keepdim(-1)?;
                vec![(x.clone(), g.sub(&out.exp()?.mul(&s)?)?)]
            }
            Op::CrossEntropy { logits, targets } => {
                if let (Storage::Cuda(ls), Storage::Cuda(gs)) = (&*logits.storage(), &*g.storage()) {
                    let gl = ls.cross_entropy_backward(targets, logits.dims()[1], gs)?;
                    return Ok(vec![(
                        logits.clone(),
                        Tensor::from_storage(Storage::Cuda(gl), logits.shape().clone(), None),
                    )]);
                }
                let n = logits.dims()[0];
                let p = logits.softmax()?;
                let onehot = one_hot(targets.as_slice(), logits.dims()[1], logits.dtype())?;
                let gl = p.sub(&onehot)?.mul_scalar(1.0 / n as f64)?.mul(g)?;
                vec![(logits.clone(), gl)]
            }
            Op::LayerNorm { x, weight, bias, mean, rstd } => {
                let xhat = x.sub(mean)?.mul(rstd)?;
                let gxhat = g.mul(weight)?;
                let m1 = gxhat.mean_keepdim(-1)?;
                let m2 = gxhat.mul(&xhat)?.mean_keepdim(-1)?;
                let gx = gxhat.sub(&m1)?.sub(&xhat.mul(&m2)?)?.mul(rstd)?;
                let gw = g.mul(&xhat)?.sum_to(weight.shape())?;
                let gb = g.sum_to(bias.shape())?;
                vec![(x.clone(), gx), (weight.clone(), gw), (bias.clone(), gb)]
            }
            Op::Embedding { weight, ids } => {
                let (v, d) = (weight.dims()[0], weight.dims()[1]);
                let gw = match &*g.storage() {
                    Storage::Cpu(gs) => {
                        let gv = gs.to_f64_vec();
                        let mut gw = vec![0.0; weight.elem_count()];
                        // Deterministic scatter-add: positions in order, one thread.
                        for (pos, &row) in ids.iter().enumerate() {
                            for c in 0..d {
                                gw[row * d + c] += gv[pos * d + c];
                            }
                        }
                        Tensor::from_f64(&gw, weight.shape().clone(), weight.dtype())?
                    }
                    Storage::Cuda(gs) => Tensor::from_storage(
                        Storage::Cuda(gs.embedding_backward(ids, v, d)?),
                        weight.shape().clone(),
                        None,
                    ),
                };
                vec![(weight.clone(), gw)]
            }
            Op::Dropout(x, mask) => vec![(x.clone(), g.mul(mask)?)],
            Op::ToDType(x) => vec![(x.clone(), g.to_dtype(x.dtype())?)],
            Op::ToDevice(x) => vec![(x.clone(), g.to_device(&x.device())?)],
        })
    }
}

fn keep_shape(s: &Shape, dims: &[usize]) -> Shape {
    Shape(s.dims().iter().enumerate().map(|(i, &d)| if dims.contains(&i) { 1 } else { d }).collect())
}

fn one_hot(targets: &[usize], classes: usize, dtype: DType) -> Result<Tensor> {
    let mut v = vec![0.0; targets.len() * classes];
    for (i, &t) in targets.iter().enumerate() {
        v[i * classes + t] = 1.0;
    }
    Tensor::from_f64(&v, [targets.len(), classes], dtype)
}

/// Applies `f(row_index, row, out_row)` to every row of length `d`, rows in parallel.
fn map_rows<T: Float>(x: &[T], d: usize, f: impl Fn(usize, &[T], &mut [T]) + Sync) -> Vec<T> {
    let mut out = vec![T::ZERO; x.len()];
    par_rows(&mut out, d, d * 8, |row0, chunk| {
        for (r, orow) in chunk.chunks_mut(d).enumerate() {
            let i = row0 + r;
            f(i, &x[i * d..(i + 1) * d], orow);
        }
    });
    out
}

struct SoftmaxRows {
    log: bool,
    d: usize,
}
impl Map1 for SoftmaxRows {
    const OP: &'static str = "softmax";
    fn f<T: Float>(&self, x: &[T]) -> Result<Vec<T>> {
        Ok(map_rows(x, self.d, |_, row, out| {
            let m = row.iter().fold(T::from_f64(f64::NEG_INFINITY), |a, &b| a.maxf(b));
            let mut s = 0.0f64;
            for &v in row {
                s += (v - m).exp().to_f64();
            }
            if self.log {
                let ls = T::from_f64(s.ln());
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = v - m - ls;
                }
            } else {
                let inv = T::from_f64(1.0 / s);
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = (v - m).exp() * inv;
                }
            }
        }))
    }
}

struct Transpose2<'a> {
    shape: &'a Shape,
    d0: usize,
    d1: usize,
}
impl Map1 for Transpose2<'_> {
    const OP: &'static str = "transpose";
    fn f<T: Float>(&self, x: &[T]) -> Result<Vec<T>> {
        let mut out_dims = self.shape.dims().to_vec();
        out_dims.swap(self.d0, self.d1);
        let out = Shape(out_dims);
        // Read the input through permuted strides while walking the output in order.
        let mut s = self.shape.strides();
        s.swap(self.d0, self.d1);
        let zeros = vec![0; out.rank()];
        let mut v = Vec::with_capacity(x.len());
        for_each_broadcast(&out, &s, &zeros, |i, _| v.push(x[i]));
        Ok(v)
    }
}

struct LayerNormFwd {
    d: usize,
    eps: f64,
}
impl LayerNormFwd {
    /// Normalized rows, with per-row mean and rstd from Welford's algorithm (in f64).
    fn run<T: Float>(&self, x: &[T], w: &[T], b: &[T]) -> (Vec<T>, Vec<T>, Vec<T>) {
        let d = self.d;
        let rows = x.len() / d;
        let mut mean = vec![T::ZERO; rows];
        let mut rstd = vec![T::ZERO; rows];
        for r in 0..rows {
            let (mut m, mut m2) = (0.0f64, 0.0f64);
            for (i, &v) in x[r * d..(r + 1) * d].iter().enumerate() {
                let v = v.to_f64();
                let delta = v - m;
                m += delta / (i + 1) as f64;
                m2 += delta * (v - m);
            }
            mean[r] = T::from_f64(m);
            rstd[r] = T::from_f64(1.0 / (m2 / d as f64 + self.eps).sqrt());
        }
        let out = map_rows(x, d, |r, row, o| {
            for c in 0..d {
                o[c] = (row[c] - mean[r]) * rstd[r] * w[c] + b[c];
            }
        });
        (out, mean, rstd)
    }
}

impl Tensor {
    pub(crate) fn unary(&self, u: Unary) -> Result<Tensor> {
        let data = match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(u.map(s)?),
            Storage::Cuda(s) => {
                let (code, scalar) = u.cuda_code();
                Storage::Cuda(s.unary(code, scalar)?)
            }
        };
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::Unary(self.clone(), u))))
    }
    fn binary(&self, other: &Tensor, op: Binary) -> Result<Tensor> {
        let out = Shape::broadcast(op.name(), self.shape(), other.shape())?;
        let data = match (&*self.storage(), &*other.storage()) {
            (Storage::Cpu(a), Storage::Cpu(b)) => {
                Storage::Cpu(BroadcastBinary { op, a: self.shape(), b: other.shape(), out: &out }.map(a, b).map_err(
                    |e| match e {
                        Error::DType { got, expected, .. } => Error::DType { op: op.name(), got, expected },
                        e => e,
                    },
                )?)
            }
            (Storage::Cuda(a), Storage::Cuda(b)) => {
                Storage::Cuda(a.binary(self.shape(), b, other.shape(), &out, op.cuda_code())?)
            }
            (a, b) => return Err(Error::Device { op: op.name(), a: a.device().name(), b: b.device().name() }),
        };
        Ok(Tensor::from_storage(data, out, Some(Op::Binary(self.clone(), other.clone(), op))))
    }

    /// `self + other`, broadcasting.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Add)
    }
    /// `self - other`, broadcasting.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Sub)
    }
    /// `self * other`, broadcasting.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Mul)
    }
    /// `self / other`, broadcasting.
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Div)
    }
    /// `-self`.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(Unary::Neg)
    }
    /// `self + s`.
    pub fn add_scalar(&self, s: f64) -> Result<Tensor> {
        self.unary(Unary::AddScalar(s))
    }
    /// `self * s`.
    pub fn mul_scalar(&self, s: f64) -> Result<Tensor> {
        self.unary(Unary::MulScalar(s))
    }
    /// e^x.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(Unary::Exp)
    }
    /// ln x.
    pub fn log(&self) -> Result<Tensor> {
        self.unary(Unary::Log)
    }
    /// sqrt x.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(Unary::Sqrt)
    }
    /// max(x, 0).
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(Unary::Relu)
    }
    /// GELU (tanh form).
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(Unary::Gelu)
    }
    /// tanh x.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(Unary::Tanh)
    }
    /// The logistic sigmoid.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(Unary::Sigmoid)
    }

    /// Matrix product: (M, K) x (K, N), (B, M, K) x (B, K, N) or (B, M, K) x (K, N). bf16 and f16
    /// inputs are multiplied in f32 and rounded once to the input dtype.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let (a, b) = (self.dims(), other.dims());
        let bad = || Error::shape("matmul", format!("cannot multiply {} by {}", self.shape(), other.shape()));
        let (batch, m, k, n, b_batched, out_shape) = match (a.len(), b.len()) {
            (2, 2) if a[1] == b[0] => (1, a[0], a[1], b[1], false, vec![a[0], b[1]]),
            (3, 3) if a[0] == b[0] && a[2] == b[1] => (a[0], a[1], a[2], b[2], true, vec![a[0], a[1], b[2]]),
            (3, 2) if a[2] == b[0] => (a[0], a[1], a[2], b[1], false, vec![a[0], a[1], b[1]]),
            _ => return Err(bad()),
        };
        if self.dtype() != other.dtype() {
            return Err(Error::DType { op: "matmul", got: other.dtype(), expected: self.dtype() });
        }
        let data = matmul_data(&self.storage(), &other.storage(), batch, m, k, n, b_batched)?;
        Ok(Tensor::from_storage(data, Shape(out_shape), Some(Op::Matmul(self.clone(), other.clone()))))
    }

    /// `self w^T` for a 2-D `w` (N x K): (M, K) -> (M, N), or (B, M, K) -> (B, M, N). A Linear
    /// layer's forward. On CUDA an f32 product reads `w` in place (the GEMM ladder's NT rung, the
    /// same bits as `matmul` of the transposed copy); elsewhere, or where the rows are not 16-byte
    /// multiples, it multiplies a transposed copy. Its backward is `dx = g w`, `dw = g^T x`. Under
    /// [`MatmulPrecision::Bf16`](crate::cuda::MatmulPrecision) (this thread's setting) the CUDA
    /// products of the forward and both gradients run on the tensor cores in bf16, any shape.
    pub fn matmul_t(&self, w: &Tensor) -> Result<Tensor> {
        let (a, b) = (self.dims(), w.dims());
        if b.len() != 2 || !matches!(a.len(), 2 | 3) || a[a.len() - 1] != b[1] {
            return Err(Error::shape(
                "matmul_t",
                format!("cannot multiply {} by the transpose of {}", self.shape(), w.shape()),
            ));
        }
        if self.dtype() != w.dtype() {
            return Err(Error::DType { op: "matmul_t", got: w.dtype(), expected: self.dtype() });
        }
        let (n, k) = (b[0], b[1]);
        let rows = self.shape().elem_count() / k.max(1);
        let mut out_shape = a.to_vec();
        *out_shape.last_mut().expect("rank 2 or 3") = n;
        let data = match layout_data(self, w, (rows, k, n), Layout::NT)? {
            Some(data) => data,
            None => matmul_data(&self.storage(), &w.transpose_data(0, 1)?, 1, rows, k, n, false)?,
        };
        Ok(Tensor::from_storage(data, Shape(out_shape), Some(Op::MatmulT(self.clone(), w.clone()))))
    }

    fn reduce_sum(&self, dims: &[usize], keepdim: bool) -> Result<Tensor> {
        let mut dims = dims.to_vec();
        dims.sort_unstable();
        dims.dedup();
        let kept = keep_shape(self.shape(), &dims);
        let data = self.sum_storage("sum", &kept)?;
        let out = if keepdim {
            kept
        } else {
            Shape(self.dims().iter().enumerate().filter(|(i, _)| !dims.contains(i)).map(|(_, &d)| d).collect())
        };
        Ok(Tensor::from_storage(data, out, Some(Op::Sum { x: self.clone(), dims, keepdim })))
    }

    /// The data summed from this shape into `to` (which broadcasts to it), on either backend.
    fn sum_storage(&self, op: &'static str, to: &Shape) -> Result<Storage> {
        Ok(match &*self.storage() {
            Storage::Cpu(CpuStorage::F32(v)) => Storage::Cpu(CpuStorage::F32(sum_into(v, self.shape(), to))),
            Storage::Cpu(CpuStorage::F64(v)) => Storage::Cpu(CpuStorage::F64(sum_into(v, self.shape(), to))),
            Storage::Cpu(other) => return Err(unsupported(op, other.dtype())),
            Storage::Cuda(s) => Storage::Cuda(s.sum_into(self.shape(), to)?),
        })
    }

    /// Sum of every element (a scalar).
    pub fn sum_all(&self) -> Result<Tensor> {
        let dims: Vec<usize> = (0..self.shape().rank()).collect();
        self.reduce_sum(&dims, false)
    }
    /// Mean of every element.
    pub fn mean_all(&self) -> Result<Tensor> {
        if self.elem_count() == 0 {
            return Err(Error::shape("mean", "mean of an empty tensor"));
        }
        self.sum_all()?.mul_scalar(1.0 / self.elem_count() as f64)
    }
    /// Sum along `dim` (negative counts from the end), optionally keeping it as size 1.
    pub fn sum_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = self.shape().dim("sum", dim)?;
        self.reduce_sum(&[d], keepdim)
    }
    /// Sum along `dim`, kept as size 1.
    pub fn sum_keepdim(&self, dim: isize) -> Result<Tensor> {
        self.sum_dim(dim, true)
    }
    /// Mean along `dim`, optionally keeping it.
    pub fn mean_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = self.shape().dim("mean", dim)?;
        let n = self.dims()[d];
        if n == 0 {
            return Err(Error::shape("mean", format!("dimension {dim} of {} is empty", self.shape())));
        }
        self.reduce_sum(&[d], keepdim)?.mul_scalar(1.0 / n as f64)
    }
    /// Mean along `dim`, kept as size 1.
    pub fn mean_keepdim(&self, dim: isize) -> Result<Tensor> {
        self.mean_dim(dim, true)
    }

    /// Maximum along `dim` (the gradient goes to the first maximal element).
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = self.shape().dim("max", dim)?;
        let dims = self.dims();
        if dims[d] == 0 {
            return Err(Error::shape("max", format!("dimension {dim} of {} is empty", self.shape())));
        }
        let (outer, len, inner) =
            (dims[..d].iter().product::<usize>(), dims[d], dims[d + 1..].iter().product::<usize>());
        let out = if keepdim {
            keep_shape(self.shape(), &[d])
        } else {
            Shape(dims.iter().enumerate().filter(|(i, _)| *i != d).map(|(_, &x)| x).collect())
        };
        if let Storage::Cuda(s) = &*self.storage() {
            let (vals, arg) = s.max_dim(outer, len, inner)?;
            let op = Op::Max { x: self.clone(), dim: d, keepdim, argmax: Arc::new(ArgMax::Device(arg)) };
            return Ok(Tensor::from_storage(Storage::Cuda(vals), out, Some(op)));
        }
        let v = self.try_to_vec_f64()?;
        let mut vals = Vec::with_capacity(outer * inner);
        let mut arg = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            for i in 0..inner {
                let mut best = o * len * inner + i;
                for j in 1..len {
                    let idx = (o * len + j) * inner + i;
                    if v[idx] > v[best] || (v[idx].is_nan() && !v[best].is_nan()) {
                        best = idx;
                    }
                }
                vals.push(v[best]);
                arg.push(best);
            }
        }
        let data = CpuStorage::from_f64(self.dtype(), &vals);
        let op = Op::Max { x: self.clone(), dim: d, keepdim, argmax: Arc::new(ArgMax::Host(arg)) };
        Ok(Tensor::from_cpu(data, out, Some(op)))
    }

    /// Index of the maximum along the last dimension, per row (no gradient).
    pub fn argmax_last(&self) -> Result<Vec<usize>> {
        let d = self.shape().last();
        if d == 0 || self.shape().rank() == 0 {
            return Err(Error::shape("argmax", format!("empty last dimension in {}", self.shape())));
        }
        if let Storage::Cuda(s) = &*self.storage() {
            // the max kernel's offsets, downloaded: row r's offset is r * d + column
            let (_, arg) = s.max_dim(self.elem_count() / d, d, 1)?;
            return Ok(s.dev.download(&arg)?.into_iter().map(|off| off as usize % d).collect());
        }
        Ok(self
            .try_to_vec_f64()?
            .chunks(d)
            .map(|r| r.iter().enumerate().fold(0, |best, (i, &x)| if x > r[best] { i } else { best }))
            .collect())
    }

    /// Broadcasts to `shape` (a larger shape this one broadcasts to).
    pub fn expand(&self, shape: &Shape) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        let b = Shape::broadcast("expand", self.shape(), shape)?;
        if &b != shape {
            return Err(Error::shape("expand", format!("{} does not broadcast to {shape}", self.shape())));
        }
        let data = match &*self.storage() {
            Storage::Cpu(a) => {
                let zero = CpuStorage::from_f64(self.dtype(), &vec![0.0; shape.elem_count()]);
                Storage::Cpu(BroadcastBinary { op: Binary::Add, a: self.shape(), b: shape, out: shape }.map(a, &zero)?)
            }
            Storage::Cuda(a) => Storage::Cuda(a.strided_copy(shape, &self.shape().broadcast_strides(shape))?),
        };
        Ok(Tensor::from_storage(data, shape.clone(), Some(Op::Expand(self.clone()))))
    }

    /// Sums down to `shape` (which must broadcast to this tensor's shape): the gradient of a
    /// broadcast.
    pub fn sum_to(&self, shape: &Shape) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        if shape.rank() > self.shape().rank() || &Shape::broadcast("sum_to", shape, self.shape())? != self.shape() {
            return Err(Error::shape("sum_to", format!("{shape} does not broadcast to {}", self.shape())));
        }
        let data = self.sum_storage("sum_to", shape)?;
        Ok(Tensor::from_storage(data, shape.clone(), Some(Op::SumTo(self.clone()))))
    }

    /// The same elements in a new shape (`view`; the data is contiguous, so nothing moves).
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if shape.elem_count() != self.elem_count() {
            return Err(Error::shape(
                "reshape",
                format!("cannot view {} ({} elements) as {shape}", self.shape(), self.elem_count()),
            ));
        }
        let data = self.storage().try_clone()?;
        Ok(Tensor::from_storage(data, shape, Some(Op::Reshape(self.clone()))))
    }
    /// Alias of [`Tensor::reshape`].
    pub fn view(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        self.reshape(shape)
    }

    /// Swaps two dimensions (materialized).
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let (a, b) = (self.shape().dim("transpose", d0)?, self.shape().dim("transpose", d1)?);
        if a == b {
            return Ok(self.clone());
        }
        let mut dims = self.dims().to_vec();
        dims.swap(a, b);
        let data = self.transpose_data(a, b)?;
        Ok(Tensor::from_storage(data, Shape(dims), Some(Op::Transpose(self.clone(), a, b))))
    }

    /// The data of this tensor with dimensions `a` and `b` (resolved) swapped, materialized.
    fn transpose_data(&self, a: usize, b: usize) -> Result<Storage> {
        let mut dims = self.dims().to_vec();
        dims.swap(a, b);
        Ok(match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(Transpose2 { shape: self.shape(), d0: a, d1: b }.map(s)?),
            Storage::Cuda(s) => {
                let mut strides = self.shape().strides();
                strides.swap(a, b);
                Storage::Cuda(s.strided_copy(&Shape(dims), &strides)?)
            }
        })
    }

    fn last_dim_op(&self, op: &'static str) -> Result<usize> {
        if self.shape().rank() == 0 || self.shape().last() == 0 {
            return Err(Error::shape(op, format!("needs a non-empty last dimension, got {}", self.shape())));
        }
        Ok(self.shape().last())
    }

    /// Softmax over the last dimension (max-subtracted).
    pub fn softmax(&self) -> Result<Tensor> {
        let d = self.last_dim_op("softmax")?;
        let data = match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(SoftmaxRows { log: false, d }.map(s)?),
            Storage::Cuda(s) => Storage::Cuda(s.softmax(d, false)?),
        };
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::Softmax(self.clone()))))
    }
    /// Log-softmax over the last dimension (max-subtracted).
    pub fn log_softmax(&self) -> Result<Tensor> {
        let d = self.last_dim_op("log_softmax")?;
        let data = match &*self.storage() {
            Storage::Cpu(s) => Storage::Cpu(SoftmaxRows { log: true, d }.map(s)?),
            Storage::Cuda(s) => Storage::Cuda(s.softmax(d, true)?),
        };
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::LogSoftmax(self.clone()))))
    }

    /// Mean cross-entropy of `self` (logits, N x C) against class indices (one per row), fused and
    /// stable (log-sum-exp with the row maximum subtracted). `targets` is a `&[usize]` or a
    /// [`Targets`](super::Targets), which keeps its device copy across calls.
    pub fn cross_entropy(&self, targets: impl Into<super::Targets>) -> Result<Tensor> {
        let targets: super::Targets = targets.into();
        let op = "cross_entropy";
        if self.shape().rank() != 2 {
            return Err(Error::shape(op, format!("logits must be (N, C), got {}", self.shape())));
        }
        let (n, c) = (self.dims()[0], self.dims()[1]);
        if n == 0 || c == 0 {
            return Err(Error::shape(op, format!("empty logits {}", self.shape())));
        }
        if targets.len() != n {
            return Err(Error::shape(op, format!("{} targets for {n} rows of logits {}", targets.len(), self.shape())));
        }
        if targets.max().is_some_and(|m| m >= c)
            && let Some((i, &t)) = targets.as_slice().iter().enumerate().find(|(_, t)| **t >= c)
        {
            return Err(Error::Index { op, msg: format!("target {t} at row {i} is out of range for {c} classes") });
        }
        let op = Op::CrossEntropy { logits: self.clone(), targets: targets.clone() };
        if let Storage::Cuda(s) = &*self.storage() {
            return Ok(Tensor::from_storage(Storage::Cuda(s.cross_entropy(&targets, c)?), Shape(vec![]), Some(op)));
        }
        let logp = {
            let _g = super::no_grad();
            self.log_softmax()?.try_to_vec_f64()?
        };
        let loss: f64 = targets.as_slice().iter().enumerate().map(|(i, &t)| -logp[i * c + t]).sum::<f64>() / n as f64;
        Ok(Tensor::from_cpu(CpuStorage::from_f64(self.dtype(), &[loss]), Shape(vec![]), Some(op)))
    }

    /// Mean squared error against `target` (same shape).
    pub fn mse(&self, target: &Tensor) -> Result<Tensor> {
        if self.shape() != target.shape() {
            return Err(Error::shape(
                "mse",
                format!("prediction {} and target {} differ", self.shape(), target.shape()),
            ));
        }
        let d = self.sub(target)?;
        d.mul(&d)?.mean_all()
    }

    /// Layer normalization over the last dimension with affine `weight` and `bias` (both of the last
    /// dimension's size), statistics by Welford's algorithm.
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        let op = "layer_norm";
        let d = self.last_dim_op(op)?;
        if weight.dims() != [d] || bias.dims() != [d] {
            return Err(Error::shape(
                op,
                format!(
                    "input {} needs weight and bias of shape [{d}], got {} and {}",
                    self.shape(),
                    weight.shape(),
                    bias.shape()
                ),
            ));
        }
        let stat_shape = keep_shape(self.shape(), &[self.shape().rank() - 1]);
        let devs = [self.device(), weight.device(), bias.device()];
        if let Some(other) = devs[1..].iter().find(|d| **d != devs[0]) {
            return Err(Error::Device { op, a: devs[0].name(), b: other.name() });
        }
        if let (Storage::Cuda(x), Storage::Cuda(w), Storage::Cuda(b)) =
            (&*self.storage(), &*weight.storage(), &*bias.storage())
        {
            let (out, mean, rstd) = x.layer_norm(w, b, d, eps)?;
            let mean = Tensor::from_storage(Storage::Cuda(mean), stat_shape.clone(), None);
            let rstd = Tensor::from_storage(Storage::Cuda(rstd), stat_shape, None);
            let op = Op::LayerNorm { x: self.clone(), weight: weight.clone(), bias: bias.clone(), mean, rstd };
            return Ok(Tensor::from_storage(Storage::Cuda(out), self.shape().clone(), Some(op)));
        }
        let f = LayerNormFwd { d, eps };
        let (out, mean, rstd) = {
            let (x, w, b) = (self.storage().to_cpu()?, weight.storage().to_cpu()?, bias.storage().to_cpu()?);
            match (&x, &w, &b) {
                (CpuStorage::F32(x), CpuStorage::F32(w), CpuStorage::F32(b)) => {
                    let (o, m, r) = f.run(x, w, b);
                    (CpuStorage::F32(o), CpuStorage::F32(m), CpuStorage::F32(r))
                }
                (CpuStorage::F64(x), CpuStorage::F64(w), CpuStorage::F64(b)) => {
                    let (o, m, r) = f.run(x, w, b);
                    (CpuStorage::F64(o), CpuStorage::F64(m), CpuStorage::F64(r))
                }
                (x, w, _) if x.dtype() != w.dtype() => {
                    return Err(Error::DType { op, got: w.dtype(), expected: x.dtype() });
                }
                (x, _, b) if x.dtype() != b.dtype() => {
                    return Err(Error::DType { op, got: b.dtype(), expected: x.dtype() });
                }
                (x, ..) => return Err(unsupported(op, x.dtype())),
            }
        };

        let mean = Tensor::from_cpu(mean, stat_shape.clone(), None);
        let rstd = Tensor::from_cpu(rstd, stat_shape, None);
        Ok(Tensor::from_cpu(
            out,
            self.shape().clone(),
            Some(Op::LayerNorm { x: self.clone(), weight: weight.clone(), bias: bias.clone(), mean, rstd }),
        ))
    }

    /// Rows of `self` (a V x D table) for each id; the output has shape `ids_shape + [D]`.
    pub fn embedding(&self, ids: &[usize], ids_shape: impl Into<Shape>) -> Result<Tensor> {
        let op = "embedding";
        let ids_shape = ids_shape.into();
        if self.shape().rank() != 2 {
            return Err(Error::shape(op, format!("the table must be (V, D), got {}", self.shape())));
        }
        if ids_shape.elem_count() != ids.len() {
            return Err(Error::shape(op, format!("{} ids do not fill shape {ids_shape}", ids.len())));
        }
        let (v, d) = (self.dims()[0], self.dims()[1]);
        if let Some((i, &id)) = ids.iter().enumerate().find(|(_, x)| **x >= v) {
            return Err(Error::Index {
                op,
                msg: format!("id {id} at position {i} is out of range for a table of {v} rows"),
            });
        }
        let mut dims = ids_shape.dims().to_vec();
        dims.push(d);
        let op = Op::Embedding { weight: self.clone(), ids: Arc::new(ids.to_vec()) };
        if let Storage::Cuda(s) = &*self.storage() {
            return Ok(Tensor::from_storage(Storage::Cuda(s.embedding(ids, d)?), Shape(dims), Some(op)));
        }
        let table = self.try_to_vec_f64()?;
        let mut out = Vec::with_capacity(ids.len() * d);
        for &id in ids {
            out.extend_from_slice(&table[id * d..(id + 1) * d]);
        }
        Ok(Tensor::from_cpu(CpuStorage::from_f64(self.dtype(), &out), Shape(dims), Some(op)))
    }

    /// Zeroes each element with probability `p` (seeded) and scales the rest by 1 / (1 - p).
    pub fn dropout(&self, p: f64, rng: &mut impl Rng) -> Result<Tensor> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::Unsupported { op: "dropout", what: format!("probability {p}: use 0 <= p < 1") });
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        let scale = 1.0 / (1.0 - p);
        let m: Vec<f64> = (0..self.elem_count()).map(|_| if rng.random::<f64>() < p { 0.0 } else { scale }).collect();
        let mask = Tensor::from_f64(&m, self.shape().clone(), self.dtype())?.to_device(&self.device())?;
        let data = {
            let _g = super::no_grad();
            let out = self.detach().mul(&mask)?;
            out.storage().try_clone()?
        };
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::Dropout(self.clone(), mask))))
    }
}

/// The data of a (batched) product, for [`Tensor::matmul`] and [`Tensor::matmul_t`]'s fallback.
#[allow(clippy::too_many_arguments)]
fn matmul_data(
    a: &Storage,
    b: &Storage,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    b_batched: bool,
) -> Result<Storage> {
    Ok(match (a, b) {
        (Storage::Cpu(sa), Storage::Cpu(sb)) => Storage::Cpu(match (sa, sb) {
            (CpuStorage::F32(x), CpuStorage::F32(y)) => CpuStorage::F32(cpu::matmul(x, y, batch, m, k, n, b_batched)),
            (CpuStorage::F64(x), CpuStorage::F64(y)) => CpuStorage::F64(cpu::matmul(x, y, batch, m, k, n, b_batched)),
            (x, y) => {
                CpuStorage::F32(cpu::matmul(&x.as_f32(), &y.as_f32(), batch, m, k, n, b_batched)).to_dtype(x.dtype())
            }
        }),
        (Storage::Cuda(x), Storage::Cuda(y)) => Storage::Cuda(x.matmul(y, batch, m, k, n, b_batched)?),
        (a, b) => return Err(Error::Device { op: "matmul", a: a.device().name(), b: b.device().name() }),
    })
}

/// The data of `op(a) op(b)` (`m` x `n`, reduction `k`) in `layout` for f32 CUDA tensors, read in
/// place by the GEMM ladder's layout rungs (or the bf16 tensor-core path, per this thread's
/// [`MatmulPrecision`](crate::cuda::MatmulPrecision)); `None` on other devices or dtypes, or when
/// the layout's rungs do not take the shape (the caller multiplies a transposed copy).
fn layout_data(a: &Tensor, b: &Tensor, (m, k, n): (usize, usize, usize), layout: Layout) -> Result<Option<Storage>> {
    if a.dtype() != DType::F32 || b.dtype() != DType::F32 {
        return Ok(None);
    }
    let (sa, sb) = (a.storage(), b.storage());
    let (Storage::Cuda(xa), Storage::Cuda(xb)) = (&*sa, &*sb) else {
        return Ok(None);
    };
    Ok(xa.matmul_layout(xb, m, k, n, layout)?.map(Storage::Cuda))
}

/// [`layout_data`] as an untracked gradient of `shape`.
fn product_in_place(
    a: &Tensor,
    b: &Tensor,
    mkn: (usize, usize, usize),
    layout: Layout,
    shape: &Shape,
) -> Result<Option<Tensor>> {
    Ok(layout_data(a, b, mkn, layout)?.map(|data| Tensor::from_storage(data, shape.clone(), None)))
}
