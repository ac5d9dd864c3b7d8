//! Tensors with reverse-mode autograd, on the CPU reference backend.
//!
//! A [`Tensor`] is a shared handle to contiguous data, its shape and dtype, and — when it was made by
//! an op from tensors that need gradients — the [`Op`](ops::Op) that made it, holding its inputs.
//! [`Tensor::backward`] sorts that graph topologically and applies each op's backward rule, which is
//! written next to the op's forward in [`ops`], as ordinary tensor operations.

mod autograd;
pub mod cpu;
pub mod ops;
mod shape;

pub use autograd::{NoGradGuard, gradcheck, is_grad_enabled, no_grad};
pub use cpu::{CpuStorage, DType};
pub use shape::Shape;

use crate::error::{Error, Result};
use ops::Op;
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// Host memory, the reference backend.
    Cpu,
}

/// A unique id per tensor (graph bookkeeping).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(usize);

impl TensorId {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(1);
        TensorId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

pub(crate) struct Inner {
    id: TensorId,
    data: RwLock<CpuStorage>,
    shape: Shape,
    op: Option<Op>,
    requires_grad: bool,
    grad: Mutex<Option<Tensor>>,
}

impl Drop for Inner {
    /// Frees a long chain of ops iteratively: the default recursive drop of `Op -> Tensor -> Op`
    /// would overflow the stack on a deep graph (a training loop's graph is thousands of ops deep).
    fn drop(&mut self) {
        let mut stack: Vec<Tensor> = match self.op.take() {
            Some(op) => op.into_inputs(),
            None => return,
        };
        while let Some(t) = stack.pop() {
            if let Ok(mut inner) = Arc::try_unwrap(t.0)
                && let Some(op) = inner.op.take()
            {
                stack.extend(op.into_inputs());
            }
        }
    }
}

/// An n-dimensional array with autograd. Cloning is cheap (a shared handle).
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

impl Tensor {
    pub(crate) fn from_storage(data: CpuStorage, shape: Shape, op: Option<Op>) -> Tensor {
        debug_assert_eq!(data.len(), shape.elem_count(), "storage and shape disagree");
        let op =
            if autograd::is_grad_enabled() { op.filter(|o| o.inputs().iter().any(|t| t.is_tracked())) } else { None };
        Tensor(Arc::new(Inner {
            id: TensorId::new(),
            data: RwLock::new(data),
            shape,
            op,
            requires_grad: false,
            grad: Mutex::new(None),
        }))
    }

    /// A tensor from host values.
    pub fn from_vec<T: Float>(v: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if v.len() != shape.elem_count() {
            return Err(Error::shape("from_vec", format!("{} values do not fill shape {shape}", v.len())));
        }
        Ok(Tensor::from_storage(T::wrap(v), shape, None))
    }

    /// A tensor from f64 values, stored as `dtype`.
    pub fn from_f64(v: &[f64], shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        if v.len() != shape.elem_count() {
            return Err(Error::shape("from_f64", format!("{} values do not fill shape {shape}", v.len())));
        }
        Ok(Tensor::from_storage(CpuStorage::from_f64(dtype, v), shape, None))
    }

