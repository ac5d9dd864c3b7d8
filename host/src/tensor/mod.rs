//! Tensors with reverse-mode autograd, on the CPU reference backend or a CUDA GPU.
//!
//! A [`Tensor`] is a shared handle to a storage, the [`Layout`] it reads that storage through
//! (shape, strides, offset), and — when it was made by an op from tensors that need gradients — the
//! [`Op`] that made it, holding its inputs. [`Tensor::backward`] sorts that graph topologically and
//! applies each op's backward rule, which is written next to the op's record in [`ops`], as
//! ordinary tensor operations.
//!
//! A freshly computed tensor owns a contiguous storage. The view ops (`views.rs`: `reshape`,
//! `permute`, `transpose`, `narrow`, `split`, `chunk`) return tensors that share their input's
//! storage under a new layout, with no copy; `contiguous` and `cat` copy. An op that cannot read
//! strides takes a view's elements through `Tensor::data` (one strided copy, made there for every
//! such op); the readers of strides take views directly: the strided copy and scatter,
//! the CUDA binary kernel, and the GEMM (a transposed 2-D view of a contiguous matrix is its NT or
//! TN layout, read in place). In-place writes (`set_data`, `with_data_mut`, `move_to`) refuse views.
//!
//! The frontend speaks tensors; only the backend table and the backends below it speak a device's
//! dialect (imports point down this diagram only):
//!
//! ```text
//!  Tensor, views of a storage (this file)    autograd.rs
//!   its op methods (forward.rs, views.rs)        │ walks the graph
//!        │ records an Op per result              │
//!        ▼                                       ▼
//!  Op records + backward rules (ops.rs) ─── written with the tensor ops above
//!        │ every op: one Storage call, given dense data or (where the backend reads strides)
//!        │ a Layout (layout.rs: strides, offsets, contiguity, coalescing)
//!        ▼
//!  Storage, Device (storage.rs): the backend table, one match per op
//!        ├── Cpu(CpuStorage)    cpu/: reference maps over Float, blocked matmul, gather/scatter
//!        └── Cuda(CudaStorage)  cuda_backend.rs: kiln_gpu opcodes, GEMM layouts, strided kernels
//!                                      │
//!                                      ▼
//!                               crate::cuda (runtime) → kiln_gpu kernels
//! ```
//!
//! The arithmetic operators (`&a + &b`, `-&a`, `&a * 2.0`, each returning a [`Result`]) live in
//! [`operators`] (`operators.rs`) and call the methods of `forward.rs`.
//!
//! # Example: ops and autograd
//!
//! ```
//! use kiln::tensor::{DType, Tensor};
//!
//! // a leaf that accumulates gradients, and a constant
//! let w = Tensor::from_f64(&[1.0, -2.0, 3.0], [3], DType::F64)?.requires_grad();
//! let x = Tensor::from_f64(&[0.5, 1.0, 2.0], [3], DType::F64)?;
//!
//! // loss = sum(relu(w * x + 1) ^ 2), with the operators and the methods side by side
//! let h = ((&w * &x)? + 1.0)?.relu()?;
//! let loss = (&h * &h)?.sum_all()?;
//! assert_eq!(loss.item()?, 1.5 * 1.5 + 0.0 + 7.0 * 7.0);
//!
//! // d loss / d w = 2 relu(w x + 1) x, where w x + 1 > 0
//! loss.backward()?;
//! let g = w.grad().expect("w requires grad").to_vec_f64();
//! assert_eq!(g, [2.0 * 1.5 * 0.5, 0.0, 2.0 * 7.0 * 2.0]);
//!
//! // shapes that do not broadcast are an error, not a panic
//! assert!((&w + &Tensor::zeros([2], DType::F64)).is_err());
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! Leaves every layer may use: [`Shape`] (`shape.rs`), the elementwise functions [`Unary`](ops::Unary)
//! and [`Binary`](ops::Binary) (`elementwise.rs`), [`DType`], and [`Targets`] (whose device copy the
//! CUDA backend keeps).

pub mod attention;
mod autograd;
pub mod cpu;
pub mod cuda_backend;
mod elementwise;
mod forward;
mod layout;
pub mod operators;
pub mod ops;
mod shape;
mod storage;
mod targets;
mod views;

pub use crate::dtype::DType;
pub use autograd::{NoGradGuard, gradcheck, is_grad_enabled, no_grad};
pub use cpu::{CpuStorage, Float};
pub use cuda_backend::CudaStorage;
pub use layout::Layout;
pub use shape::Shape;
pub use storage::{Device, Storage};
pub use targets::Targets;

