//! The backend table: where a tensor lives ([`Device`]), its data ([`Storage`]), and one [`Storage`]
//! method per op that sends it to the CPU reference (`cpu/`) or the CUDA backend
//! (`cuda_backend.rs`). Each method is one `match`: one op, one backend call per arm.

use super::Targets;
use super::cpu::{CpuStorage, Float};
use super::cuda_backend::CudaStorage;
use super::elementwise::{Binary, Unary};
use super::layout::{Layout, coalesce};
use super::shape::Shape;
use crate::cuda::DeviceBuffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Where a tensor lives.
#[derive(Clone, Debug)]
pub enum Device {
    /// Host memory, the reference backend.
    Cpu,
    /// A CUDA GPU (f32, bf16 and f16 tensors; every op a kiln kernel).
    Cuda(Arc<crate::cuda::Device>),
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) => true,
            (Device::Cuda(a), Device::Cuda(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Device {
    /// The shared CUDA device 0, as a tensor device.
    pub fn cuda() -> Result<Device> {
        Ok(Device::Cuda(crate::cuda::Device::shared()?))
    }
    /// A short name for messages ("cpu", "cuda:NVIDIA H200").
    pub fn name(&self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            Device::Cuda(d) => format!("cuda:{}", d.name()),
        }
    }
}

/// A tensor's data: host memory, or a GPU buffer.
#[derive(Debug)]
pub enum Storage {
    /// On the host.
    Cpu(CpuStorage),
    /// On a GPU (f32, bf16 or f16).
    Cuda(CudaStorage),
}

/// Where a max op's argmax offsets live (host for CPU tensors, device for CUDA tensors).
pub enum ArgMax {
    /// Host offsets.
    Host(Vec<usize>),
    /// Device offsets.
    Device(DeviceBuffer<u32>),
}

/// The error for a layout that reads past the end of its storage (a bug in a view op).
fn check_span(op: &'static str, layout: &Layout, len: usize) -> Result<()> {
    if layout.span() > len {
        return Err(Error::shape(op, format!("a view reading up to element {} of a storage of {len}", layout.span())));
    }
    Ok(())
}

/// The error for two inputs on different devices.
fn devices(op: &'static str, a: &Storage, b: &Storage) -> Error {
    Error::Device { op, a: a.device().name(), b: b.device().name() }
}

impl Storage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.len(),
            Storage::Cuda(s) => s.len(),
        }
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where it lives.
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(s) => Device::Cuda(s.dev.clone()),
        }
    }
    /// A copy on the same device.
    pub fn try_clone(&self) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(s.clone()),
            Storage::Cuda(s) => Storage::Cuda(s.try_clone()?),
        })
    }
    /// The host copy of the data (downloads from a GPU).
    pub fn to_cpu(&self) -> Result<CpuStorage> {
        Ok(match self {
            Storage::Cpu(s) => s.clone(),
            Storage::Cuda(s) => s.download_cpu()?,
        })
    }
    /// The data on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Storage> {
        Ok(match (self, device) {
            (Storage::Cpu(s), Device::Cpu) => Storage::Cpu(s.clone()),
            (Storage::Cuda(s), Device::Cpu) => Storage::Cpu(s.download_cpu()?),
            // f32, bf16 and f16 travel as they are; f64 is a typed error (convert first)
            (Storage::Cpu(s), Device::Cuda(d)) => Storage::Cuda(CudaStorage::upload_cpu(d, s)?),
            (Storage::Cuda(s), Device::Cuda(d)) if Arc::ptr_eq(&s.dev, d) => Storage::Cuda(s.try_clone()?),
            (Storage::Cuda(s), Device::Cuda(d)) => Storage::Cuda(CudaStorage::upload_cpu(d, &s.download_cpu()?)?),
        })
    }
    /// The data converted to `d` (a different dtype; on CUDA by kernel, among f32, bf16 and f16).
    pub(crate) fn to_dtype(&self, d: DType) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(s.to_dtype(d)),
            Storage::Cuda(s) => Storage::Cuda(s.to_dtype(d)?),
        })
    }
    /// The host data as a mutable slice of `T` (`op` names errors; CUDA data has none).
    pub(crate) fn host_slice_mut<T: Float>(&mut self, op: &'static str) -> Result<&mut [T]> {
        let d = self.dtype();
        match self {
            Storage::Cpu(c) => T::slice_mut(c).ok_or(Error::DType { op, got: d, expected: T::DTYPE }),
            Storage::Cuda(_) => Err(Error::Unsupported { op, what: "CUDA tensors (host slices only)".into() }),
        }
    }

    /// An elementwise function of one input.
    pub(crate) fn unary(&self, u: Unary) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(s.unary(u)?),
            Storage::Cuda(s) => Storage::Cuda(s.unary(u)?),
        })
    }

    /// `self (op) other`, their shapes `a` and `b` broadcast to `out`.
    pub(crate) fn binary(&self, a: &Shape, other: &Storage, b: &Shape, out: &Shape, op: Binary) -> Result<Storage> {
        Ok(match (self, other) {
            (Storage::Cpu(x), Storage::Cpu(y)) => Storage::Cpu(x.binary(a, y, b, out, op)?),
            (Storage::Cuda(x), Storage::Cuda(y)) => Storage::Cuda(x.binary(a, y, b, out, op)?),
            (x, y) => return Err(devices(op.name(), x, y)),
        })
    }

    /// `self (op) other` broadcast to `out`, each input read through its layout in place (views
    /// and broadcasts in one pass), where the backend can: CUDA, by the strided binary kernel.
    /// `None` elsewhere (the caller makes dense copies of the views).
    pub(crate) fn binary_views(
        &self,
        la: &Layout,
        other: &Storage,
        lb: &Layout,
        out: &Shape,
        op: Binary,
    ) -> Result<Option<Storage>> {
        Ok(match (self, other) {
            (Storage::Cuda(x), Storage::Cuda(y)) => {
                check_span(op.name(), la, x.len())?;
                check_span(op.name(), lb, y.len())?;
                let (sa, sb) = (la.broadcast_strides(out), lb.broadcast_strides(out));
                let (dims, s) = coalesce(out.dims(), &[&out.strides(), &sa, &sb]);
                let a = (s[1].as_slice(), la.offset());
                Some(Storage::Cuda(x.binary_strided(y, &dims, a, (&s[2], lb.offset()), op)?))
            }
            _ => None,
        })
    }

    /// This data (shape `from`) broadcast to `to`, materialized (a gather through stride-0
    /// dimensions: every dtype).
    pub(crate) fn expand(&self, from: &Shape, to: &Shape) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(s.gather(&Layout::broadcast(from, to).offsets())),
            Storage::Cuda(s) => Storage::Cuda(s.strided_copy(to, &from.broadcast_strides(to))?),
        })
    }

    /// The elements `layout` reads from this data, in row-major order of its shape (a dense copy of
    /// a view: one strided-copy launch on a GPU).
    pub(crate) fn strided_copy(&self, layout: &Layout) -> Result<Storage> {
        check_span("strided copy", layout, self.len())?;
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(s.gather(&layout.offsets())),
            Storage::Cuda(s) => {
                let (dims, strides) = layout.coalesced();
                Storage::Cuda(s.view_copy(&dims, &strides, layout.offset())?)
            }
        })
    }

    /// Writes the elements `src_layout` reads from `src` to the places `dst` names in this data
    /// (the same shape; `dst`'s places distinct): `cat`, and the zero-padded gradient of `narrow`.
    pub(crate) fn write_strided(&mut self, dst: &Layout, src: &Storage, src_layout: &Layout) -> Result<()> {
        if dst.shape() != src_layout.shape() {
            return Err(Error::shape(
                "strided write",
                format!("destination {} and source {} differ", dst.shape(), src_layout.shape()),
            ));
        }
        check_span("strided write", dst, self.len())?;
        check_span("strided write", src_layout, src.len())?;
        match (self, src) {
            (Storage::Cpu(d), Storage::Cpu(s)) => d.scatter(&dst.offsets(), s, &src_layout.offsets()),
            (Storage::Cuda(d), Storage::Cuda(s)) => {
                let (dims, strides) = coalesce(dst.shape().dims(), &[src_layout.strides(), dst.strides()]);
                d.scatter_from(s, &dims, (&strides[0], src_layout.offset()), (&strides[1], dst.offset()))
            }
            (d, s) => Err(devices("strided write", d, s)),
        }
    }

    /// Overwrites f32 data with host values in place (the same buffer; `v` holds every element).
    pub(crate) fn write_host_f32(&mut self, op: &'static str, v: &[f32]) -> Result<()> {
        match self {
            Storage::Cpu(_) => {
                self.host_slice_mut::<f32>(op)?.copy_from_slice(v);
                Ok(())
            }
            Storage::Cuda(c) => c.write_f32(op, v),
        }
    }

    /// `n` elements of this data's dtype on its device, for an op that writes every one (zeros on
    /// the host; not cleared on a GPU, where `KILN_POISON=1` poisons them).
    pub(crate) fn scratch(&self, n: usize) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(CpuStorage::from_f64(s.dtype(), &vec![0.0; n])),
            Storage::Cuda(s) => Storage::Cuda(CudaStorage::scratch(&s.dev, n, s.dtype())?),
        })
    }

    /// `n` elements equal to `value`, of this data's dtype on its device (on a GPU, filled by the
    /// fill kernel).
    pub(crate) fn filled(&self, n: usize, value: f64) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(CpuStorage::from_f64(s.dtype(), &vec![value; n])),
            Storage::Cuda(s) => Storage::Cuda(CudaStorage::full_dtype(&s.dev, n, value, s.dtype())?),
        })
    }

    /// This data (shape `from`) summed into `to`, a shape that broadcasts to `from` (`op` names
    /// errors).
    pub(crate) fn sum_into(&self, op: &'static str, from: &Shape, to: &Shape) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(s.sum_into(op, from, to)?),
            Storage::Cuda(s) => Storage::Cuda(s.sum_into(from, to)?),
        })
    }

    /// The (batched) product of `self` (batch x m x k) and `b` (k x n, or batch x k x n when
    /// `b_batched`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul(
        &self,
        b: &Storage,
        batch: usize,
        m: usize,
        k: usize,
        n: usize,
        b_batched: bool,
    ) -> Result<Storage> {
        Ok(match (self, b) {
            (Storage::Cpu(x), Storage::Cpu(y)) => Storage::Cpu(x.matmul(y, batch, m, k, n, b_batched)),
            (Storage::Cuda(x), Storage::Cuda(y)) => Storage::Cuda(x.matmul(y, batch, m, k, n, b_batched)?),
            (x, y) => return Err(devices("matmul", x, y)),
        })
    }

    /// `self b^T` (m x n; `self` m x k, `b` stored n x k) with `b` read in place, where the backend
    /// can: CUDA, for the shapes its GEMMs take in place. `None` elsewhere (the caller multiplies a
    /// transposed copy).
    pub(crate) fn matmul_abt(&self, b: &Storage, m: usize, k: usize, n: usize) -> Result<Option<Storage>> {
        Ok(match (self, b) {
            (Storage::Cuda(x), Storage::Cuda(y)) => x.matmul_abt(y, m, k, n)?.map(Storage::Cuda),
            _ => None,
        })
    }

    /// `batch` products `a_i b_i^T`: `self` holds the `a_i` (`[batch, m, k]`, dense), `bt` the
    /// `b_i` transposed (`[batch, n, k]`, dense: a batched transposed view's storage, read in
    /// place). CUDA bf16 on sm_90a: the strided-batch `wgmma` kernel; elsewhere `bt` is transposed
    /// back by a strided copy and multiplied as [`Storage::matmul`] does.
    pub(crate) fn matmul_batched_abt(
        &self,
        bt: &Storage,
        batch: usize,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<Storage> {
        Ok(match (self, bt) {
            (Storage::Cpu(x), Storage::Cpu(_)) => {
                let back = Layout::contiguous(Shape(vec![batch, n, k])).transpose(1, 2);
                match bt.strided_copy(&back)? {
                    Storage::Cpu(y) => Storage::Cpu(x.matmul(&y, batch, m, k, n, true)),
                    Storage::Cuda(_) => unreachable!("a CPU copy stays on the CPU"),
                }
            }
            (Storage::Cuda(x), Storage::Cuda(y)) => Storage::Cuda(x.matmul_batched_abt(y, batch, m, k, n)?),
            (x, y) => return Err(devices("matmul", x, y)),
        })
    }

    /// `self^T b` (m x n; `self` stored k x m, `b` k x n) with `self` read in place, where the
    /// backend can (see [`Storage::matmul_abt`]).
    pub(crate) fn matmul_atb(&self, b: &Storage, m: usize, k: usize, n: usize) -> Result<Option<Storage>> {
        Ok(match (self, b) {
            (Storage::Cuda(x), Storage::Cuda(y)) => x.matmul_atb(y, m, k, n)?.map(Storage::Cuda),
            _ => None,
        })
    }

    /// `act(self w^T + b)` (rows x n; `self` rows x k, `w` n x k) as one fused GEMM, where the
    /// backend has it for the case (CUDA: bf16 operands, an f32 bias, sm_90a, k % 8 == 0; see
    /// `cuda_linear.rs`). `None` elsewhere (the caller composes the layer).
    pub(crate) fn linear_fused(
        &self,
        w: &Storage,
        b: Option<&Storage>,
        act: Option<crate::cuda::gemm::Activation>,
        shape: (usize, usize, usize),
    ) -> Result<Option<Storage>> {
        Ok(match (self, w, b) {
            (Storage::Cuda(x), Storage::Cuda(w), None) => x.linear_fused(w, None, act, shape)?.map(Storage::Cuda),
            (Storage::Cuda(x), Storage::Cuda(w), Some(Storage::Cuda(b))) => {
                x.linear_fused(w, Some(b), act, shape)?.map(Storage::Cuda)
            }
            _ => None,
        })
    }

    /// The fused Linear's gradients from `self`, the gradient before the activation (rows x n):
    /// `(dx, dw, db)`, dw and db in f32 (see [`Storage::linear_fused`]); `None` where the backend
    /// has no fused backward for the case (the caller composes it).
    #[allow(clippy::type_complexity)]
    pub(crate) fn linear_fused_backward(
        &self,
        x: &Storage,
        w: &Storage,
        shape: (usize, usize, usize),
        bias: bool,
    ) -> Result<Option<(Storage, Storage, Option<Storage>)>> {
        Ok(match (self, x, w) {
            (Storage::Cuda(g), Storage::Cuda(x), Storage::Cuda(w)) => g
                .linear_fused_backward(x, w, shape, bias)?
                .map(|(dx, dw, db)| (Storage::Cuda(dx), Storage::Cuda(dw), db.map(Storage::Cuda))),
            _ => None,
        })
    }

    /// `(o, lse)` of attention of `self` (q), `k` and `v` (dense `[batch, heads, seq, head_dim]`,
    /// one dtype, equal heads) on the flash kernels, where the backend has one for the case (CUDA:
    /// bf16 and f16 at the flash head dims, with a backward kernel when `need_grad`; see
    /// `cuda_attention.rs`). `None` elsewhere (the caller composes the naive attention).
    pub(crate) fn flash_attention(
        &self,
        k: &Storage,
        v: &Storage,
        shape: crate::cuda::attention::AttentionShape,
        causal: bool,
        scale: f32,
        need_grad: bool,
    ) -> Result<Option<(Storage, Storage)>> {
        Ok(match (self, k, v) {
            (Storage::Cuda(q), Storage::Cuda(k), Storage::Cuda(v)) => q
                .flash_attention(k, v, shape, causal, scale, need_grad)?
                .map(|(o, l)| (Storage::Cuda(o), Storage::Cuda(l))),
            _ => None,
        })
    }

    /// `(dq, dk, dv)` of a flash attention forward ([`Storage::flash_attention`]): `self` is q, `o`
    /// and `lse` the forward's outputs, `d_o` the output's gradient.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn flash_attention_backward(
        &self,
        k: &Storage,
        v: &Storage,
        o: &Storage,
        d_o: &Storage,
        lse: &Storage,
        shape: crate::cuda::attention::AttentionShape,
        causal: bool,
        scale: f32,
    ) -> Result<(Storage, Storage, Storage)> {
        match (self, k, v, o, d_o, lse) {
            (
                Storage::Cuda(q),
                Storage::Cuda(k),
                Storage::Cuda(v),
                Storage::Cuda(o),
                Storage::Cuda(d_o),
                Storage::Cuda(l),
            ) => {
                let (dq, dk, dv) = q.flash_attention_backward(k, v, o, d_o, l, shape, causal, scale)?;
                Ok((Storage::Cuda(dq), Storage::Cuda(dk), Storage::Cuda(dv)))
            }
            (q, ..) => Err(Error::Unsupported {
                op: "attention backward",
                what: format!("flash attention on {} (only CUDA tensors run the flash kernels)", q.device().name()),
            }),
        }
    }

    /// Softmax or log-softmax of each row of `d`.
    pub(crate) fn softmax(&self, d: usize, log: bool) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(s.softmax(d, log)?),
            Storage::Cuda(s) => Storage::Cuda(s.softmax(d, log)?),
        })
    }

    /// Mean cross-entropy of (n, c) logits against `targets` (already range-checked): one element.
    pub(crate) fn cross_entropy(&self, targets: &Targets, c: usize) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(s.cross_entropy(targets.as_slice(), c)?),
            Storage::Cuda(s) => Storage::Cuda(s.cross_entropy(targets.as_slice(), targets.device_copy(), c)?),
        })
    }

    /// The gradient of the mean cross-entropy of (n, c) logits (`self`) for the one-element upstream
    /// gradient `g`, fused, where the backend has it: CUDA. `None` elsewhere (the backward rule
    /// composes it from tensor ops).
    pub(crate) fn cross_entropy_backward(&self, targets: &Targets, c: usize, g: &Storage) -> Result<Option<Storage>> {
        Ok(match (self, g) {
            (Storage::Cuda(s), Storage::Cuda(g)) => {
                Some(Storage::Cuda(s.cross_entropy_backward(targets.as_slice(), targets.device_copy(), c, g)?))
            }
            _ => None,
        })
    }

    /// Layer norm of rows of `d` with scale `w` and shift `b` (all on one device): (out, mean, rstd).
    pub(crate) fn layer_norm(
        &self,
        w: &Storage,
        b: &Storage,
        d: usize,
        eps: f64,
    ) -> Result<(Storage, Storage, Storage)> {
        Ok(match (self, w, b) {
            (Storage::Cpu(x), Storage::Cpu(w), Storage::Cpu(b)) => {
                let (out, mean, rstd) = x.layer_norm(w, b, d, eps)?;
                (Storage::Cpu(out), Storage::Cpu(mean), Storage::Cpu(rstd))
            }
            (Storage::Cuda(x), Storage::Cuda(w), Storage::Cuda(b)) => {
                let (out, mean, rstd) = x.layer_norm(w, b, d, eps)?;
                (Storage::Cuda(out), Storage::Cuda(mean), Storage::Cuda(rstd))
            }
            (x, w, b) => return Err(devices("layer_norm", x, if x.device() != w.device() { w } else { b })),
        })
    }

    /// Rows of the (v, d) table `self` for `ids` (already range-checked).
    pub(crate) fn embedding(&self, ids: &[usize], d: usize) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(s.embedding(ids, d)),
            Storage::Cuda(s) => Storage::Cuda(s.embedding(ids, d)?),
        })
    }

    /// The embedding gradient: rows of `self` (n, d) summed per id into a (v, d) table of `dtype`.
    pub(crate) fn embedding_backward(&self, ids: &[usize], v: usize, d: usize, dtype: DType) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(s.embedding_backward(ids, v, d, dtype)),
            Storage::Cuda(s) => {
                let gw = s.embedding_backward(ids, v, d)?;
                Storage::Cuda(if gw.dtype() == dtype { gw } else { gw.to_dtype(dtype)? })
            }
        })
    }

    /// Maximum along the middle of (outer, len, inner): the values, and the input offset of each.
    pub(crate) fn max_dim(&self, outer: usize, len: usize, inner: usize) -> Result<(Storage, ArgMax)> {
        Ok(match self {
            Storage::Cpu(s) => {
                let (vals, arg) = s.max_dim(outer, len, inner);
                (Storage::Cpu(vals), ArgMax::Host(arg))
            }
            Storage::Cuda(s) => {
                let (vals, arg) = s.max_dim(outer, len, inner)?;
                (Storage::Cuda(vals), ArgMax::Device(arg))
            }
        })
    }

    /// The gradient of a max: `self` scattered to the `argmax` offsets of an input like `x` (its
    /// length, dtype and device).
    pub(crate) fn scatter_argmax(&self, argmax: &ArgMax, x: &Storage) -> Result<Storage> {
        Ok(match (argmax, self) {
            (ArgMax::Host(arg), Storage::Cpu(g)) => Storage::Cpu(g.scatter_argmax(arg, x.len(), x.dtype())),
            (ArgMax::Device(arg), Storage::Cuda(g)) => Storage::Cuda(g.scatter_argmax(arg, x.len())?),
            _ => return Err(devices("max backward", x, self)),
        })
    }

    /// The column of the (first) maximum of each row of `d`.
    pub(crate) fn argmax_last(&self, d: usize) -> Result<Vec<usize>> {
        Ok(match self {
            Storage::Cpu(s) => s.argmax_last(d),
            Storage::Cuda(s) => s.argmax_last(d)?,
        })
    }
}
