//! Scaled dot-product attention as a tensor op: [`Tensor::scaled_dot_product_attention`] on
//! `[batch, heads, seq, head_dim]` tensors, with autograd, by one of two paths:
//!
//! ```text
//!  CUDA, bf16 / f16, head dim 64 or 128     flash: one Op::Attention, the flash forward kernel
//!  (and a backward kernel for the dtype       (mma.sync) through the storage seam; its backward
//!   when a gradient is needed)                rule calls the flash backward (P recomputed from
//!                                             the saved log-sum-exp)
//!  everything else (the CPU, f32, other      naive: Tensor::naive_attention, composed of tensor
//!   head dims, grid limits)                   ops (batched products, scale, a constant mask,
//!                                             softmax); autograd from those ops
//! ```
//!
//! Grouped-query attention (fewer key/value heads than query heads) expands K and V to q's heads
//! by a broadcast op, so their gradients are summed over each group by that op's backward. The
//! causal mask is bottom-right aligned, as in [`crate::attention`]: query row `i` sees keys
//! `j <= i + kv_len - q_len`; a row that sees no key (causal, `q_len > kv_len`) has output 0 and
//! zero gradients, on both paths.

use super::{DType, Device, Shape, Tensor, is_grad_enabled, ops::Op};
use crate::attention::AttentionParams;
use crate::cuda::attention::AttentionShape;
use crate::error::{Error, Result};

const OP: &str = "scaled_dot_product_attention";

/// The checked dimensions of an attention problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dims {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    head_dim: usize,
}

/// Checks q `[B, H, Sq, D]`, k and v `[B, Hkv, Skv, D]` (one dtype, one device, `H` a multiple of
/// `Hkv`), each refusal saying what to change.
fn check(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Dims> {
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        if t.shape().rank() != 4 {
            return Err(Error::shape(
                OP,
                format!(
                    "{name} has shape {}: q, k and v are [batch, heads, seq, head_dim] (split the heads with reshape and permute)",
                    t.shape()
                ),
            ));
        }
    }
    for t in [k, v] {
        if t.dtype() != q.dtype() {
            return Err(Error::DType { op: OP, got: t.dtype(), expected: q.dtype() });
        }
        if t.device() != q.device() {
            return Err(Error::Device { op: OP, a: q.device().name(), b: t.device().name() });
        }
    }
    let (qd, kd) = (q.dims(), k.dims());
    if k.dims() != v.dims() {
        return Err(Error::shape(OP, format!("k {} and v {} differ: give them one shape", k.shape(), v.shape())));
    }
    if qd[0] != kd[0] {
        return Err(Error::shape(OP, format!("q has batch {} and k, v have {}: give them one batch", qd[0], kd[0])));
    }
    if qd[3] != kd[3] {
        return Err(Error::shape(
            OP,
            format!("q has head dim {} and k, v have {}: give them one head dim", qd[3], kd[3]),
        ));
    }
    if kd[1] == 0 || !qd[1].is_multiple_of(kd[1]) {
        return Err(Error::shape(
            OP,
            format!(
                "{} query heads and {} key/value heads: the query heads must be a multiple of the key/value heads (grouped-query attention)",
                qd[1], kd[1]
            ),
        ));
    }
    Ok(Dims { batch: qd[0], heads: qd[1], kv_heads: kd[1], q_len: qd[2], kv_len: kd[2], head_dim: qd[3] })
}

/// The scale given, or `1 / sqrt(head_dim)`; a non-finite scale is refused.
fn scale_or_default(scale: Option<f64>, head_dim: usize) -> Result<f64> {
    let s = scale.unwrap_or(1.0 / (head_dim.max(1) as f64).sqrt());
    if !s.is_finite() {
        return Err(Error::Unsupported {
            op: OP,
            what: format!("scale = {s}: give a finite scale (or None: 1 / sqrt(head_dim))"),
        });
    }
    Ok(s)
}

/// `kv` `[B, Hkv, S, D]` with each head repeated `group` times in place: `[B, Hkv * group, S, D]`
/// (a broadcast, whose backward sums the group's gradients).
fn repeat_heads(kv: &Tensor, group: usize) -> Result<Tensor> {
    if group == 1 {
        return Ok(kv.clone());
    }
    let d = kv.dims();
    let (b, h, s, hd) = (d[0], d[1], d[2], d[3]);
    kv.reshape([b, h, 1, s, hd])?.expand(&Shape(vec![b, h, group, s, hd]))?.reshape([b, h * group, s, hd])
}

/// The flash kernels' shape of q `[B, H, Sq, D]` against `kv_len` keys (heads already equal).
pub(crate) fn flash_shape(q: &[usize], kv_len: usize) -> Result<AttentionShape> {
    let u = |x: usize| {
        u32::try_from(x).map_err(|_| Error::Unsupported { op: OP, what: format!("a dimension of {x}: beyond 32 bits") })
    };
    Ok(AttentionShape { batch: u(q[0])?, heads: u(q[1])?, q_len: u(q[2])?, kv_len: u(kv_len)?, head_dim: u(q[3])? })
}

