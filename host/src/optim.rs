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

use crate::cuda::optim::{ComputeCopy, CopyFormat, MultiTensorTable, TensorSlot};
use crate::error::{Error, Result};
use crate::tensor::{CudaStorage, DType, Device, Storage, Tensor};
use kiln_gpu::kernels::optim::{CLIP_EPS, MultiAdam, MultiSgd, StepScalars};
use std::sync::Arc;

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

/// The device address of a CUDA tensor's elements.
/// A step count as the device's counter (at most `i32::MAX`: the host's `powi` exponent).
fn step_count(t: u64) -> Result<u32> {
    match i32::try_from(t) {
        Ok(v) => Ok(v as u32),
        Err(_) => Err(Error::Unsupported {
            op: "optimizer step",
            what: format!("{t} steps: the device's step counter stops at {}", i32::MAX),
        }),
    }
}

fn cuda_addr(s: &CudaStorage) -> u64 {
    s.addr()
}

/// The scale the next step applies to the gradients.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PendingClip {
    /// No clipping.
    None,
    /// The CPU reference's scale.
    Host(f64),
    /// The scale the norm launch left on the device.
    Device,
}

/// The norm of the last `clip_grad_norm`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum LastNorm {
    /// Not measured yet.
    None,
    /// Measured on the CPU.
    Host(f64),
    /// On the device, in the table's clip state.
    Device,
}

/// The CUDA side of an optimizer: the state arrays of its parameters on the GPU, the
/// multi-tensor table over them, the compute copies, and the clipping state.
struct Fused {
    /// State arrays per parameter (SGD: the velocity, none without momentum; Adam: m and v).
    n_states: usize,
    /// Each parameter's device state (empty until it is first seen on CUDA or loaded there).
    state: Vec<Vec<CudaStorage>>,
    /// Whether a parameter's device state means something (a fused step updated it, or it was
    /// loaded): [`Optimizer::state`] saves it then.
    has_state: Vec<bool>,
    /// Each parameter's compute copy.
    copies: Vec<Option<ComputeCopy>>,
    /// Parameters that take no weight decay.
    no_decay: Vec<bool>,
    table: Option<MultiTensorTable>,
    /// The table's parameters: (index, address, elements) as built.
    members: Vec<(usize, u64, usize)>,
    /// The state or the copies changed: rebuild the table before the next launch.
    dirty: bool,
    clip: PendingClip,
    last_norm: LastNorm,
    /// Steps taken before the coming one (Adam's host count): a newly built table starts its
    /// device step count here.
    host_steps: u64,
}

/// What a launch over the table needs: each member's gradient address (0: none), and the gradient
/// tensors, held until the launch is enqueued.
struct Gathered {
    grads: Vec<u64>,
    _keep: Vec<Tensor>,
}

impl Fused {
    fn new(n_params: usize, n_states: usize) -> Fused {
        Fused {
            n_states,
            state: (0..n_params).map(|_| Vec::new()).collect(),
            has_state: vec![false; n_params],
            copies: vec![None; n_params],
            no_decay: vec![false; n_params],
            table: None,
            members: Vec::new(),
            dirty: false,
            clip: PendingClip::None,
            last_norm: LastNorm::None,
            host_steps: 0,
        }
    }

