//! The op records: [`Op`], the op that made a tensor, holding its inputs and whatever its backward
//! needs, and in `Op::backward` each op's backward rule, written with the same tensor ops, so it
//! runs on whatever backend the forward ran on. The forwards are the `Tensor` methods of
//! `forward.rs`.

pub use super::elementwise::{Binary, Unary};
pub use super::storage::ArgMax;
use super::{DType, Shape, Tensor};
use crate::error::{Error, Result};
use std::sync::Arc;

/// The op that made a tensor, holding its inputs and whatever its backward needs.
#[derive(Clone)]
pub enum Op {
    /// Elementwise function of one input.
    Unary(Tensor, Unary),
    /// Elementwise function of two inputs, broadcast.
    Binary(Tensor, Tensor, Binary),
    /// Matrix product of `a` (..., M, K) and `b`, either (K, N) shared by every row of `a` or
    /// (..., K, N) with `a`'s batch dimensions (`Tensor::matmul` broadcasts the batches before
    /// recording, so their gradients are summed back by the broadcast's own rule).
    Matmul(Tensor, Tensor),
    /// `x w^T` with `w` (N x K) 2-D: a Linear layer's product, `w` read in place.
    MatmulT(Tensor, Tensor),
    /// `act(x w^T + b)` computed by one fused GEMM (`Tensor::linear` records it only when the
    /// backend fused the forward; a composed layer records its parts).
    Linear {
        /// Input (..., K).
        x: Tensor,
        /// Weight (N x K).
        w: Tensor,
        /// Bias (N), f32.
        b: Option<Tensor>,
        /// The activation fused after the bias (ReLU or none: GELU's gradient needs the
        /// pre-activation, so `Tensor::linear` applies it as its own op).
        act: Option<crate::cuda::gemm::Activation>,
    },
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
    /// Two dimensions swapped (a view).
    Transpose(Tensor, usize, usize),
    /// Dimensions reordered (a view): output dimension `i` is input dimension `perm[i]`.
    Permute(Tensor, Vec<usize>),
    /// A range of one dimension (a view).
    Narrow {
        /// Input.
        x: Tensor,
        /// The dimension.
        dim: usize,
        /// The first entry kept.
        start: usize,
    },
    /// Tensors joined along one dimension (a copy).
    Cat {
        /// The inputs, in order.
        xs: Vec<Tensor>,
        /// The dimension.
        dim: usize,
    },
    /// A view copied into contiguous storage.
    Contiguous(Tensor),
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
    /// Scaled dot-product attention on the flash kernels (`Tensor::scaled_dot_product_attention`
    /// records it only where the backend ran the flash forward; the naive path records its parts).
    /// K and V have q's heads (grouped heads already expanded, by an op of their own).
    Attention {
        /// Queries `[batch, heads, q_len, head_dim]`.
        q: Tensor,
        /// Keys `[batch, heads, kv_len, head_dim]`.
        k: Tensor,
        /// Values, as keys.
        v: Tensor,
        /// The forward's log-sum-exp per query row, f32 `[batch, heads, q_len]` (untracked).
        lse: Tensor,
        /// Whether the causal (bottom-right aligned) mask applied.
        causal: bool,
        /// The score scale.
        scale: f64,
    },
}