use crate::error::{Error, Result};
use ops::Op;
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

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
    /// The storage, shared with the tensor's views (and the tensor it is a view of).
    data: Arc<RwLock<Storage>>,
    /// Where the elements sit in `data`.
    layout: Layout,
    /// Whether this tensor reads another tensor's storage (made by a view op): in-place writes
    /// refuse it.
    is_view: bool,
    op: Option<Op>,
    requires_grad: bool,
    grad: Mutex<Option<Tensor>>,
    /// A 16-bit compute copy of this (master) tensor that an optimizer keeps up to date (see
    /// [`Tensor::attach_compute_copy`]); owned here, so it lives as long as the master does.
    compute: Mutex<Option<ComputeSlot>>,
}

/// A master tensor's compute copy and whether it still mirrors the master's data (an in-place
/// write of the master other than the optimizer's makes it stale until it is attached again).
struct ComputeSlot {
    copy: Tensor,
    valid: bool,
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

/// A tensor's elements as one dense storage: borrowed where the stored data is already that,
/// else a copy made through the layout (see `Tensor::data`).
pub(crate) enum Dense<'a> {
    /// The stored data (the layout covers it in order).
    Stored(std::sync::RwLockReadGuard<'a, Storage>),
    /// A dense copy of a view.
    Copied(Storage),
}

impl std::ops::Deref for Dense<'_> {
    type Target = Storage;
    fn deref(&self) -> &Storage {
        match self {
            Dense::Stored(s) => s,
            Dense::Copied(s) => s,
        }
    }
}

/// An n-dimensional array with autograd. Cloning is cheap (a shared handle).
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

impl Tensor {
    pub(crate) fn from_cpu(data: CpuStorage, shape: Shape, op: Option<Op>) -> Tensor {
        Tensor::from_storage(Storage::Cpu(data), shape, op)
    }

    pub(crate) fn from_storage(data: Storage, shape: Shape, op: Option<Op>) -> Tensor {
        debug_assert_eq!(data.len(), shape.elem_count(), "storage and shape disagree");
        Tensor::with_layout(Arc::new(RwLock::new(data)), Layout::contiguous(shape), false, op)
    }

    /// A view: this tensor's storage read through `layout` (no copy), made by `op`.
    pub(crate) fn view_with(&self, layout: Layout, op: Op) -> Tensor {
        debug_assert!(layout.span() <= self.storage().len(), "a view past the end of its storage");
        Tensor::with_layout(self.0.data.clone(), layout, true, Some(op))
    }

    fn with_layout(data: Arc<RwLock<Storage>>, layout: Layout, is_view: bool, op: Option<Op>) -> Tensor {
        let op =
            if autograd::is_grad_enabled() { op.filter(|o| o.inputs().iter().any(|t| t.is_tracked())) } else { None };
        Tensor(Arc::new(Inner {
            id: TensorId::new(),
            data,
            layout,
            is_view,
            op,
            requires_grad: false,
            grad: Mutex::new(None),
            compute: Mutex::new(None),
        }))
    }

    /// A tensor from host values.
    pub fn from_vec<T: Float>(v: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if v.len() != shape.elem_count() {
            return Err(Error::shape("from_vec", format!("{} values do not fill shape {shape}", v.len())));
        }
        Ok(Tensor::from_cpu(T::wrap(v), shape, None))
    }

    /// A tensor from f64 values, stored as `dtype`.
    pub fn from_f64(v: &[f64], shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        if v.len() != shape.elem_count() {
            return Err(Error::shape("from_f64", format!("{} values do not fill shape {shape}", v.len())));
        }
        Ok(Tensor::from_cpu(CpuStorage::from_f64(dtype, v), shape, None))
    }