    /// Brings the table up to date with the parameters now on CUDA (allocating zeroed state for
    /// parameters seen there for the first time) and gathers their gradients. None when no
    /// parameter is on CUDA.
    fn prepare(&mut self, params: &[(String, Tensor)]) -> Result<Option<Gathered>> {
        let op = "optimizer step";
        distinct_cuda_parameters(op, params)?;
        let mut members = Vec::new();
        let mut grads = Vec::new();
        let mut keep = Vec::new();
        let mut dev: Option<Arc<crate::cuda::Device>> = None;
        for (i, (name, p)) in params.iter().enumerate() {
            let st = p.storage();
            let Storage::Cuda(pc) = &*st else { continue };
            if st.dtype() != DType::F32 {
                return Err(Error::Unsupported {
                    op,
                    what: format!(
                        "`{name}` is {:?}: the fused update keeps f32 master weights; make the parameter f32 and \
                         register its 16-bit copy with set_compute_copy",
                        st.dtype()
                    ),
                });
            }
            match &dev {
                None => dev = Some(pc.dev.clone()),
                Some(d) if !Arc::ptr_eq(d, &pc.dev) => {
                    return Err(Error::Unsupported {
                        op,
                        what: format!("parameter `{name}` is on another GPU than the others: keep them on one"),
                    });
                }
                Some(_) => {}
            }
            members.push((i, cuda_addr(pc), pc.len()));
            let g = match p.grad() {
                None => 0,
                Some(g) => {
                    let gs = g.storage();
                    let addr = match &*gs {
                        Storage::Cuda(_) if gs.dtype() != DType::F32 => {
                            return Err(Error::Unsupported {
                                op,
                                what: format!("`{name}` has a {:?} gradient: the fused update reads f32", gs.dtype()),
                            });
                        }
                        Storage::Cuda(gc) if gc.len() == pc.len() => cuda_addr(gc),
                        Storage::Cuda(gc) => {
                            return Err(Error::shape(
                                op,
                                format!("`{name}` has {} elements, its gradient {}", pc.len(), gc.len()),
                            ));
                        }
                        Storage::Cpu(_) => {
                            return Err(Error::Device {
                                op,
                                a: Device::Cuda(pc.dev.clone()).name(),
                                b: Device::Cpu.name(),
                            });
                        }
                    };
                    drop(gs);
                    keep.push(g);
                    addr
                }
            };
            grads.push(g);
        }
        let Some(dev) = dev else { return Ok(None) };
        for &(i, _, len) in &members {
            let fits = self.state[i].len() == self.n_states
                && self.state[i].iter().all(|s| s.len() == len && Arc::ptr_eq(&s.dev, &dev));
            if !fits {
                self.state[i] = (0..self.n_states).map(|_| CudaStorage::full(&dev, len, 0.0)).collect::<Result<_>>()?;
                self.has_state[i] = false;
                self.dirty = true;
            }
        }
        let same_device = self.table.as_ref().is_some_and(|t| Arc::ptr_eq(t.device(), &dev));
        if self.dirty || !same_device || self.members != members {
            let slots: Vec<TensorSlot> = members
                .iter()
                .map(|&(i, addr, len)| {
                    let s = &self.state[i];
                    TensorSlot {
                        param: addr,
                        len,
                        state1: s.first().map_or(0, cuda_addr),
                        state2: s.get(1).map_or(0, cuda_addr),
                        copy: self.copies[i],
                        no_decay: self.no_decay[i],
                    }
                })
                .collect();
            match &mut self.table {
                Some(t) if same_device => t.set_tensors(&slots)?,
                _ => {
                    let mut t = MultiTensorTable::new(&dev, &slots)?;
                    if self.host_steps > 0 {
                        t.set_step_scalars(StepScalars { t: step_count(self.host_steps)?, ..StepScalars::default() })?;
                    }
                    self.table = Some(t);
                }
            }
            self.members = members;
            self.dirty = false;
        }
        Ok(Some(Gathered { grads, _keep: keep }))
    }

    /// Runs `launch` over the CUDA parameters (with the clip scale when the last clip left one on
    /// the device) and returns which parameters it updated; the caller updates the others on the
    /// host.
    fn step(
        &mut self,
        params: &[(String, Tensor)],
        clip: PendingClip,
        launch: impl FnOnce(&mut MultiTensorTable, &[u64], bool) -> Result<()>,
    ) -> Result<Vec<bool>> {
        let mut on_cuda = vec![false; params.len()];
        let Some(g) = self.prepare(params)? else { return Ok(on_cuda) };
        let table = self.table.as_mut().expect("prepare built the table");
        launch(table, &g.grads, clip == PendingClip::Device)?;
        for (&(i, _, _), &grad) in self.members.iter().zip(&g.grads) {
            on_cuda[i] = true;
            if grad != 0 {
                self.has_state[i] = true;
            }
        }
        Ok(on_cuda)
    }