impl Op {
    /// A short name for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary(..) => "unary",
            Op::Binary(_, _, b) => b.name(),
            Op::Matmul(..) => "matmul",
            Op::MatmulT(..) => "matmul_t",
            Op::Linear { .. } => "linear",
            Op::Sum { .. } => "sum",
            Op::Max { .. } => "max",
            Op::Expand(_) => "expand",
            Op::SumTo(_) => "sum_to",
            Op::Reshape(_) => "reshape",
            Op::Transpose(..) => "transpose",
            Op::Permute(..) => "permute",
            Op::Narrow { .. } => "narrow",
            Op::Cat { .. } => "cat",
            Op::Contiguous(_) => "contiguous",
            Op::Softmax(_) => "softmax",
            Op::LogSoftmax(_) => "log_softmax",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Embedding { .. } => "embedding",
            Op::Dropout(..) => "dropout",
            Op::ToDType(_) => "to_dtype",
            Op::ToDevice(_) => "to_device",
            Op::Attention { .. } => "attention",
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
            | Op::Permute(x, _)
            | Op::Narrow { x, .. }
            | Op::Contiguous(x)
            | Op::Softmax(x)
            | Op::LogSoftmax(x)
            | Op::Dropout(x, _)
            | Op::ToDType(x)
            | Op::ToDevice(x) => vec![x],
            Op::Binary(a, b, _) | Op::Matmul(a, b) | Op::MatmulT(a, b) => vec![a, b],
            Op::Linear { x, w, b, .. } => [Some(x), Some(w), b.as_ref()].into_iter().flatten().collect(),
            Op::Sum { x, .. } | Op::Max { x, .. } => vec![x],
            Op::Cat { xs, .. } => xs.iter().collect(),
            Op::CrossEntropy { logits, .. } => vec![logits],
            Op::LayerNorm { x, weight, bias, .. } => vec![x, weight, bias],
            Op::Embedding { weight, .. } => vec![weight],
            Op::Attention { q, k, v, .. } => vec![q, k, v],
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
            | Op::Permute(x, _)
            | Op::Narrow { x, .. }
            | Op::Contiguous(x)
            | Op::Softmax(x)
            | Op::LogSoftmax(x)
            | Op::ToDType(x)
            | Op::ToDevice(x)
            | Op::Sum { x, .. }
            | Op::Max { x, .. } => vec![x],
            Op::Dropout(x, m) => vec![x, m],
            Op::Cat { xs, .. } => xs,
            Op::Binary(a, b, _) | Op::Matmul(a, b) | Op::MatmulT(a, b) => vec![a, b],
            Op::Linear { x, w, b, .. } => [Some(x), Some(w), b].into_iter().flatten().collect(),
            Op::CrossEntropy { logits, .. } => vec![logits],
            Op::LayerNorm { x, weight, bias, mean, rstd } => vec![x, weight, bias, mean, rstd],
            Op::Embedding { weight, .. } => vec![weight],
            Op::Attention { q, k, v, lse, .. } => vec![q, k, v, lse],
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
                    Unary::Relu => g.relu_grad(x)?,
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
                    // the step's derivative is 0 wherever it is defined
                    Binary::ReluGrad => (g.relu_grad(b)?, b.zeros_like()?),
                };
                vec![(a.clone(), ga.sum_to(a.shape())?), (b.clone(), gb.sum_to(b.shape())?)]
            }
            Op::Matmul(a, b) => {
                // Against a 2-D b (k x n), both gradients are 2-D products with one operand a
                // transposed view, which `matmul` reads in place where the backend can (CUDA f32:
                // the GEMM ladder's NT and TN rungs, the same bits as multiplying a transposed
                // copy) and copies elsewhere. Against a batched b, batched products of transposed
                // views: `g b^T` reads b in place (the batched a b^T product); `a^T g` copies a^T.
                let (k, n) = (a.dims()[a.shape().rank() - 1], g.dims()[g.shape().rank() - 1]);
                let rows: usize = a.dims()[..a.shape().rank() - 1].iter().product();
                if b.shape().rank() == 2 {
                    // da (rows x k) = g (rows x n) b^T; db (k x n) = a^T g over all rows
                    let ga = g.reshape([rows, n])?.matmul(&b.transpose(0, 1)?)?.reshape(a.shape().clone())?;
                    let gb = a.reshape([rows, k])?.transpose(0, 1)?.matmul(&g.reshape([rows, n])?)?;
                    vec![(a.clone(), ga), (b.clone(), gb)]
                } else {
                    vec![(a.clone(), g.matmul(&b.transpose(-1, -2)?)?), (b.clone(), a.transpose(-1, -2)?.matmul(g)?)]
                }
            }
            Op::MatmulT(x, w) => {
                // y = x w^T: dx = g w; dw (n x k) = g^T x over all rows (g a transposed view, read
                // in place where the backend can).
                let (n, k) = (w.dims()[0], w.dims()[1]);
                let rows: usize = x.dims()[..x.shape().rank() - 1].iter().product();
                let gx = g.matmul(w)?;
                let gw = g.reshape([rows, n])?.transpose(0, 1)?.matmul(&x.reshape([rows, k])?)?;
                vec![(x.clone(), gx), (w.clone(), gw)]
            }
            Op::Linear { x, w, b, act } => linear_backward(x, w, b.as_ref(), *act, out, g)?,
            Op::Sum { x, dims, keepdim } => {
                let kept = if *keepdim { g.clone() } else { g.reshape(x.shape().keepdims(dims))? };
                vec![(x.clone(), kept.expand(x.shape())?)]
            }
            Op::Max { x, argmax, .. } => {
                let gx = g.data()?.scatter_argmax(argmax, &*x.data()?)?;
                vec![(x.clone(), Tensor::from_storage(gx, x.shape().clone(), None))]
            }
            Op::Expand(x) => vec![(x.clone(), g.sum_to(x.shape())?)],
            Op::SumTo(x) => vec![(x.clone(), g.expand(x.shape())?)],
            Op::Reshape(x) => vec![(x.clone(), g.reshape(x.shape().clone())?)],
            Op::Transpose(x, d0, d1) => vec![(x.clone(), g.transpose(*d0 as isize, *d1 as isize)?)],
            Op::Permute(x, perm) => {
                let mut inverse = vec![0isize; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inverse[p] = i as isize;
                }
                vec![(x.clone(), g.permute(&inverse)?)]
            }
            Op::Narrow { x, dim, start } => vec![(x.clone(), g.pad_into(x.shape(), *dim, *start)?)],
            Op::Cat { xs, dim } => {
                let mut start = 0;
                let mut grads = Vec::with_capacity(xs.len());
                for x in xs {
                    let len = x.dims()[*dim];
                    grads.push((x.clone(), g.narrow(*dim as isize, start, len)?));
                    start += len;
                }
                grads
            }
            Op::Contiguous(x) => vec![(x.clone(), g.clone())],
            Op::Softmax(x) => {
                let dot = g.mul(out)?.sum_keepdim(-1)?;
                vec![(x.clone(), out.mul(&g.sub(&dot)?)?)]
            }
            Op::LogSoftmax(x) => {
                let s = g.sum_keepdim(-1)?;
                vec![(x.clone(), g.sub(&out.exp()?.mul(&s)?)?)]
            }
            Op::CrossEntropy { logits, targets } => {
                let c = logits.dims()[1];
                // Fused where the backend has it (CUDA); composed from tensor ops elsewhere.
                let fused = logits.data()?.cross_entropy_backward(targets, c, &*g.data()?)?;
                if let Some(gl) = fused {
                    return Ok(vec![(logits.clone(), Tensor::from_storage(gl, logits.shape().clone(), None))]);
                }
                let n = logits.dims()[0];
                let p = logits.softmax()?;
                let onehot = one_hot(targets.as_slice(), c, logits.dtype())?;
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
                let gw = g.data()?.embedding_backward(ids, v, d, weight.dtype())?;
                vec![(weight.clone(), Tensor::from_storage(gw, weight.shape().clone(), None))]
            }
            Op::Dropout(x, mask) => vec![(x.clone(), g.mul(mask)?)],
            Op::ToDType(x) => vec![(x.clone(), g.to_dtype(x.dtype())?)],
            Op::ToDevice(x) => vec![(x.clone(), g.to_device(&x.device())?)],
            Op::Attention { q, k, v, lse, causal, scale } => {
                // the flash backward: P recomputed from the saved log-sum-exp (see
                // crate::cuda::attention::flash_backward); every operand dense, in q's dtype
                let shape = super::attention::flash_shape(q.dims(), k.dims()[2])?;
                let g = if g.dtype() == out.dtype() { g.clone() } else { g.to_dtype(out.dtype())? };
                let (dq, dk, dv) = q.data()?.flash_attention_backward(
                    &*k.data()?,
                    &*v.data()?,
                    &*out.data()?,
                    &*g.data()?,
                    &*lse.data()?,
                    shape,
                    *causal,
                    *scale as f32,
                )?;
                vec![
                    (q.clone(), Tensor::from_storage(dq, q.shape().clone(), None)),
                    (k.clone(), Tensor::from_storage(dk, k.shape().clone(), None)),
                    (v.clone(), Tensor::from_storage(dv, v.shape().clone(), None)),
                ]
            }
        })
    }
}

