//! Optimizers and learning-rate schedules.
//!
//! - On the CPU (the reference), updates run in place on the parameters' data in f64, rounding
//!   once to the parameter's dtype.
//! - On CUDA, one launch updates every parameter (the multi-tensor kernels of
//!   [`crate::cuda::optim`]), reading a table of the parameters, their state and their gradients
//!   that is uploaded when the set of parameters changes, not per step. The state tensors stay
//!   one per parameter with the names and shapes the CPU path uses, so checkpoints load either way.
//! - [`Optimizer::clip_grad_norm`] measures the global L2 norm of all gradients (on CUDA: one
//!   deterministic launch, the scale kept on the device) and the next [`Optimizer::step`] scales
//!   the gradients by `min(1, max_norm / (norm + 1e-6))` inside its update, with no host round
//!   trip; [`Optimizer::grad_norm`] reads the norm for logging (on CUDA: one download).
//! - [`Optimizer::set_compute_copy`] is the hook for mixed precision: a 16-bit copy of an f32
//!   parameter that the same launch writes from the updated master weights.
//!
//! The module by role: this file has the [`Optimizer`] trait, the mixed-precision hook and the
//! helpers the optimizers share; `fused.rs` the CUDA side every optimizer holds (the multi-tensor
//! table, its state arrays, clipping and the device's step scalars); `sgd.rs` and `adam.rs` the two
//! optimizers; `schedule.rs` the learning-rate schedules; `loss_scale.rs` dynamic loss scaling.

use crate::cuda::optim::{ComputeCopy, CopyFormat};
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, Storage, Tensor};

mod adam;
mod fused;
mod loss_scale;
mod schedule;
mod sgd;

pub use adam::Adam;
pub use loss_scale::LossScaler;
pub use schedule::LrSchedule;
pub use sgd::Sgd;