    /// [`Optimizer::clip_grad_norm`].
    fn clip_grad_norm(&mut self, params: &[(String, Tensor)], max_norm: f64) -> Result<()> {
        if !(max_norm.is_finite() && max_norm > 0.0) {
            return Err(Error::InvalidSetting {
                setting: "--clip-grad-norm",
                value: max_norm.to_string(),
                allowed: "the largest gradient norm must be a finite number greater than 0".into(),
            });
        }
        let cuda = params.iter().filter(|(_, p)| matches!(p.device(), Device::Cuda(_))).count();
        if cuda > 0 && cuda < params.len() {
            return Err(Error::Unsupported {
                op: "clip_grad_norm",
                what: format!(
                    "{cuda} of {} parameters on a GPU, the rest on the CPU: move them to one device",
                    params.len()
                ),
            });
        }
        if cuda > 0 {
            let g = self.prepare(params)?.expect("every parameter is on CUDA");
            let table = self.table.as_mut().expect("prepare built the table");
            // SAFETY: the table's parameters, state and copies are alive (this optimizer holds the
            // parameters and the state; the copies by set_compute_copy's contract), and `g` holds
            // the gradients until the launch is enqueued (their memory is freed in stream order).
            unsafe { table.grad_norm(&g.grads, max_norm as f32)? };
            self.clip = PendingClip::Device;
            self.last_norm = LastNorm::Device;
            return Ok(());
        }
        let mut sum = 0.0f64;
        for (_, p) in params {
            if let Some(g) = grad_of(p) {
                sum += g.iter().map(|x| x * x).sum::<f64>();
            }
        }
        let norm = sum.sqrt();
        let coef = max_norm / (norm + CLIP_EPS as f64);
        self.clip = PendingClip::Host(if coef < 1.0 { coef } else { 1.0 });
        self.last_norm = LastNorm::Host(norm);
        Ok(())
    }

    /// [`Optimizer::unscale_grads`].
    fn unscale_grads(&mut self, params: &[(String, Tensor)], inv_scale: f64, max_norm: Option<f64>) -> Result<bool> {
        if !(inv_scale.is_finite() && inv_scale > 0.0) {
            return Err(Error::InvalidSetting {
                setting: "loss scale",
                value: (1.0 / inv_scale).to_string(),
                allowed: "a finite number greater than 0".into(),
            });
        }
        if let Some(m) = max_norm.filter(|m| !(m.is_finite() && *m > 0.0)) {
            return Err(Error::InvalidSetting {
                setting: "--clip-grad-norm",
                value: m.to_string(),
                allowed: "the largest gradient norm must be a finite number greater than 0".into(),
            });
        }
        let cuda = params.iter().filter(|(_, p)| matches!(p.device(), Device::Cuda(_))).count();
        if cuda > 0 && cuda < params.len() {
            return Err(Error::Unsupported {
                op: "unscale_grads",
                what: format!(
                    "{cuda} of {} parameters on a GPU, the rest on the CPU: move them to one device",
                    params.len()
                ),
            });
        }
        let clip_of = |norm: f64| match max_norm {
            Some(m) => (m / (norm + CLIP_EPS as f64)).min(1.0),
            None => 1.0,
        };
        if cuda > 0 {
            let g = self.prepare(params)?.expect("every parameter is on CUDA");
            let table = self.table.as_mut().expect("prepare built the table");
            // SAFETY: as in `clip_grad_norm`.
            unsafe { table.grad_norm(&g.grads, f32::MAX)? };
            let scaled = table.clip_state()?.norm;
            if !scaled.is_finite() {
                self.clip = PendingClip::None;
                return Ok(false);
            }
            let norm = scaled as f64 * inv_scale;
            table.set_clip_state(norm as f32, (inv_scale * clip_of(norm)) as f32)?;
            self.clip = PendingClip::Device;
            self.last_norm = LastNorm::Device;
            return Ok(true);
        }
        let mut sum = 0.0f64;
        for (_, p) in params {
            if let Some(g) = grad_of(p) {
                sum += g.iter().map(|x| x * x).sum::<f64>();
            }
        }
        if !sum.is_finite() {
            self.clip = PendingClip::None;
            return Ok(false);
        }
        let norm = sum.sqrt() * inv_scale;
        self.clip = PendingClip::Host(inv_scale * clip_of(norm));
        self.last_norm = LastNorm::Host(norm);
        Ok(true)
    }

    /// [`Optimizer::grad_norm`].
    fn grad_norm(&self) -> Result<Option<f64>> {
        match self.last_norm {
            LastNorm::None => Ok(None),
            LastNorm::Host(n) => Ok(Some(n)),
            LastNorm::Device => match &self.table {
                Some(t) => Ok(Some(t.clip_state()?.norm as f64)),
                None => Ok(None),
            },
        }
    }

    /// [`Optimizer::set_compute_copy`] (the caller has the safety contract).
    fn set_compute_copy(&mut self, params: &[(String, Tensor)], index: usize, copy: Option<ComputeCopy>) -> Result<()> {
        let op = "set_compute_copy";
        let (name, p) =
            params.get(index).ok_or_else(|| Error::shape(op, format!("parameter {index} of {}", params.len())))?;
        if let Some(c) = copy {
            if !matches!(p.device(), Device::Cuda(_)) || p.dtype() != DType::F32 {
                return Err(Error::Unsupported {
                    op,
                    what: format!(
                        "`{name}` is {:?} on the {}: compute copies are of f32 parameters on CUDA",
                        p.dtype(),
                        p.device().name()
                    ),
                });
            }
            if c.len != p.elem_count() {
                return Err(Error::shape(
                    op,
                    format!("a copy of {} values for `{name}` of {} elements", c.len, p.elem_count()),
                ));
            }
        }
        self.copies[index] = copy;
        self.dirty = true;
        Ok(())
    }

