//! Optimizers and learning-rate schedules. Updates run in place on the parameters' data, in f64,
//! rounding once to the parameter's dtype.

use crate::error::{Error, Result};
use crate::tensor::{CudaStorage, DType, Storage, Tensor};
use kiln_gpu::kernels::tensor_ops::{AdamStep, SgdStep};

/// Runs `f` on a CUDA parameter's storage and its gradient's; `None` when the parameter is not on
/// a GPU (the caller takes the host path).
fn on_cuda<R>(p: &Tensor, f: impl FnOnce(&mut CudaStorage, &CudaStorage) -> Result<R>) -> Option<Result<R>> {
    if !matches!(p.device(), crate::tensor::Device::Cuda(_)) {
        return None;
    }
    let g = p.grad()?;
    let gs = g.storage();
    let mut ps = p.storage_mut();
    match (&mut *ps, &*gs) {
        (Storage::Cuda(pc), Storage::Cuda(gc)) => Some(f(pc, gc)),
        _ => Some(Err(Error::Device { op: "optimizer step", a: p.device().name(), b: g.device().name() })),
    }
}

/// An optimizer over a fixed list of named parameters.
pub trait Optimizer {
    /// Applies one update from the parameters' accumulated gradients (parameters without a gradient
    /// are left alone).
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
    device_velocity: Vec<Option<CudaStorage>>,
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
            device_velocity: (0..n).map(|_| None).collect(),
        }
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        for (i, (_, p)) in self.params.iter().enumerate() {
            let (lr, momentum, weight_decay, nesterov) = (self.lr, self.momentum, self.weight_decay, self.nesterov);
            let slot = &mut self.device_velocity[i];
            let fused = on_cuda(p, |pc, gc| {
                let first = slot.is_none();
                let vel = match slot {
                    Some(v) => v,
                    None => slot.insert(CudaStorage::full(&pc.dev, pc.len(), 0.0)?),
                };
                let h = SgdStep {
                    n: 0,
                    lr: lr as f32,
                    momentum: momentum as f32,
                    weight_decay: weight_decay as f32,
                    nesterov: nesterov as u32,
                    first: first as u32,
                };
                pc.sgd_step(gc, vel, h)
            });
            if let Some(r) = fused {
                r?;
                continue;
            }
            let Some(mut g) = grad_of(p) else { continue };
            let mut w = p.to_vec_f64();
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
            if let Some(v) = &self.device_velocity[i] {
                let v: Vec<f64> = v.download()?.into_iter().map(f64::from).collect();
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
                if let crate::tensor::Device::Cuda(dev) = p.device() {
                    self.device_velocity[i] =
                        Some(CudaStorage::upload(&dev, &v.iter().map(|&x| x as f32).collect::<Vec<_>>())?);
                }
                self.velocity[i] = Some(v);
            }
        }
        Ok(())
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
    device_mv: Vec<Option<(CudaStorage, CudaStorage)>>,
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
        let device_mv = params.iter().map(|_| None).collect();
        Adam { params, lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay, decoupled, t: 0, m, v, device_mv }
    }
    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.t
    }
}

impl Optimizer for Adam {
    fn step(&mut self) -> Result<()> {
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(self.t as i32);
        let c2 = 1.0 - b2.powi(self.t as i32);
        for (i, (_, p)) in self.params.iter().enumerate() {
            let h = AdamStep {
                n: 0,
                lr: self.lr as f32,
                beta1: b1 as f32,
                beta2: b2 as f32,
                eps: self.eps as f32,
                weight_decay: self.weight_decay as f32,
                c1: c1 as f32,
                c2: c2 as f32,
                decoupled: self.decoupled as u32,
            };
            let slot = &mut self.device_mv[i];
            let fused = on_cuda(p, |pc, gc| {
                let (m, v) = match slot {
                    Some(mv) => mv,
                    None => slot.insert((
                        CudaStorage::full(&pc.dev, pc.len(), 0.0)?,
                        CudaStorage::full(&pc.dev, pc.len(), 0.0)?,
                    )),
                };
                pc.adam_step(gc, m, v, h)
            });
            if let Some(r) = fused {
                r?;
                continue;
            }
            let Some(mut g) = grad_of(p) else { continue };
            let mut w = p.to_vec_f64();
            if self.weight_decay != 0.0 && !self.decoupled {
                for (gi, wi) in g.iter_mut().zip(&w) {
                    *gi += self.weight_decay * wi;
                }
            }
            let (m, v) = (&mut self.m[i], &mut self.v[i]);
            for j in 0..w.len() {
                m[j] = b1 * m[j] + (1.0 - b1) * g[j];
                v[j] = b2 * v[j] + (1.0 - b2) * g[j] * g[j];
                let mhat = m[j] / c1;
                let vhat = v[j] / c2;
                if self.decoupled && self.weight_decay != 0.0 {
                    w[j] -= self.lr * self.weight_decay * w[j];
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
        let mut out = vec![("adam.t".to_string(), Tensor::from_f64(&[self.t as f64], [1], DType::F64)?)];
        for (i, (name, p)) in self.params.iter().enumerate() {
            let (m, v) = match &self.device_mv[i] {
                Some((m, v)) => (
                    m.download()?.into_iter().map(f64::from).collect(),
                    v.download()?.into_iter().map(f64::from).collect(),
                ),
                None => (self.m[i].clone(), self.v[i].clone()),
            };
            out.push(state_vec(name, "adam.m", &m, p)?);
            out.push(state_vec(name, "adam.v", &v, p)?);
        }
        Ok(out)
    }
    fn load_state(&mut self, state: &std::collections::HashMap<String, Tensor>) -> Result<()> {
        let t = state.get("adam.t").ok_or_else(|| Error::shape("load_state", "checkpoint has no `adam.t`"))?;
        self.t = t.item()? as u64;
        for (i, (name, p)) in self.params.iter().enumerate() {
            self.m[i] = load_vec(state, "adam.m", name, p)?;
            self.v[i] = load_vec(state, "adam.v", name, p)?;
            if let crate::tensor::Device::Cuda(dev) = p.device() {
                let up = |v: &[f64]| CudaStorage::upload(&dev, &v.iter().map(|&x| x as f32).collect::<Vec<_>>());
                self.device_mv[i] = Some((up(&self.m[i])?, up(&self.v[i])?));
            }
        }
        Ok(())
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