/// An optimizer over a fixed list of named parameters.
pub trait Optimizer {
    /// Applies one update from the parameters' accumulated gradients (parameters without a gradient
    /// are left alone). On CUDA: one launch for all the parameters on the GPU.
    fn step(&mut self) -> Result<()>;
    /// The current learning rate.
    fn lr(&self) -> f64;
    /// Sets the learning rate (schedules call this before each step).
    fn set_lr(&mut self, lr: f64);
    /// The parameters.
    fn params(&self) -> &[(String, Tensor)];
    /// Clears every parameter's gradient.
    fn zero_grad(&self) {
        for (_, p) in self.params() {
            p.zero_grad();
        }
    }
    /// The optimizer state as named tensors (for checkpoints).
    fn state(&self) -> Result<Vec<(String, Tensor)>>;
    /// Restores state saved by [`Optimizer::state`].
    fn load_state(&mut self, state: &std::collections::HashMap<String, Tensor>) -> Result<()>;
    /// Measures the global L2 norm of all the parameters' gradients, and makes the next
    /// [`Optimizer::step`] (only the next) scale every gradient by
    /// `min(1, max_norm / (norm + 1e-6))` before its update (before weight decay), like PyTorch's
    /// `clip_grad_norm_` followed by `step`. The gradients themselves are left as they are.
    ///
    /// On CUDA the norm is one deterministic multi-tensor reduction (the same gradients give the
    /// same bits) and the scale stays on the device: no host synchronization. On the CPU it is
    /// the f64 reference. Parameters split between the CPU and a GPU are refused.
    /// `max_norm` must be a finite number greater than 0.
    fn clip_grad_norm(&mut self, max_norm: f64) -> Result<()>;
    /// Loss scaling's unscale: measures the global L2 norm of the (scaled) gradients; where it is
    /// not finite (an overflow, an inf or a NaN anywhere) returns `false` and leaves the next step
    /// unscaled (the caller skips it: [`LossScaler::step`]); else returns `true` and makes the
    /// next [`Optimizer::step`] multiply every gradient by `inv_scale` (times the clip scale of
    /// the unscaled norm against `max_norm`, when given) inside its update. On CUDA one norm
    /// launch and one download of the norm (the step's only host round trip), the scale written
    /// to the device for the fused update; the gradients themselves are left as they are.
    fn unscale_grads(&mut self, inv_scale: f64, max_norm: Option<f64>) -> Result<bool>;
    /// The norm the last [`Optimizer::clip_grad_norm`] measured (None before any); on CUDA one
    /// download, so ask only when logging.
    fn grad_norm(&self) -> Result<Option<f64>>;
    /// Registers (or, with `None`, removes) a 16-bit compute copy of parameter `index` (f32, on
    /// CUDA): every later step writes the updated weights into it, rounded to nearest-even, in the
    /// same launch as the update. The copy is not written until the next step: fill it from the
    /// master weights when it is made. The hook of mixed-precision training: the optimizer keeps
    /// the f32 masters, the model computes with the copies.
    ///
    /// # Safety
    /// `copy.addr` must point to `copy.len` u16 values on the parameter's device that stay
    /// allocated, and are written by nothing else during a step, for as long as the copy is
    /// registered (until it is removed or replaced, or the optimizer is dropped).
    unsafe fn set_compute_copy(&mut self, index: usize, copy: Option<ComputeCopy>) -> Result<()>;
    /// Writes the host-side settings a replay of a captured step reads from the device (the
    /// learning rate [`Optimizer::set_lr`] set) before the replay: on CUDA one 4-byte copy to the
    /// device, skipped when it holds the rate already; nothing on the CPU. An eager step writes
    /// them itself; a graph cannot, so call this before each replay of a captured step.
    fn prepare_replay(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Refuses a parameter list that names one CUDA tensor twice (tied weights passed as two handles):
/// the fused launch would update it from two blocks at once, and a second compute copy would
/// replace the first while the optimizer still writes to it.
fn distinct_cuda_parameters(op: &'static str, params: &[(String, Tensor)]) -> Result<()> {
    let mut seen: std::collections::HashMap<u64, &str> = std::collections::HashMap::new();
    for (name, p) in params {
        let st = p.storage();
        let Storage::Cuda(c) = &*st else { continue };
        if c.is_empty() {
            continue;
        }
        if let Some(first) = seen.insert(c.addr(), name) {
            return Err(Error::Unsupported {
                op,
                what: format!("`{first}` and `{name}` are the same tensor: list a shared parameter once"),
            });
        }
    }
    Ok(())
}

/// Mixed precision on CUDA: gives every f32 parameter of `opt` that is on a GPU a `dtype` (bf16 or
/// f16) compute copy, converted from the master now (round to nearest even) and written by every
/// later [`Optimizer::step`] in the same launch as the update. The master owns its copy
/// ([`Tensor::compute_copy`] hands it out, read-only, inside an
/// [`autocast`](crate::nn::autocast) scope), so the copy lives as long as the optimizer that
/// writes it. Returns how many copies were attached; parameters on the CPU or not f32 get none
/// (their compute copies are conversions, made per use). Call it after the parameters are on
/// their device and after any checkpoint is loaded into them (a later `set_data` makes a copy
/// stale, and the forward converts again until this is called anew).
pub fn attach_compute_copies(opt: &mut dyn Optimizer, dtype: DType) -> Result<usize> {
    let format = match dtype {
        DType::BF16 => CopyFormat::Bf16,
        DType::F16 => CopyFormat::F16,
        other => {
            return Err(Error::Unsupported {
                op: "attach_compute_copies",
                what: format!("{other:?} compute copies: they are bf16 or f16"),
            });
        }
    };
    distinct_cuda_parameters("attach_compute_copies", opt.params())?;
    let params: Vec<Tensor> = opt.params().iter().map(|(_, p)| p.clone()).collect();
    let mut attached = 0;
    for (i, p) in params.iter().enumerate() {
        if !matches!(p.device(), Device::Cuda(_)) || p.dtype() != DType::F32 {
            continue;
        }
        let copy = {
            let _g = crate::tensor::no_grad();
            p.to_dtype(dtype)?
        };
        let addr = match &*copy.storage() {
            Storage::Cuda(c) => c.addr(),
            Storage::Cpu(_) => continue,
        };
        // Register first, then hand the copy to the master: a copy this replaces stays allocated
        // until the optimizer has forgotten its address.
        let len = p.elem_count();
        // SAFETY: the copy's storage is owned by the master `p` from the next line on (and `copy`
        // holds it until then), and the optimizer holds `p`, so the storage stays allocated for as
        // long as the registration; `Tensor::compute_copy` hands it out only as read-only views,
        // so nothing else writes it during a step.
        unsafe { opt.set_compute_copy(i, Some(ComputeCopy { addr, len, format }))? };
        p.attach_compute_copy(copy)?;
        attached += 1;
    }
    Ok(attached)
}

fn grad_of(p: &Tensor) -> Option<Vec<f64>> {
    p.grad().map(|g| g.to_vec_f64())
}

fn write_back(p: &Tensor, v: &[f64]) -> Result<()> {
    p.set_data(&Tensor::from_f64(v, p.shape().clone(), p.dtype())?)
}

fn state_vec(name: &str, key: &str, v: &[f64], like: &Tensor) -> Result<(String, Tensor)> {
    Ok((format!("{key}.{name}"), Tensor::from_f64(v, like.shape().clone(), DType::F64)?))
}

fn load_vec(
    state: &std::collections::HashMap<String, Tensor>,
    key: &str,
    name: &str,
    like: &Tensor,
) -> Result<Vec<f64>> {
    let k = format!("{key}.{name}");
    let t =
        state.get(&k).ok_or_else(|| Error::shape("load_state", format!("checkpoint has no optimizer state `{k}`")))?;
    if t.shape() != like.shape() {
        return Err(Error::shape(
            "load_state",
            format!("`{k}` has shape {}, the parameter {}", t.shape(), like.shape()),
        ));
    }
    Ok(t.to_vec_f64())
}