/// The backward of a fused `y = act(x w^T + b)`: the gradient before the activation (ReLU: where
/// the output is positive, which is where its input was), then the fused in-place backward where
/// the backend has it (dW and db straight into f32), else the same products composed. A weight
/// that is an f32 master's compute copy (its record converts from f32) gets its gradient in f32,
/// which that record passes on as it is; any other input gets its gradient in its own dtype.
fn linear_backward(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    act: Option<crate::cuda::gemm::Activation>,
    out: &Tensor,
    g: &Tensor,
) -> Result<Vec<(Tensor, Tensor)>> {
    let gpre = match act {
        Some(crate::cuda::gemm::Activation::Relu) => g.relu_grad(out)?,
        Some(crate::cuda::gemm::Activation::Gelu) => {
            return Err(Error::Unsupported {
                op: "backward",
                what: "a fused GELU (its gradient needs the pre-activation; Tensor::linear applies GELU as its own op)"
                    .into(),
            });
        }
        None => g.clone(),
    };
    let (n, k) = (w.dims()[0], w.dims()[1]);
    let rows: usize = x.dims()[..x.shape().rank() - 1].iter().product();
    let master_copy = matches!(w.op(), Some(Op::ToDType(m)) if m.dtype() == DType::F32);
    let fused = gpre.data()?.linear_fused_backward(&*x.data()?, &*w.data()?, (rows, k, n), b.is_some())?;
    let (gx, gw, gb) = match fused {
        Some((dx, dw, db)) => (
            Tensor::from_storage(dx, x.shape().clone(), None),
            Tensor::from_storage(dw, w.shape().clone(), None),
            db.map(|db| Tensor::from_storage(db, Shape(vec![n]), None)),
        ),
        None => {
            let g2 = gpre.reshape([rows, n])?;
            let gx = g2.matmul(w)?.reshape(x.shape().clone())?;
            let gw = g2.transpose(0, 1)?.matmul(&x.reshape([rows, k])?)?;
            let gb = match b {
                Some(b) => Some(gpre.to_dtype(b.dtype())?.sum_to(b.shape())?),
                None => None,
            };
            (gx, gw, gb)
        }
    };
    let gw = if master_copy { gw.to_dtype(DType::F32)? } else { gw.to_dtype(w.dtype())? };
    let mut grads = vec![(x.clone(), gx.to_dtype(x.dtype())?), (w.clone(), gw)];
    if let (Some(b), Some(gb)) = (b, gb) {
        grads.push((b.clone(), gb.to_dtype(b.dtype())?));
    }
    Ok(grads)
}

fn one_hot(targets: &[usize], classes: usize, dtype: DType) -> Result<Tensor> {
    let mut v = vec![0.0; targets.len() * classes];
    for (i, &t) in targets.iter().enumerate() {
        v[i * classes + t] = 1.0;
    }
    Tensor::from_f64(&v, [targets.len(), classes], dtype)
}