impl Tensor {
    /// Scaled dot-product attention: `softmax(scale q k^T [+ causal mask]) v` for `self` (q)
    /// `[batch, heads, q_len, head_dim]`, `k` and `v` `[batch, kv_heads, kv_len, head_dim]`, with
    /// `heads` a multiple of `kv_heads` (grouped-query attention: each key/value head serves
    /// `heads / kv_heads` consecutive query heads; its gradients are summed over them). `scale`
    /// defaults to `1 / sqrt(head_dim)`. The causal mask is bottom-right aligned (query row `i`
    /// sees keys `j <= i + kv_len - q_len`); a row that sees no key is 0. Any of q, k, v may be a
    /// view (heads split by `permute`).
    ///
    /// On CUDA, bf16 and f16 at head dims 64 and 128 run the flash kernels (one
    /// [`Op::Attention`], the forward on `mma.sync`; with a gradient needed, only for dtypes a
    /// flash backward kernel takes); everything else runs [`Tensor::naive_attention`]. Errors
    /// (typed): a rank other than 4, different batches or head dims, heads not a multiple of the
    /// key/value heads, different dtypes or devices, a non-finite scale.
    pub fn scaled_dot_product_attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        let dims = check(self, k, v)?;
        let scale = scale_or_default(scale, dims.head_dim)?;
        if matches!(self.device(), Device::Cuda(_))
            && matches!(self.dtype(), DType::BF16 | DType::F16)
            && self.elem_count() > 0
            && k.elem_count() > 0
        {
            let group = dims.heads / dims.kv_heads;
            let (ke, ve) = (repeat_heads(k, group)?, repeat_heads(v, group)?);
            let shape = flash_shape(self.dims(), dims.kv_len)?;
            let need_grad = is_grad_enabled() && [self, &ke, &ve].iter().any(|t| t.is_tracked());
            let res =
                self.data()?.flash_attention(&*ke.data()?, &*ve.data()?, shape, causal, scale as f32, need_grad)?;
            if let Some((o, lse)) = res {
                let lse = Tensor::from_storage(lse, Shape(vec![dims.batch, dims.heads, dims.q_len]), None);
                let op = Op::Attention { q: self.clone(), k: ke, v: ve, lse, causal, scale };
                return Ok(Tensor::from_storage(o, self.shape().clone(), Some(op)));
            }
        }
        self.naive_attention(k, v, causal, scale.into())
    }

    /// Attention composed of tensor ops, the reference path and the first rung: `S = q k^T`
    /// (batched), scaled, the causal mask added as a constant (`-inf` above the diagonal), a row
    /// softmax, the rows that see no key multiplied by 0, and `P v`. Its gradients come from those
    /// ops' backward rules. Takes what [`Tensor::scaled_dot_product_attention`] takes, on every
    /// backend and dtype; it materializes the `[batch, heads, q_len, kv_len]` scores.
    pub fn naive_attention(&self, k: &Tensor, v: &Tensor, causal: bool, scale: Option<f64>) -> Result<Tensor> {
        let dims = check(self, k, v)?;
        let scale = scale_or_default(scale, dims.head_dim)?;
        let group = dims.heads / dims.kv_heads;
        let (k, v) = (repeat_heads(k, group)?, repeat_heads(v, group)?);
        let s = self.matmul(&k.transpose(-1, -2)?)?.mul_scalar(scale)?;
        if !causal {
            return s.softmax()?.matmul(&v);
        }
        let (sq, skv) = (dims.q_len, dims.kv_len);
        let p = AttentionParams {
            batch: 1,
            heads: 1,
            q_len: sq as u32,
            kv_len: skv as u32,
            head_dim: dims.head_dim as u32,
            scale: scale as f32,
            causal: 1,
        };
        // -inf where a row that sees some key does not see this one; a row that sees none keeps
        // its scores (a finite softmax) and is zeroed after it
        let mut mask = vec![0.0; sq * skv];
        let mut keep = vec![1.0; sq];
        for i in 0..sq {
            let visible = p.visible_keys(i as u32) as usize;
            if visible == 0 {
                keep[i] = 0.0;
                continue;
            }
            mask[i * skv + visible..(i + 1) * skv].fill(f64::NEG_INFINITY);
        }
        let device = self.device();
        let mask = Tensor::from_f64(&mask, [sq, skv], self.dtype())?.to_device(&device)?;
        let mut probs = s.add(&mask)?.softmax()?;
        if keep.contains(&0.0) {
            let keep = Tensor::from_f64(&keep, [sq, 1], self.dtype())?.to_device(&device)?;
            probs = probs.mul(&keep)?;
        }
        probs.matmul(&v)
    }
}