    /// Writes the learning rate into the table's step scalars (none without a table).
    fn write_lr(&mut self, lr: f64) -> Result<()> {
        match &mut self.table {
            Some(t) => t.write_lr(lr as f32),
            None => Ok(()),
        }
    }

    /// The device's step count, where a table holds one (one download).
    fn device_steps(&self) -> Result<Option<u64>> {
        match &self.table {
            Some(t) => Ok(Some(t.step_scalars()?.t as u64)),
            None => Ok(None),
        }
    }

    /// Replaces parameter `i`'s device state with `arrays` uploaded to `dev`.
    fn load(&mut self, i: usize, dev: &Arc<crate::cuda::Device>, arrays: &[&[f64]]) -> Result<()> {
        self.state[i] = arrays
            .iter()
            .map(|v| CudaStorage::upload(dev, &v.iter().map(|&x| x as f32).collect::<Vec<_>>()))
            .collect::<Result<_>>()?;
        self.has_state[i] = true;
        self.dirty = true;
        Ok(())
    }

    /// Parameter `i`'s device state array `k`, when it means something.
    fn saved(&self, i: usize, k: usize) -> Result<Option<Vec<f64>>> {
        match self.state[i].get(k) {
            Some(s) if self.has_state[i] => Ok(Some(s.download()?.into_iter().map(f64::from).collect())),
            _ => Ok(None),
        }
    }
}

/// Stochastic gradient descent with momentum, weight decay and Nesterov momentum.
pub struct Sgd {
    params: Vec<(String, Tensor)>,
    lr: f64,
    /// Momentum factor (0 for plain SGD).
    pub momentum: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    velocity: Vec<Option<Vec<f64>>>,
    fused: Fused,
}

impl Sgd {
    /// A new optimizer.
    pub fn new(params: Vec<(String, Tensor)>, lr: f64, momentum: f64, weight_decay: f64, nesterov: bool) -> Sgd {
        let n = params.len();
        Sgd {
            params,
            lr,
            momentum,
            weight_decay,
            nesterov,
            velocity: vec![None; n],
            fused: Fused::new(n, usize::from(momentum != 0.0)),
        }
    }
}

