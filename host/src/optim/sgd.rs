//! Stochastic gradient descent ([`Sgd`]): momentum, Nesterov momentum and weight decay; the CPU
//! reference in f64, one fused launch on CUDA.

use super::fused::{Fused, PendingClip};
use super::{Optimizer, grad_of, load_vec, state_vec, write_back};
use crate::cuda::optim::ComputeCopy;
use crate::error::Result;
use crate::tensor::{Device, Tensor};
use kiln_gpu::kernels::optim::MultiSgd;

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
