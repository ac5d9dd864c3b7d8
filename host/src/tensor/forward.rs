//! The computing methods of [`Tensor`]: the forward of every op. Each checks its arguments, runs one
//! [`Storage`] op (the backend table in `storage.rs`), and records the [`Op`] whose backward rule
//! (`ops.rs`) autograd applies.

use super::elementwise::{Binary, Unary};
use super::ops::Op;
use super::{Shape, Storage, Targets, Tensor, no_grad};
use crate::error::{Error, Result};
use rand::Rng;
use std::sync::Arc;

impl Tensor {
    pub(crate) fn unary(&self, u: Unary) -> Result<Tensor> {
        let data = self.data()?.unary(u)?;
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::Unary(self.clone(), u))))
    }
    fn binary(&self, other: &Tensor, op: Binary) -> Result<Tensor> {
        let out = Shape::broadcast(op.name(), self.shape(), other.shape())?;
        let (a, b) = (self.storage(), other.storage());
        let dense = self.layout().is_dense_in(a.len()) && other.layout().is_dense_in(b.len());
        let in_place = if dense { None } else { a.binary_views(self.layout(), &b, other.layout(), &out, op)? };
        let data = match in_place {
            Some(data) => data,
            None => self.data()?.binary(self.shape(), &*other.data()?, other.shape(), &out, op)?,
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
    /// `self * step(other)`, broadcasting: `self` where `other > 0`, else `self * 0` (the bits of
    /// `self` times the step mask of `other` in one pass: ReLU's backward from its output).
    pub fn relu_grad(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::ReluGrad)
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

    /// Matrix product with numpy/PyTorch rules: `(..., M, K) x (..., K, N) -> (..., M, N)`, the
    /// batch dimensions (all but the last two) broadcast against each other; a 1-D left operand is
    /// a row (its dimension dropped from the result), a 1-D right operand a column. bf16 and f16
    /// inputs are multiplied in f32 and rounded once to the input dtype.
    ///
    /// A right operand without batch dimensions (or only 1s) is one product for all of the left
    /// operand's rows. Broadcast batch dimensions are expanded (copied) first, and their gradients
    /// summed back. A 2-D operand that is a transposed view of a contiguous matrix is read in
    /// place where the backend can (CUDA f32: the GEMM's NT and TN layouts); so is a batched right
    /// operand that is the last-two-dimensions transpose of a contiguous tensor (`k.transpose(-1,
    /// -2)`); other views are copied to contiguous storage first. On CUDA, bf16 products with
    /// both sides batched run on the tensor cores (sm_90a: the strided-batch `wgmma` kernel, f32
    /// accumulation; a batched B that is not such a view is transposed once); f16 batches and
    /// other devices widen to f32.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        let (ra, rb) = (self.shape().rank(), other.shape().rank());
        let bad = || Error::shape("matmul", format!("cannot multiply {} by {}", self.shape(), other.shape()));
        if ra == 0 || rb == 0 {
            return Err(bad());
        }
        if self.dtype() != other.dtype() {
            return Err(Error::DType { op: "matmul", got: other.dtype(), expected: self.dtype() });
        }
        if ra == 1 || rb == 1 {
            // A vector is a one-row (left) or one-column (right) matrix, its dimension dropped.
            let a = if ra == 1 { self.reshape([1, self.elem_count()])? } else { self.clone() };
            let b = if rb == 1 { other.reshape([other.elem_count(), 1])? } else { other.clone() };
            let out = a.matmul(&b).map_err(|e| if matches!(e, Error::Shape { .. }) { bad() } else { e })?;
            let mut dims = out.dims().to_vec();
            let (m_at, n_at) = (dims.len() - 2, dims.len() - 1);
            if rb == 1 {
                dims.remove(n_at);
            }
            if ra == 1 {
                dims.remove(m_at);
            }
            return out.reshape(dims);
        }
        let (a, b) = (self.dims(), other.dims());
        let (m, k, n) = (a[ra - 2], a[ra - 1], b[rb - 1]);
        if b[rb - 2] != k {
            return Err(bad());
        }
        let (ba, bb) = (Shape(a[..ra - 2].to_vec()), Shape(b[..rb - 2].to_vec()));
        let batch = Shape::broadcast("matmul", &ba, &bb).map_err(|_| bad())?;
        let full = |rows, cols| Shape([batch.dims(), &[rows, cols]].concat());
        if bb.elem_count() == 1 {
            // One product: every row of a against the shared (k x n) b (the batch is a's, with any
            // leading 1s of b's added).
            let lhs = self.reshape(full(m, k))?;
            let rhs = if rb == 2 { other.clone() } else { other.reshape([k, n])? };
            return lhs.matmul_checked(&rhs);
        }
        self.expand(&full(m, k))?.matmul_checked(&other.expand(&full(k, n))?)
    }

    /// The product of checked operands: `self` (..., m, k) and `other` either (k, n) or (..., k, n)
    /// with `self`'s batch dimensions. Records [`Op::Matmul`].
    fn matmul_checked(&self, other: &Tensor) -> Result<Tensor> {
        let r = self.shape().rank();
        let (m, k, n) = (self.dims()[r - 2], self.dims()[r - 1], other.dims()[other.shape().rank() - 1]);
        let batch: usize = self.dims()[..r - 2].iter().product();
        let mut out_shape = self.dims().to_vec();
        out_shape[r - 1] = n;
        let out_shape = Shape(out_shape);
        let op = Some(Op::Matmul(self.clone(), other.clone()));
        if other.shape().rank() == 2
            && let Some(data) = self.matmul_in_place(other, batch * m, k, n)?
        {
            return Ok(Tensor::from_storage(data, out_shape, op));
        }
        let b_batched = other.shape().rank() > 2;
        if b_batched && batch > 1 {
            // b a transposed view of contiguous (..., n, k) data: the batched a b^T, read in place
            let b = other.storage();
            if other.layout().is_batched_transpose_in(b.len()) {
                let data = self.data()?.matmul_batched_abt(&b, batch, m, k, n)?;
                return Ok(Tensor::from_storage(data, out_shape, op));
            }
        }
        let data = self.data()?.matmul(&*other.data()?, batch, m, k, n, b_batched)?;
        Ok(Tensor::from_storage(data, out_shape, op))
    }

    /// `self` (rows x k) times the 2-D `other` (k x n) with a transposed-view operand read in place
    /// by the backend: `other` a transposed contiguous (n x k) matrix (the NT layout), or a 2-D
    /// `self` a transposed contiguous (k x rows) matrix (TN). `None` when neither operand is such a
    /// view or the backend cannot take the shape (the caller copies).
    fn matmul_in_place(&self, other: &Tensor, rows: usize, k: usize, n: usize) -> Result<Option<Storage>> {
        let b = other.storage();
        if other.layout().is_transposed_matrix_in(b.len()) {
            return self.data()?.matmul_abt(&b, rows, k, n);
        }
        let a = self.storage();
        if self.layout().is_transposed_matrix_in(a.len()) {
            return a.matmul_atb(&*other.data()?, rows, k, n);
        }
        Ok(None)
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
        let rows: usize = self.dims()[..self.dims().len() - 1].iter().product();
        let mut out_shape = a.to_vec();
        *out_shape.last_mut().expect("rank 2 or 3") = n;
        let in_place = self.data()?.matmul_abt(&*w.data()?, rows, k, n)?;
        let data = match in_place {
            Some(data) => data,
            None => self.data()?.matmul(&w.transpose_data(0, 1)?, 1, rows, k, n, false)?,
        };
        Ok(Tensor::from_storage(data, Shape(out_shape), Some(Op::MatmulT(self.clone(), w.clone()))))
    }

    /// A Linear layer with its activation: `act(self w^T + b)` for `self` (..., K) of rank 2 or 3,
    /// `w` (N, K) and `b` (N).
    ///
    /// On CUDA, with `self` and `w` bf16, `b` f32 (an f32 master bias) or absent, the sm_90a module
    /// and K a multiple of 8, it is one `wgmma` GEMM whose epilogue adds the bias and applies a
    /// ReLU to the f32 accumulator and stores bf16 once, recorded as
    /// [`Op::Linear`](super::ops::Op), whose backward reads its operands in place (dW and
    /// db straight into f32). Elsewhere (the CPU, other dtypes, K not a multiple of 8, an older
    /// GPU: decided before any launch) it is composed: [`Tensor::matmul_t`], the bias added in the
    /// product's dtype ([`Tensor::compute_copy`]), the activation, each recorded as itself. GELU is
    /// applied as its own op after the (fused or composed) product and bias.
    pub fn linear(&self, w: &Tensor, b: Option<&Tensor>, act: Option<crate::cuda::gemm::Activation>) -> Result<Tensor> {
        use crate::cuda::gemm::Activation;
        if act == Some(Activation::Gelu) {
            return self.linear(w, b, None)?.gelu();
        }
        let (a, wd) = (self.dims(), w.dims());
        if wd.len() != 2 || !matches!(a.len(), 2 | 3) || a[a.len() - 1] != wd[1] {
            return Err(Error::shape(
                "linear",
                format!("cannot multiply {} by the transpose of {}", self.shape(), w.shape()),
            ));
        }
        let (n, k) = (wd[0], wd[1]);
        if let Some(b) = b
            && b.dims() != [n]
        {
            return Err(Error::shape("linear", format!("a bias of shape {} for {n} outputs", b.shape())));
        }
        let rows: usize = a[..a.len() - 1].iter().product();
        let mut out_shape = a.to_vec();
        *out_shape.last_mut().expect("rank 2 or 3") = n;
        let fused = {
            let bd = match b {
                Some(b) => Some(b.data()?),
                None => None,
            };
            self.data()?.linear_fused(&*w.data()?, bd.as_deref(), act, (rows, k, n))?
        };
        if let Some(data) = fused {
            let op = Op::Linear { x: self.clone(), w: w.clone(), b: b.cloned(), act };
            return Ok(Tensor::from_storage(data, Shape(out_shape), Some(op)));
        }
        let y = self.matmul_t(w)?;
        let y = match b {
            Some(b) => y.add(&b.compute_copy(y.dtype())?)?,
            None => y,
        };
        match act {
            Some(Activation::Relu) => y.relu(),
            Some(Activation::Gelu) => y.gelu(),
            None => Ok(y),
        }
    }

    fn reduce_sum(&self, dims: &[usize], keepdim: bool) -> Result<Tensor> {
        let mut dims = dims.to_vec();
        dims.sort_unstable();
        dims.dedup();
        let kept = self.shape().keepdims(&dims);
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
        self.data()?.sum_into(op, self.shape(), to)
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
            self.shape().keepdims(&[d])
        } else {
            Shape(dims.iter().enumerate().filter(|(i, _)| *i != d).map(|(_, &x)| x).collect())
        };
        let (vals, argmax) = self.data()?.max_dim(outer, len, inner)?;
        let op = Op::Max { x: self.clone(), dim: d, keepdim, argmax: Arc::new(argmax) };
        Ok(Tensor::from_storage(vals, out, Some(op)))
    }

    /// Index of the maximum along the last dimension, per row (no gradient).
    pub fn argmax_last(&self) -> Result<Vec<usize>> {
        let d = self.shape().last();
        if d == 0 || self.shape().rank() == 0 {
            return Err(Error::shape("argmax", format!("empty last dimension in {}", self.shape())));
        }
        self.data()?.argmax_last(d)
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
        let data = self.data()?.expand(self.shape(), shape)?;
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

    /// The data of this tensor with dimensions `a` and `b` (resolved) swapped, materialized.
    fn transpose_data(&self, a: usize, b: usize) -> Result<Storage> {
        self.storage().strided_copy(&self.layout().transpose(a, b))
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
        let data = self.data()?.softmax(d, false)?;
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::Softmax(self.clone()))))
    }
    /// Log-softmax over the last dimension (max-subtracted).
    pub fn log_softmax(&self) -> Result<Tensor> {
        let d = self.last_dim_op("log_softmax")?;
        let data = self.data()?.softmax(d, true)?;
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::LogSoftmax(self.clone()))))
    }

    /// Mean cross-entropy of `self` (logits, N x C) against class indices (one per row), fused and
    /// stable (log-sum-exp with the row maximum subtracted). `targets` is a `&[usize]` or a
    /// [`Targets`], which keeps its device copy across calls.
    pub fn cross_entropy(&self, targets: impl Into<Targets>) -> Result<Tensor> {
        let targets: Targets = targets.into();
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
        let data = self.data()?.cross_entropy(&targets, c)?;
        Ok(Tensor::from_storage(data, Shape(vec![]), Some(op)))
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
        let stat_shape = self.shape().keepdims(&[self.shape().rank() - 1]);
        let devs = [self.device(), weight.device(), bias.device()];
        if let Some(other) = devs[1..].iter().find(|d| **d != devs[0]) {
            return Err(Error::Device { op, a: devs[0].name(), b: other.name() });
        }
        let (out, mean, rstd) = self.data()?.layer_norm(&*weight.data()?, &*bias.data()?, d, eps)?;
        let mean = Tensor::from_storage(mean, stat_shape.clone(), None);
        let rstd = Tensor::from_storage(rstd, stat_shape, None);
        let op = Op::LayerNorm { x: self.clone(), weight: weight.clone(), bias: bias.clone(), mean, rstd };
        Ok(Tensor::from_storage(out, self.shape().clone(), Some(op)))
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
        let data = self.data()?.embedding(ids, d)?;
        Ok(Tensor::from_storage(data, Shape(dims), Some(op)))
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
            let _g = no_grad();
            let out = self.detach().mul(&mask)?;
            out.data_owned()?
        };
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::Dropout(self.clone(), mask))))
    }
}