impl Sgd {
    /// Device state arrays the current settings need: the velocity with momentum.
    fn sync_states(&mut self) {
        self.fused.n_states = usize::from(self.momentum != 0.0);
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        self.sync_states();
        let clip = std::mem::replace(&mut self.fused.clip, PendingClip::None);
        let h = MultiSgd {
            chunks: 0,
            lr: self.lr as f32,
            momentum: self.momentum as f32,
            weight_decay: self.weight_decay as f32,
            nesterov: self.nesterov as u32,
        };
        let lr = self.lr;
        // SAFETY: the table's parameters and velocities are alive (held by this optimizer), the
        // copies by set_compute_copy's contract, and the gradients until the launch is enqueued.
        let on_cuda = self.fused.step(&self.params, clip, |t, grads, clip| {
            if !t.device().is_capturing() {
                t.write_lr(lr as f32)?;
            }
            unsafe { t.sgd_scalars(grads, h, clip) }
        })?;
        let scale = if let PendingClip::Host(s) = clip { s } else { 1.0 };
        for (i, (_, p)) in self.params.iter().enumerate() {
            if on_cuda[i] {
                continue;
            }
            let Some(mut g) = grad_of(p) else { continue };
            let mut w = p.to_vec_f64();
            if scale != 1.0 {
                for gi in g.iter_mut() {
                    *gi *= scale;
                }
            }
            if self.weight_decay != 0.0 {
                for (gi, wi) in g.iter_mut().zip(&w) {
                    *gi += self.weight_decay * wi;
                }
            }
            if self.momentum != 0.0 {
                // PyTorch's convention: the first step's buffer is the gradient itself.
                match &mut self.velocity[i] {
                    None => self.velocity[i] = Some(g.clone()),
                    Some(v) => {
                        for (vi, gi) in v.iter_mut().zip(&g) {
                            *vi = self.momentum * *vi + gi;
                        }
                    }
                }
                let v = self.velocity[i].as_ref().expect("set above");
                if self.nesterov {
                    for (gi, vi) in g.iter_mut().zip(v.iter()) {
                        *gi += self.momentum * vi;
                    }
                } else {
                    g.clone_from(v);
                }
            }
            for (wi, gi) in w.iter_mut().zip(&g) {
                *wi -= self.lr * gi;
            }
            write_back(p, &w)?;
        }
        Ok(())
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for (i, (name, p)) in self.params.iter().enumerate() {
            if let Some(v) = self.fused.saved(i, 0)? {
                out.push(state_vec(name, "sgd.velocity", &v, p)?);
            } else if let Some(v) = &self.velocity[i] {
                out.push(state_vec(name, "sgd.velocity", v, p)?);
            }
        }
        Ok(out)
    }
    fn load_state(&mut self, state: &std::collections::HashMap<String, Tensor>) -> Result<()> {
        for (i, (name, p)) in self.params.iter().enumerate() {
            if state.contains_key(&format!("sgd.velocity.{name}")) {
                let v = load_vec(state, "sgd.velocity", name, p)?;
                if let Device::Cuda(dev) = p.device() {
                    self.fused.load(i, &dev, &[&v])?;
                }
                self.velocity[i] = Some(v);
            }
        }
        Ok(())
    }
    fn clip_grad_norm(&mut self, max_norm: f64) -> Result<()> {
        self.sync_states();
        self.fused.clip_grad_norm(&self.params, max_norm)
    }
    fn unscale_grads(&mut self, inv_scale: f64, max_norm: Option<f64>) -> Result<bool> {
        self.fused.unscale_grads(&self.params, inv_scale, max_norm)
    }
    fn grad_norm(&self) -> Result<Option<f64>> {
        self.fused.grad_norm()
    }
    unsafe fn set_compute_copy(&mut self, index: usize, copy: Option<ComputeCopy>) -> Result<()> {
        self.fused.set_compute_copy(&self.params, index, copy)
    }
    fn prepare_replay(&mut self) -> Result<()> {
        self.fused.write_lr(self.lr)
    }
}

/// Adam (and AdamW, with decoupled weight decay), with bias correction.
pub struct Adam {
    params: Vec<(String, Tensor)>,
    lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay: added to the gradient (Adam) or applied to the weights (AdamW).
    pub weight_decay: f64,
    /// AdamW's decoupled weight decay.
    pub decoupled: bool,
    t: u64,
    m: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
    fused: Fused,
}

impl Adam {
    /// Adam with the usual defaults (0.9, 0.999, 1e-8).
    #[allow(clippy::self_named_constructors)]
    pub fn adam(params: Vec<(String, Tensor)>, lr: f64, weight_decay: f64) -> Adam {
        Adam::new(params, lr, weight_decay, false)
    }
    /// AdamW.
    pub fn adamw(params: Vec<(String, Tensor)>, lr: f64, weight_decay: f64) -> Adam {
        Adam::new(params, lr, weight_decay, true)
    }
    fn new(params: Vec<(String, Tensor)>, lr: f64, weight_decay: f64, decoupled: bool) -> Adam {
        let m = params.iter().map(|(_, p)| vec![0.0; p.elem_count()]).collect();
        let v = params.iter().map(|(_, p)| vec![0.0; p.elem_count()]).collect();
        let fused = Fused::new(params.len(), 2);
        Adam { params, lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay, decoupled, t: 0, m, v, fused }
    }
    /// Steps taken. With parameters on CUDA, the device's count (one download), which the
    /// replays of a captured step advance too; else the host's.
    pub fn steps(&self) -> Result<u64> {
        Ok(self.fused.device_steps()?.unwrap_or(self.t))
    }
    /// Parameter groups: parameter `i` takes weight decay only where `decay[i]` is true (AdamW
    /// training of a transformer leaves biases, norms and embeddings undecayed). All parameters
    /// decay until this is called. On CUDA the fused launch reads a per-parameter flag.
    pub fn set_decay(&mut self, decay: &[bool]) -> Result<()> {
        if decay.len() != self.params.len() {
            return Err(Error::shape(
                "Adam::set_decay",
                format!("{} flags for {} parameters", decay.len(), self.params.len()),
            ));
        }
        self.fused.no_decay = decay.iter().map(|d| !d).collect();
        self.fused.dirty = true;
        Ok(())
    }
}