    /// All elements equal to `value`.
    pub fn full(value: f64, shape: impl Into<Shape>, dtype: DType) -> Tensor {
        let shape = shape.into();
        Tensor::from_storage(CpuStorage::from_f64(dtype, &vec![value; shape.elem_count()]), shape, None)
    }
    /// Zeros.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType) -> Tensor {
        Tensor::full(0.0, shape, dtype)
    }
    /// Ones.
    pub fn ones(shape: impl Into<Shape>, dtype: DType) -> Tensor {
        Tensor::full(1.0, shape, dtype)
    }
    /// `0, 1, ..., n - 1`.
    pub fn arange(n: usize, dtype: DType) -> Tensor {
        let v: Vec<f64> = (0..n).map(|i| i as f64).collect();
        Tensor::from_storage(CpuStorage::from_f64(dtype, &v), Shape(vec![n]), None)
    }
    /// Normal(0, 1) samples from a seeded generator.
    pub fn randn(shape: impl Into<Shape>, dtype: DType, rng: &mut StdRng) -> Tensor {
        let shape = shape.into();
        let v: Vec<f64> = (0..shape.elem_count())
            .map(|_| {
                // Box-Muller: two uniforms give one normal (the second is discarded for simplicity).
                let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
                let u2: f64 = rng.random();
                (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
            })
            .collect();
        Tensor::from_storage(CpuStorage::from_f64(dtype, &v), shape, None)
    }
    /// Uniform samples in `[lo, hi)` from a seeded generator.
    pub fn rand(lo: f64, hi: f64, shape: impl Into<Shape>, dtype: DType, rng: &mut StdRng) -> Tensor {
        let shape = shape.into();
        let v: Vec<f64> = (0..shape.elem_count()).map(|_| rng.random_range(lo..hi)).collect();
        Tensor::from_storage(CpuStorage::from_f64(dtype, &v), shape, None)
    }
    /// A seeded generator (kiln's models take one, so runs are reproducible).
    pub fn rng(seed: u64) -> StdRng {
        StdRng::seed_from_u64(seed)
    }

    /// This tensor's id.
    pub fn id(&self) -> TensorId {
        self.0.id
    }
    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.0.shape
    }
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.0.shape.dims()
    }
    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.0.shape.elem_count()
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.storage().dtype()
    }
    /// The device.
    pub fn device(&self) -> Device {
        Device::Cpu
    }
    /// Copies to a device.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        match device {
            Device::Cpu => Ok(self.clone()),
        }
    }
    pub(crate) fn storage(&self) -> std::sync::RwLockReadGuard<'_, CpuStorage> {
        self.0.data.read().unwrap_or_else(|p| p.into_inner())
    }
    pub(crate) fn storage_mut(&self) -> std::sync::RwLockWriteGuard<'_, CpuStorage> {
        self.0.data.write().unwrap_or_else(|p| p.into_inner())
    }
    pub(crate) fn op(&self) -> Option<&Op> {
        self.0.op.as_ref()
    }

    /// Every element as f64, in row-major order.
    pub fn to_vec_f64(&self) -> Vec<f64> {
        self.storage().to_f64_vec()
    }
    /// Every element as f32.
    pub fn to_vec_f32(&self) -> Vec<f32> {
        self.storage().as_f32().into_owned()
    }
    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f64> {
        if self.elem_count() != 1 {
            return Err(Error::shape(
                "item",
                format!("tensor of shape {} has {} elements, not 1", self.shape(), self.elem_count()),
            ));
        }
        Ok(self.to_vec_f64()[0])
    }

    /// Converts to another dtype (a new tensor; gradients flow through f32/f64 conversions).
    pub fn to_dtype(&self, d: DType) -> Result<Tensor> {
        if d == self.dtype() {
            return Ok(self.clone());
        }
        let data = self.storage().to_dtype(d);
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::ToDType(self.clone()))))
    }

    /// Marks a leaf tensor as needing gradients (returns a new handle sharing nothing with `self`'s
    /// graph).
    pub fn requires_grad(self) -> Tensor {
        let data = self.storage().clone();
        Tensor(Arc::new(Inner {
            id: TensorId::new(),
            data: RwLock::new(data),
            shape: self.shape().clone(),
            op: None,
            requires_grad: true,
            grad: Mutex::new(None),
        }))
    }
    /// Whether this is a leaf that accumulates gradients.
    pub fn is_requires_grad(&self) -> bool {
        self.0.requires_grad
    }
    /// Whether gradients flow through this tensor.
    pub fn is_tracked(&self) -> bool {
        self.0.requires_grad || self.0.op.is_some()
    }
    /// The same data, cut from the graph.
    pub fn detach(&self) -> Tensor {
        Tensor::from_storage(self.storage().clone(), self.shape().clone(), None)
    }
    /// The accumulated gradient of a leaf, if any.
    pub fn grad(&self) -> Option<Tensor> {
        self.0.grad.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// Clears the accumulated gradient.
    pub fn zero_grad(&self) {
        *self.0.grad.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
    pub(crate) fn accumulate_grad(&self, g: Tensor) -> Result<()> {
        let mut slot = self.0.grad.lock().unwrap_or_else(|p| p.into_inner());
        let new = match slot.take() {
            None => g,
            Some(old) => old.add(&g)?,
        };
        *slot = Some(new.detach());
        Ok(())
    }

    /// Overwrites the data in place (optimizers; the shape and dtype must match).
    pub fn set_data(&self, src: &Tensor) -> Result<()> {
        if src.shape() != self.shape() || src.dtype() != self.dtype() {
            return Err(Error::shape(
                "set_data",
                format!("source {} {:?} does not match {} {:?}", src.shape(), src.dtype(), self.shape(), self.dtype()),
            ));
        }
        if src.id() == self.id() {
            return Ok(());
        }
        let data = src.storage().clone();
        *self.storage_mut() = data;
        Ok(())
    }

    /// Runs `f` on the data as a mutable slice of `T` (optimizer kernels).
    pub fn with_data_mut<T: Float, R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        let mut s = self.storage_mut();
        let d = s.dtype();
        match T::slice_mut(&mut s) {
            Some(v) => Ok(f(v)),
            None => Err(Error::DType { op: "with_data_mut", got: d, expected: T::DTYPE }),
        }
    }
    /// Runs `f` on the data as a slice of `T`.
    pub fn with_data<T: Float, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        let s = self.storage();
        match T::slice(&s) {
            Some(v) => Ok(f(v)),
            None => Err(Error::DType { op: "with_data", got: s.dtype(), expected: T::DTYPE }),
        }
    }
}

pub use cpu::Float;

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({}, {:?}, {:?}", self.shape(), self.dtype(), self.device())?;
        if let Some(op) = self.op() {
            write!(f, ", op={}", op.name())?;
        }
        if self.is_requires_grad() {
            write!(f, ", requires_grad")?;
        }
        write!(f, ")")
    }
}

impl std::fmt::Display for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.to_vec_f64();
        let dims = self.dims();
        let last = self.shape().last().max(1);
        const MAX_ROWS: usize = 8;
        const MAX_COLS: usize = 8;
        if dims.is_empty() {
            return write!(f, "{:.6} ({:?})", v[0], self.dtype());
        }
        writeln!(f, "tensor {} {:?} [", self.shape(), self.dtype())?;
        let rows = v.len() / last;
        for (r, row) in v.chunks(last).enumerate() {
            if r == MAX_ROWS && rows > MAX_ROWS + 1 {
                writeln!(f, "  ... {} more rows", rows - MAX_ROWS)?;
                break;
            }
            let cells: Vec<String> = row.iter().take(MAX_COLS).map(|x| format!("{x:>10.4}")).collect();
            let more = if last > MAX_COLS { format!(" ... ({} more)", last - MAX_COLS) } else { String::new() };
            writeln!(f, "  [{}{more}]", cells.join(", "))?;
        }
        write!(f, "]")
    }
}
