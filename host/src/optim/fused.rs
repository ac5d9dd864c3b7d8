//! The CUDA side of an optimizer ([`Fused`]): its parameters' state arrays on the GPU, the
//! multi-tensor table over them (rebuilt when the parameters, their state or their compute copies
//! change), gradient clipping's pending scale and last norm, and the device's step scalars.

use super::{distinct_cuda_parameters, grad_of};
use crate::cuda::optim::{ComputeCopy, MultiTensorTable, TensorSlot};
use crate::error::{Error, Result};
use crate::tensor::{CudaStorage, DType, Device, Storage, Tensor};
use kiln_gpu::kernels::optim::{CLIP_EPS, StepScalars};
use std::sync::Arc;

/// A step count as the device's counter (at most `i32::MAX`: the host's `powi` exponent).
pub(super) fn step_count(t: u64) -> Result<u32> {
    match i32::try_from(t) {
        Ok(v) => Ok(v as u32),
        Err(_) => Err(Error::Unsupported {
            op: "optimizer step",
            what: format!("{t} steps: the device's step counter stops at {}", i32::MAX),
        }),
    }
}

/// The device address of a CUDA tensor's elements.
fn cuda_addr(s: &CudaStorage) -> u64 {
    s.addr()
}

/// The scale the next step applies to the gradients.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum PendingClip {
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
pub(super) struct Fused {
    /// State arrays per parameter (SGD: the velocity, none without momentum; Adam: m and v).
    pub(super) n_states: usize,
    /// Each parameter's device state (empty until it is first seen on CUDA or loaded there).
    state: Vec<Vec<CudaStorage>>,
    /// Whether a parameter's device state means something (a fused step updated it, or it was
    /// loaded): [`Optimizer::state`] saves it then.
    has_state: Vec<bool>,
    /// Each parameter's compute copy.
    copies: Vec<Option<ComputeCopy>>,
    /// Parameters that take no weight decay.
    pub(super) no_decay: Vec<bool>,
    pub(super) table: Option<MultiTensorTable>,
    /// The table's parameters: (index, address, elements) as built.
    members: Vec<(usize, u64, usize)>,
    /// The state or the copies changed: rebuild the table before the next launch.
    pub(super) dirty: bool,
    pub(super) clip: PendingClip,
    last_norm: LastNorm,
    /// Adam's host count of steps taken (before the coming one, while a step runs): a newly built
    /// table starts its device step count here. The owner keeps it equal to its count at all
    /// times (construction, `load_state`, each step), because the table may be built by any launch
    /// over it: the norm launch of `clip_grad_norm` / `unscale_grads` before the first step after
    /// a resume builds it, and the step then runs on that table.
    pub(super) host_steps: u64,
}

/// What a launch over the table needs: each member's gradient address (0: none), and the gradient
/// tensors, held until the launch is enqueued.
struct Gathered {
    grads: Vec<u64>,
    _keep: Vec<Tensor>,
}

impl Fused {
    pub(super) fn new(n_params: usize, n_states: usize) -> Fused {
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
                    if let Some(s) = self.seed_scalars()? {
                        t.set_step_scalars(s)?;
                    }
                    self.table = Some(t);
                }
            }
            self.members = members;
            self.dirty = false;
        }
        Ok(Some(Gathered { grads, _keep: keep }))
    }

    /// The step scalars a newly built table starts from: the host's count (`host_steps`), where it
    /// is not 0 (a new table's scalars are all 0). The learning rate stays 0 there: the step writes
    /// it ([`MultiTensorTable::write_lr`] sees the 0 the table holds).
    pub(super) fn seed_scalars(&self) -> Result<Option<StepScalars>> {
        if self.host_steps == 0 {
            return Ok(None);
        }
        Ok(Some(StepScalars { t: step_count(self.host_steps)?, ..StepScalars::default() }))
    }

    /// Runs `launch` over the CUDA parameters (with the clip scale when the last clip left one on
    /// the device) and returns which parameters it updated; the caller updates the others on the
    /// host.
    pub(super) fn step(
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
    pub(super) fn clip_grad_norm(&mut self, params: &[(String, Tensor)], max_norm: f64) -> Result<()> {
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
    pub(super) fn unscale_grads(
        &mut self,
        params: &[(String, Tensor)],
        inv_scale: f64,
        max_norm: Option<f64>,
    ) -> Result<bool> {
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
    pub(super) fn grad_norm(&self) -> Result<Option<f64>> {
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
    pub(super) fn set_compute_copy(
        &mut self,
        params: &[(String, Tensor)],
        index: usize,
        copy: Option<ComputeCopy>,
    ) -> Result<()> {
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
    pub(super) fn write_lr(&mut self, lr: f64) -> Result<()> {
        match &mut self.table {
            Some(t) => t.write_lr(lr as f32),
            None => Ok(()),
        }
    }

    /// The device's step count, where a table holds one (one download).
    pub(super) fn device_steps(&self) -> Result<Option<u64>> {
        match &self.table {
            Some(t) => Ok(Some(t.step_scalars()?.t as u64)),
            None => Ok(None),
        }
    }

    /// Replaces parameter `i`'s device state with `arrays` uploaded to `dev`.
    pub(super) fn load(&mut self, i: usize, dev: &Arc<crate::cuda::Device>, arrays: &[&[f64]]) -> Result<()> {
        self.state[i] = arrays
            .iter()
            .map(|v| CudaStorage::upload(dev, &v.iter().map(|&x| x as f32).collect::<Vec<_>>()))
            .collect::<Result<_>>()?;
        self.has_state[i] = true;
        self.dirty = true;
        Ok(())
    }

    /// Parameter `i`'s device state array `k`, when it means something.
    pub(super) fn saved(&self, i: usize, k: usize) -> Result<Option<Vec<f64>>> {
        match self.state[i].get(k) {
            Some(s) if self.has_state[i] => Ok(Some(s.download()?.into_iter().map(f64::from).collect())),
            _ => Ok(None),
        }
    }
}