impl Optimizer for Adam {
    fn step(&mut self) -> Result<()> {
        self.fused.host_steps = self.t;
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(self.t as i32);
        let c2 = 1.0 - b2.powi(self.t as i32);
        let clip = std::mem::replace(&mut self.fused.clip, PendingClip::None);
        let h = MultiAdam {
            chunks: 0,
            lr: self.lr as f32,
            beta1: b1 as f32,
            beta2: b2 as f32,
            eps: self.eps as f32,
            weight_decay: self.weight_decay as f32,
            c1: c1 as f32,
            c2: c2 as f32,
            decoupled: self.decoupled as u32,
        };
        let lr = self.lr;
        // SAFETY: as Sgd::step, with both moments held by this optimizer. On CUDA the step count
        // and the bias corrections live on the device (a captured step replays them), with the
        // learning rate written there before (here, or by `prepare_replay` before a replay).
        let on_cuda = self.fused.step(&self.params, clip, |t, grads, clip| {
            if !t.device().is_capturing() {
                t.write_lr(lr as f32)?;
            }
            unsafe { t.adam_scalars(grads, h, (b1, b2), clip) }
        })?;
        let scale = if let PendingClip::Host(s) = clip { s } else { 1.0 };
        for (i, (_, p)) in self.params.iter().enumerate() {
            if on_cuda[i] {
                continue;
            }
            let Some(mut g) = grad_of(p) else { continue };
            let mut w = p.to_vec_f64();
            if scale != 1.0 {
                for gi in g.iter_mut() {
                    *gi *= scale;
                }
            }
            let wd = if self.fused.no_decay[i] { 0.0 } else { self.weight_decay };
            if wd != 0.0 && !self.decoupled {
                for (gi, wi) in g.iter_mut().zip(&w) {
                    *gi += wd * wi;
                }
            }
            let (m, v) = (&mut self.m[i], &mut self.v[i]);
            for j in 0..w.len() {
                m[j] = b1 * m[j] + (1.0 - b1) * g[j];
                v[j] = b2 * v[j] + (1.0 - b2) * g[j] * g[j];
                let mhat = m[j] / c1;
                let vhat = v[j] / c2;
                if self.decoupled && wd != 0.0 {
                    w[j] -= self.lr * wd * w[j];
                }
                w[j] -= self.lr * mhat / (vhat.sqrt() + self.eps);
            }
            write_back(p, &w)?;
        }
        Ok(())
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = vec![("adam.t".to_string(), Tensor::from_f64(&[self.steps()? as f64], [1], DType::F64)?)];
        for (i, (name, p)) in self.params.iter().enumerate() {
            let (m, v) = match (self.fused.saved(i, 0)?, self.fused.saved(i, 1)?) {
                (Some(m), Some(v)) => (m, v),
                _ => (self.m[i].clone(), self.v[i].clone()),
            };
            out.push(state_vec(name, "adam.m", &m, p)?);
            out.push(state_vec(name, "adam.v", &v, p)?);
        }
        Ok(out)
    }
    fn load_state(&mut self, state: &std::collections::HashMap<String, Tensor>) -> Result<()> {
        let t = state.get("adam.t").ok_or_else(|| Error::shape("load_state", "checkpoint has no `adam.t`"))?;
        self.t = t.item()? as u64;
        if let Some(table) = &mut self.fused.table {
            table.set_step_scalars(StepScalars { lr: self.lr as f32, t: step_count(self.t)?, c1: 0.0, c2: 0.0 })?;
        }
        for (i, (name, p)) in self.params.iter().enumerate() {
            self.m[i] = load_vec(state, "adam.m", name, p)?;
            self.v[i] = load_vec(state, "adam.v", name, p)?;
            if let Device::Cuda(dev) = p.device() {
                self.fused.load(i, &dev, &[&self.m[i], &self.v[i]])?;
            }
        }
        Ok(())
    }
    fn clip_grad_norm(&mut self, max_norm: f64) -> Result<()> {
        self.fused.clip_grad_norm(&self.params, max_norm)
    }
    fn unscale_grads(&mut self, inv_scale: f64, max_norm: Option<f64>) -> Result<bool> {
        self.fused.unscale_grads(&self.params, inv_scale, max_norm)
    }
    fn grad_norm(&self) -> Result<Option<f64>> {
        self.fused.grad_norm()
    }
    unsafe fn set_compute_copy(&mut self, index: usize, copy: Option<ComputeCopy>) -> Result<()> {
        self.fused.set_compute_copy(&self.params, index, copy)
    }
    fn prepare_replay(&mut self) -> Result<()> {
        self.fused.write_lr(self.lr)
    }
}

