//! The view ops of [`Tensor`]: new shapes over the same storage (no copy), each recorded with its
//! backward rule in `ops.rs`. `reshape`, `permute`, `transpose`, `narrow`, `split` and `chunk`
//! make views ([`Layout`]s over the input's storage); `contiguous` and `cat` copy. Ops that cannot
//! read strides take a view's elements through `Tensor::data` (one strided copy); the strided copy,
//! the scatter and the GEMM (a transposed 2-D view, read in place) take views directly.

use super::layout::Layout;
use super::ops::Op;
use super::{Shape, Tensor};
use crate::error::{Error, Result};

impl Tensor {
    /// The same elements in a new shape: a view when the elements are contiguous, else a
    /// contiguous copy first (see [`Tensor::contiguous`]).
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if shape.elem_count() != self.elem_count() {
            return Err(Error::shape(
                "reshape",
                format!("cannot view {} ({} elements) as {shape}", self.shape(), self.elem_count()),
            ));
        }
        if shape == *self.shape() {
            return Ok(self.clone());
        }
        let x = self.contiguous()?;
        let layout = Layout::contiguous_at(shape, x.layout().offset());
        Ok(x.view_with(layout, Op::Reshape(x.clone())))
    }
    /// Alias of [`Tensor::reshape`].
    pub fn view(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        self.reshape(shape)
    }

    /// The dimensions reordered (a view): dimension `i` of the result is dimension `dims[i]` of
    /// this tensor (negative counts from the end).
    pub fn permute(&self, dims: &[isize]) -> Result<Tensor> {
        let perm = dims.iter().map(|&d| self.shape().dim("permute", d)).collect::<Result<Vec<_>>>()?;
        let layout = self.layout().permute(&perm)?;
        Ok(self.view_with(layout, Op::Permute(self.clone(), perm)))
    }

    /// Two dimensions swapped (a view; negative counts from the end). A transposed 2-D view of a
    /// contiguous matrix goes to the GEMM in place (see [`Tensor::matmul`]).
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let (a, b) = (self.shape().dim("transpose", d0)?, self.shape().dim("transpose", d1)?);
        if a == b {
            return Ok(self.clone());
        }
        Ok(self.view_with(self.layout().transpose(a, b), Op::Transpose(self.clone(), a, b)))
    }

    /// `len` entries of dimension `dim` from `start` (a view; negative `dim` counts from the end).
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = self.shape().dim("narrow", dim)?;
        let layout = self.layout().narrow(d, start, len)?;
        Ok(self.view_with(layout, Op::Narrow { x: self.clone(), dim: d, start }))
    }

    /// Views of `size` entries each along `dim` (the last one shorter when `size` does not divide
    /// the dimension).
    pub fn split(&self, size: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = self.shape().dim("split", dim)?;
        if size == 0 {
            return Err(Error::shape("split", format!("pieces of size 0 along dimension {dim} of {}", self.shape())));
        }
        let total = self.dims()[d];
        (0..total.div_ceil(size)).map(|i| self.narrow(d as isize, i * size, size.min(total - i * size))).collect()
    }

    /// At most `n` views along `dim`, each of `ceil(size / n)` entries but the last (PyTorch's
    /// `chunk`: fewer pieces when the dimension is short).
    pub fn chunk(&self, n: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = self.shape().dim("chunk", dim)?;
        if n == 0 {
            return Err(Error::shape("chunk", format!("0 chunks of dimension {dim} of {}", self.shape())));
        }
        let total = self.dims()[d];
        if total == 0 {
            return Ok(vec![self.clone()]);
        }
        self.split(total.div_ceil(n), d as isize)
    }

    /// The elements in row-major order in a storage of their own: the same handle when already
    /// contiguous, else one strided copy (the gradient passes through unchanged).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let data = self.storage().strided_copy(self.layout())?;
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::Contiguous(self.clone()))))
    }

    /// `tensors` joined along `dim` (a copy: one strided write per input, each reading its input's
    /// layout directly). They need the same rank, dtype and device, and equal sizes but along
    /// `dim`. The gradient of each input is its narrow of the output's.
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = *tensors.first().ok_or_else(|| Error::shape("cat", "no tensors to join"))?;
        let d = first.shape().dim("cat", dim)?;
        let mut out_dims = first.dims().to_vec();
        out_dims[d] = 0;
        for (i, t) in tensors.iter().enumerate() {
            let same_rank = t.shape().rank() == first.shape().rank();
            if !same_rank || t.dims().iter().zip(first.dims()).enumerate().any(|(j, (a, b))| j != d && a != b) {
                return Err(Error::shape(
                    "cat",
                    format!("tensor {i} of shape {} does not match {} outside dimension {d}", t.shape(), first.shape()),
                ));
            }
            if t.dtype() != first.dtype() {
                return Err(Error::DType { op: "cat", got: t.dtype(), expected: first.dtype() });
            }
            if t.device() != first.device() {
                return Err(Error::Device { op: "cat", a: first.device().name(), b: t.device().name() });
            }
            out_dims[d] += t.dims()[d];
        }
        let out_shape = Shape(out_dims);
        let mut data = first.storage().scratch(out_shape.elem_count())?;
        let whole = Layout::contiguous(out_shape.clone());
        let mut start = 0;
        for t in tensors {
            let len = t.dims()[d];
            if t.elem_count() > 0 {
                data.write_strided(&whole.narrow(d, start, len)?, &t.storage(), t.layout())?;
            }
            start += len;
        }
        let op = Op::Cat { xs: tensors.iter().map(|t| (*t).clone()).collect(), dim: d };
        Ok(Tensor::from_storage(data, out_shape, Some(op)))
    }

    /// The gradient of a narrow: `self` (this tensor's shape) placed at `start` along `dim` of
    /// zeros of `shape` (one fill and one strided write).
    pub(crate) fn pad_into(&self, shape: &Shape, dim: usize, start: usize) -> Result<Tensor> {
        let mut data = self.storage().filled(shape.elem_count(), 0.0)?;
        if self.elem_count() > 0 {
            let dst = Layout::contiguous(shape.clone()).narrow(dim, start, self.dims()[dim])?;
            data.write_strided(&dst, &self.storage(), self.layout())?;
        }
        Ok(Tensor::from_storage(data, shape.clone(), None))
    }
}