    /// All elements equal to `value`.
    pub fn full(value: f64, shape: impl Into<Shape>, dtype: DType) -> Tensor {
        let shape = shape.into();
        Tensor::from_cpu(CpuStorage::from_f64(dtype, &vec![value; shape.elem_count()]), shape, None)
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
        Tensor::from_cpu(CpuStorage::from_f64(dtype, &v), Shape(vec![n]), None)
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
        Tensor::from_cpu(CpuStorage::from_f64(dtype, &v), shape, None)
    }
    /// Uniform samples in `[lo, hi)` from a seeded generator.
    pub fn rand(lo: f64, hi: f64, shape: impl Into<Shape>, dtype: DType, rng: &mut StdRng) -> Tensor {
        let shape = shape.into();
        let v: Vec<f64> = (0..shape.elem_count()).map(|_| rng.random_range(lo..hi)).collect();
        Tensor::from_cpu(CpuStorage::from_f64(dtype, &v), shape, None)
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
        self.0.layout.shape()
    }
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape().dims()
    }
    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.shape().elem_count()
    }
    /// Where the elements sit in the storage (strides and offset; see [`Layout`]).
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }
    /// Whether the elements are in row-major order with no gaps (a view may still start at an
    /// offset into its storage).
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }
    /// Whether this tensor is a view of another's storage (made by `permute`, `transpose`,
    /// `narrow`, `split`, `chunk` or `reshape`): in-place writes ([`Tensor::set_data`],
    /// [`Tensor::with_data_mut`], [`Tensor::move_to`]) refuse it.
    pub fn is_view(&self) -> bool {
        self.0.is_view
    }
    /// The error for an in-place write through a view.
    fn refuse_view(&self, op: &'static str) -> Result<()> {
        if self.is_view() {
            return Err(Error::Unsupported {
                op,
                what: format!(
                    "writing in place through a view ({}, shares another tensor's storage): write to the tensor it views, or to a copy of the view (.detach() makes one)",
                    self.shape()
                ),
            });
        }
        Ok(())
    }
    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.storage().dtype()
    }
    /// The device.
    pub fn device(&self) -> Device {
        self.storage().device()
    }
    /// The tensor on `device` (the same handle when it is already there). Gradients flow back to
    /// the original device.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if &self.device() == device {
            return Ok(self.clone());
        }
        let data = self.data()?.to_device(device)?;
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::ToDevice(self.clone()))))
    }
    /// Moves a tensor's data to `device` in place, keeping its identity (parameters move this way,
    /// so optimizers and modules keep referring to the same tensors).
    pub fn move_to(&self, device: &Device) -> Result<()> {
        if &self.device() == device {
            return Ok(());
        }
        self.refuse_view("move_to")?;
        let data = self.storage().to_device(device)?;
        *self.storage_mut() = data;
        self.invalidate_compute_copy();
        Ok(())
    }
    /// The whole storage, as stored (shared with views: read it through [`Tensor::layout`], or use
    /// [`Tensor::data`] for this tensor's elements alone).
    pub(crate) fn storage(&self) -> std::sync::RwLockReadGuard<'_, Storage> {
        self.0.data.read().unwrap_or_else(|p| p.into_inner())
    }
    /// This tensor's elements as a dense storage (exactly `elem_count` elements, row-major): the
    /// stored data itself where the layout covers it in order, else a copy through the layout (one
    /// strided-copy launch on a GPU). Ops that cannot read strides take their input this way.
    pub(crate) fn data(&self) -> Result<Dense<'_>> {
        let s = self.storage();
        if self.0.layout.is_dense_in(s.len()) {
            return Ok(Dense::Stored(s));
        }
        Ok(Dense::Copied(s.strided_copy(&self.0.layout)?))
    }
    /// This tensor's elements in a storage of their own (always a fresh copy).
    pub(crate) fn data_owned(&self) -> Result<Storage> {
        match self.data()? {
            Dense::Stored(s) => s.try_clone(),
            Dense::Copied(s) => Ok(s),
        }
    }
    /// The whole storage, for writing in place: never through a view (the public writers refuse
    /// views; the optimizers write only leaves that hold gradients, which are never views).
    pub(crate) fn storage_mut(&self) -> std::sync::RwLockWriteGuard<'_, Storage> {
        debug_assert!(!self.is_view(), "an in-place write through a view of {}", self.shape());
        self.0.data.write().unwrap_or_else(|p| p.into_inner())
    }
    /// `value` everywhere, with this tensor's shape, dtype and device (on a GPU, filled there by the
    /// fill kernel: no host buffer, no upload).
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        let data = self.storage().filled(self.elem_count(), value)?;
        Ok(Tensor::from_storage(data, self.shape().clone(), None))
    }
    /// Zeros with this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Result<Tensor> {
        self.full_like(0.0)
    }
    /// Ones with this tensor's shape, dtype and device.
    pub fn ones_like(&self) -> Result<Tensor> {
        self.full_like(1.0)
    }
    /// The name of the op that recorded this tensor (`None` for leaves and for results no
    /// gradient flows through): which path an op took, for tests and messages.
    pub fn op_name(&self) -> Option<&'static str> {
        self.0.op.as_ref().map(Op::name)
    }
    pub(crate) fn op(&self) -> Option<&Op> {
        self.0.op.as_ref()
    }

    /// Every element as f64, in row-major order (downloaded from a GPU).
    pub fn try_to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(self.data()?.to_cpu()?.to_f64_vec())
    }
    /// Every element as f64. Panics only if a GPU download fails (a device fault, not a usage
    /// error); use [`Tensor::try_to_vec_f64`] to handle that.
    pub fn to_vec_f64(&self) -> Vec<f64> {
        self.try_to_vec_f64().unwrap_or_else(|e| panic!("downloading a tensor: {e}"))
    }
    /// Every element as f32 (see [`Tensor::to_vec_f64`]).
    pub fn to_vec_f32(&self) -> Vec<f32> {
        let s = self.data().and_then(|d| d.to_cpu()).unwrap_or_else(|e| panic!("downloading a tensor: {e}"));
        s.as_f32().into_owned()
    }
    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f64> {
        if self.elem_count() != 1 {
            return Err(Error::shape(
                "item",
                format!("tensor of shape {} has {} elements, not 1", self.shape(), self.elem_count()),
            ));
        }
        Ok(self.try_to_vec_f64()?[0])
    }

    /// Converts to another dtype (a new tensor; gradients flow through f32/f64 conversions).
    pub fn to_dtype(&self, d: DType) -> Result<Tensor> {
        if d == self.dtype() {
            return Ok(self.clone());
        }
        let data = self.data()?.to_dtype(d)?;
        Ok(Tensor::from_storage(data, self.shape().clone(), Some(Op::ToDType(self.clone()))))
    }

    /// Marks a leaf tensor as needing gradients (returns a new handle sharing nothing with `self`'s
    /// graph). Panics only if copying the data on its GPU fails (a device fault, not a usage error).
    pub fn requires_grad(self) -> Tensor {
        let data = self.data_owned().unwrap_or_else(|e| panic!("copying a tensor on its device: {e}"));
        Tensor(Arc::new(Inner {
            id: TensorId::new(),
            data: Arc::new(RwLock::new(data)),
            layout: Layout::contiguous(self.shape().clone()),
            is_view: false,
            op: None,
            requires_grad: true,
            grad: Mutex::new(None),
            compute: Mutex::new(None),
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
    /// The same data, cut from the graph (a copy). Panics only if copying on the GPU fails (a device
    /// fault, not a usage error).
    pub fn detach(&self) -> Tensor {
        let data = self.data_owned().unwrap_or_else(|e| panic!("copying a tensor on its device: {e}"));
        Tensor::from_storage(data, self.shape().clone(), None)
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

    /// Replaces the accumulated gradient with `g` (a tensor of this one's shape with a storage of
    /// its own: the optimizers read gradients by address). Data-parallel training under ZeRO-1
    /// sets its shard's gradient, reduced across the GPUs, this way.
    pub(crate) fn set_grad(&self, g: Tensor) -> Result<()> {
        if g.shape() != self.shape() || g.is_view() || g.layout().offset() != 0 {
            return Err(Error::shape(
                "set_grad",
                format!("a gradient of shape {} (own storage) for a tensor of shape {}", g.shape(), self.shape()),
            ));
        }
        *self.0.grad.lock().unwrap_or_else(|p| p.into_inner()) = Some(g);
        Ok(())
    }

    /// Overwrites the data in place (optimizers, checkpoint loads; the shape and dtype must match).
    /// The tensor's views see the new data; a view itself refuses (see [`Tensor::is_view`]).
    pub fn set_data(&self, src: &Tensor) -> Result<()> {
        self.refuse_view("set_data")?;
        if src.device() != self.device() {
            return Err(Error::Device { op: "set_data", a: self.device().name(), b: src.device().name() });
        }
        if src.shape() != self.shape() || src.dtype() != self.dtype() {
            return Err(Error::shape(
                "set_data",
                format!("source {} {:?} does not match {} {:?}", src.shape(), src.dtype(), self.shape(), self.dtype()),
            ));
        }
        if src.id() == self.id() {
            return Ok(());
        }
        let data = src.data_owned()?;
        *self.storage_mut() = data;
        self.invalidate_compute_copy();
        Ok(())
    }

    /// Copies `src`'s elements into this tensor's own buffer in place (same shape, dtype and
    /// device; one copy on the device, which a graph capture records): unlike
    /// [`Tensor::set_data`], the buffer stays the one a captured graph reads or writes. A view
    /// refuses (see [`Tensor::is_view`]).
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        self.refuse_view("copy_from")?;
        if src.device() != self.device() {
            return Err(Error::Device { op: "copy_from", a: self.device().name(), b: src.device().name() });
        }
        if src.shape() != self.shape() || src.dtype() != self.dtype() {
            return Err(Error::shape(
                "copy_from",
                format!("source {} {:?} does not match {} {:?}", src.shape(), src.dtype(), self.shape(), self.dtype()),
            ));
        }
        if src.id() == self.id() {
            return Ok(());
        }
        let dst = Layout::contiguous(self.shape().clone());
        let s = src.data_owned()?;
        let src_layout = Layout::contiguous(src.shape().clone());
        self.storage_mut().write_strided(&dst, &s, &src_layout)?;
        self.invalidate_compute_copy();
        Ok(())
    }

    /// Overwrites an f32 tensor's elements with host values in place (one host-to-device copy on
    /// a GPU into the same buffer, so a captured graph that reads the tensor sees them on its next
    /// replay). `values` must have [`Tensor::elem_count`] elements; a view refuses.
    pub fn copy_from_host(&self, values: &[f32]) -> Result<()> {
        self.refuse_view("copy_from_host")?;
        if self.dtype() != DType::F32 {
            return Err(Error::DType { op: "copy_from_host", got: self.dtype(), expected: DType::F32 });
        }
        if values.len() != self.elem_count() {
            return Err(Error::shape(
                "copy_from_host",
                format!(
                    "{} values for a tensor of shape {} ({} elements)",
                    values.len(),
                    self.shape(),
                    self.elem_count()
                ),
            ));
        }
        self.storage_mut().write_host_f32("copy_from_host", values)?;
        self.invalidate_compute_copy();
        Ok(())
    }

    /// Runs `f` on the data as a mutable slice of `T` (optimizer kernels). A view refuses (see
    /// [`Tensor::is_view`]).
    pub fn with_data_mut<T: Float, R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.refuse_view("with_data_mut")?;
        let r = f(self.storage_mut().host_slice_mut("with_data_mut")?);
        self.invalidate_compute_copy();
        Ok(r)
    }

    /// Attaches `copy`, a 16-bit tensor of this tensor's shape on its device, as this master
    /// tensor's compute copy: [`Tensor::compute_copy`] then hands it out (no conversion kernel)
    /// for as long as it mirrors the master. The master owns the copy from now on (its storage
    /// stays allocated while the master lives, which an optimizer's registration of the copy's
    /// address relies on). Whoever attaches it keeps it current: in mixed-precision training the
    /// optimizer writes it in the same launch as each update (`Optimizer::set_compute_copy`). An
    /// in-place write of the master by any other way (`set_data`, `with_data_mut`, `move_to`)
    /// marks the copy stale, and [`Tensor::compute_copy`] converts again until a copy is attached
    /// anew. Crate-internal: the optimizers' `attach_compute_copies` attaches and registers copies
    /// together, so no registered copy is dropped while an optimizer writes it.
    pub(crate) fn attach_compute_copy(&self, copy: Tensor) -> Result<()> {
        let op = "attach_compute_copy";
        if !matches!(copy.dtype(), DType::BF16 | DType::F16) || copy.shape() != self.shape() || copy.is_view() {
            return Err(Error::shape(
                op,
                format!(
                    "a compute copy must be a bf16 or f16 tensor of its own storage with the master's shape {}: got {} {:?}",
                    self.shape(),
                    copy.shape(),
                    copy.dtype()
                ),
            ));
        }
        if copy.device() != self.device() {
            return Err(Error::Device { op, a: self.device().name(), b: copy.device().name() });
        }
        *self.0.compute.lock().unwrap_or_else(|p| p.into_inner()) = Some(ComputeSlot { copy, valid: true });
        Ok(())
    }

    fn invalidate_compute_copy(&self) {
        if let Some(s) = self.0.compute.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            s.valid = false;
        }
    }

    /// This tensor in `dtype` for computing, with gradients flowing back to it in its own dtype
    /// (the record is `Op::ToDType`, whose backward converts the gradient): the attached compute
    /// copy when it is valid and of that dtype (a read-only view of the copy's storage, no kernel),
    /// else a conversion (round to nearest even), or `self` when it already is `dtype`.
    pub fn compute_copy(&self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        let copy = {
            let slot = self.0.compute.lock().unwrap_or_else(|p| p.into_inner());
            slot.as_ref().filter(|s| s.valid && s.copy.dtype() == dtype).map(|s| s.copy.clone())
        };
        match copy {
            Some(c) if c.device() == self.device() => Ok(Tensor::with_layout(
                c.0.data.clone(),
                Layout::contiguous(self.shape().clone()),
                true,
                Some(Op::ToDType(self.clone())),
            )),
            _ => self.to_dtype(dtype),
        }
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({}, {:?}, {}", self.shape(), self.dtype(), self.device().name())?;
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
        let v = match self.try_to_vec_f64() {
            Ok(v) => v,
            Err(e) => return write!(f, "<tensor on {}: {e}>", self.device().name()),
        };
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