/// A learning-rate schedule: the rate for step `t` (0-based) from the base rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LrSchedule {
    /// The base rate throughout.
    Constant,
    /// Multiply by `gamma` every `every` steps.
    Step {
        /// Steps between decays.
        every: usize,
        /// Decay factor.
        gamma: f64,
    },
    /// Linear warmup from 0 over `warmup` steps, then cosine decay to `min_ratio` x base at `total`.
    CosineWarmup {
        /// Warmup steps.
        warmup: usize,
        /// Total steps.
        total: usize,
        /// Final rate as a fraction of the base.
        min_ratio: f64,
    },
}

impl LrSchedule {
    /// The rate at step `t`.
    pub fn lr(&self, base: f64, t: usize) -> f64 {
        match *self {
            LrSchedule::Constant => base,
            LrSchedule::Step { every, gamma } => base * gamma.powi((t / every.max(1)) as i32),
            LrSchedule::CosineWarmup { warmup, total, min_ratio } => {
                if t < warmup {
                    base * (t + 1) as f64 / warmup as f64
                } else {
                    let span = total.saturating_sub(warmup).max(1);
                    let p = ((t - warmup) as f64 / span as f64).min(1.0);
                    let min = base * min_ratio;
                    min + (base - min) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
                }
            }
        }
    }
}
/// Dynamic loss scaling for f16 training (PyTorch's `GradScaler`): the loss is multiplied by
/// [`LossScaler::scale`] before the backward, so that small gradients do not underflow f16; the
/// optimizer's update divides the gradients by it again (fused into the update:
/// [`Optimizer::unscale_grads`]). A step whose scaled gradients are not finite is skipped and
/// the scale halved; after `growth_interval` good steps in a row the scale doubles.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaler {
    scale: f64,
    growth_interval: u32,
    good_steps: u32,
    skipped: u64,
}

impl LossScaler {
    /// Growth after a run of good steps.
    pub const GROWTH: f64 = 2.0;
    /// Backoff after a non-finite step.
    pub const BACKOFF: f64 = 0.5;
    /// The smallest scale (a backoff stops here).
    pub const MIN_SCALE: f64 = 1.0 / (1u64 << 24) as f64;
    /// The largest scale (growth stops here: f32's range).
    pub const MAX_SCALE: f64 = (1u64 << 48) as f64;

    /// A scaler starting at `init_scale`, growing after `growth_interval` good steps in a row.
    pub fn new(init_scale: f64, growth_interval: u32) -> Result<LossScaler> {
        if !(init_scale.is_finite() && (Self::MIN_SCALE..=Self::MAX_SCALE).contains(&init_scale)) {
            return Err(Error::InvalidSetting {
                setting: "loss scale",
                value: init_scale.to_string(),
                allowed: format!("a number in {}..={}", Self::MIN_SCALE, Self::MAX_SCALE),
            });
        }
        if growth_interval == 0 {
            return Err(Error::InvalidSetting {
                setting: "loss-scale growth interval",
                value: "0".into(),
                allowed: "at least 1 good step".into(),
            });
        }
        Ok(LossScaler { scale: init_scale, growth_interval, good_steps: 0, skipped: 0 })
    }

    /// PyTorch's defaults: 2^16, doubling after 2000 good steps.
    pub fn f16_default() -> LossScaler {
        LossScaler { scale: 65536.0, growth_interval: 2000, good_steps: 0, skipped: 0 }
    }

    /// The factor the loss is multiplied by now.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Steps skipped so far (non-finite gradients).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Records one step's outcome: a finite step counts towards growth (doubling the scale after
    /// `growth_interval` in a row); a non-finite one halves it, restarts the count, and counts as
    /// skipped.
    pub fn update(&mut self, finite: bool) {
        if finite {
            self.good_steps += 1;
            if self.good_steps >= self.growth_interval {
                self.scale = (self.scale * Self::GROWTH).min(Self::MAX_SCALE);
                self.good_steps = 0;
            }
        } else {
            self.scale = (self.scale * Self::BACKOFF).max(Self::MIN_SCALE);
            self.good_steps = 0;
            self.skipped += 1;
        }
    }

    /// After `loss * scale()` went backward: unscales the gradients inside the optimizer's update
    /// (clipping to `max_norm` too, when given) and steps, or skips the step where they are not
    /// finite; then updates the scale. Returns whether the step was taken. The caller zeroes the
    /// gradients either way.
    pub fn step(&mut self, opt: &mut dyn Optimizer, max_norm: Option<f64>) -> Result<bool> {
        let finite = opt.unscale_grads(1.0 / self.scale, max_norm)?;
        if finite {
            opt.step()?;
        }
        self.update(finite);
        Ok(finite)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_scaler_grows_after_a_run_of_good_steps_and_halves_on_overflow() {
        let mut s = LossScaler::new(1024.0, 3).unwrap();
        s.update(true);
        s.update(true);
        assert_eq!(s.scale(), 1024.0);
        s.update(true);
        assert_eq!(s.scale(), 2048.0, "the third good step in a row doubles it");
        s.update(true);
        s.update(true);
        s.update(false);
        assert_eq!((s.scale(), s.skipped()), (1024.0, 1), "an overflow halves it and restarts the run");
        s.update(true);
        s.update(true);
        assert_eq!(s.scale(), 1024.0, "two good steps after the overflow are not a run of three");
        s.update(true);
        assert_eq!(s.scale(), 2048.0);
        // the scale stays within [MIN_SCALE, MAX_SCALE]
        let mut low = LossScaler::new(LossScaler::MIN_SCALE, 1).unwrap();
        low.update(false);
        assert_eq!(low.scale(), LossScaler::MIN_SCALE);
        let mut high = LossScaler::new(LossScaler::MAX_SCALE, 1).unwrap();
        high.update(true);
        assert_eq!(high.scale(), LossScaler::MAX_SCALE);
        assert_eq!(LossScaler::f16_default().scale(), 65536.0);
    }

    #[test]
    fn loss_scaler_settings_are_checked() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e30] {
            assert!(matches!(LossScaler::new(bad, 10), Err(Error::InvalidSetting { .. })), "{bad}");
        }
        assert!(matches!(LossScaler::new(8.0, 0), Err(Error::InvalidSetting { .. })));
    }

    /// A parameter and an SGD optimizer over it whose gradient is `scale * g` (the backward of
    /// `scale * sum(w * g)`).
    fn scaled_grad(w: &[f32], g: &[f32], scale: f64) -> (Tensor, Sgd) {
        let n = w.len();
        let p = Tensor::from_vec(w.to_vec(), [n]).unwrap().requires_grad();
        let gt = Tensor::from_vec(g.to_vec(), [n]).unwrap();
        p.mul(&gt).unwrap().sum_all().unwrap().mul_scalar(scale).unwrap().backward().unwrap();
        let opt = Sgd::new(vec![("w".into(), p.clone())], 0.5, 0.0, 0.0, false);
        (p, opt)
    }

    #[test]
    fn a_scaled_step_updates_like_the_unscaled_one_and_an_overflow_skips() {
        let (w, g) = ([1.0f32, -2.0, 3.0], [0.25f32, 0.5, -1.0]);
        let (plain, mut opt) = scaled_grad(&w, &g, 1.0);
        opt.step().unwrap();
        let mut scaler = LossScaler::new(1024.0, 100).unwrap();
        let (scaled, mut sopt) = scaled_grad(&w, &g, scaler.scale());
        assert!(scaler.step(&mut sopt, None).unwrap());
        assert_eq!(scaled.to_vec_f32(), plain.to_vec_f32(), "1024 is a power of two: the same bits");
        assert_eq!(sopt.grad_norm().unwrap(), Some((0.0625f64 + 0.25 + 1.0).sqrt()), "the unscaled norm");
        // clipping applies to the unscaled norm
        let (clipped, mut copt) = scaled_grad(&w, &g, 1.0);
        copt.clip_grad_norm(0.5).unwrap();
        copt.step().unwrap();
        let (sc, mut scopt) = scaled_grad(&w, &g, scaler.scale());
        assert!(scaler.step(&mut scopt, Some(0.5)).unwrap());
        let (a, b) = (sc.to_vec_f32(), clipped.to_vec_f32());
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-6), "{a:?} vs {b:?}");
        // an overflow: the step is skipped, the weights stay, the scale halves
        let before = scaler.scale();
        let (over, mut oopt) = scaled_grad(&w, &[f32::MAX, 1.0, 1.0], 1e10);
        assert!(!scaler.step(&mut oopt, None).unwrap());
        assert_eq!(over.to_vec_f32(), w.to_vec());
        assert_eq!((scaler.scale(), scaler.skipped()), (before / 2.0, 1));
        // a bad scale is a typed error
        assert!(matches!(oopt.unscale_grads(f64::NAN, None), Err(Error::InvalidSetting { .. })));
    }
}
