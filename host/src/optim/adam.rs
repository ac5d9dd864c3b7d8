//! Adam and AdamW ([`Adam`]) with bias correction and parameter groups; the CPU reference in f64,
//! on CUDA one tick of the device's step count and one fused launch.

use super::fused::{Fused, PendingClip, step_count};
use super::{Optimizer, grad_of, load_vec, state_vec, write_back};
use crate::cuda::optim::ComputeCopy;
use crate::error::{Error, Result};
use crate::tensor::{DType, Device, Tensor};
use kiln_gpu::kernels::optim::{MultiAdam, StepScalars};

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
        // the steps taken before this one: a table built by this step's launch starts there
        self.fused.host_steps = self.t;
        let t = self.t + 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(t as i32);
        let c2 = 1.0 - b2.powi(t as i32);
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
        self.t = t;
        self.fused.host_steps = t;
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
        // A table built later (by the first step's norm launch or the step itself) starts from
        // this count; one that exists takes it now.
        self.fused.host_steps = self.t;
        if let Some(table) = &mut self.fused.table {
            table.set_step_scalars(StepScalars { lr: self.lr as f32, t: step_count(self.t)?, ticket: 0, pad: 0 })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn param(v: &[f64]) -> Tensor {
        Tensor::from_f64(v, [v.len()], DType::F64).unwrap().requires_grad()
    }
    fn set_grad(p: &Tensor, g: &[f64]) {
        p.zero_grad();
        p.mul(&Tensor::from_f64(g, [g.len()], DType::F64).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
    }

    /// The device count of a table built after a resume: `gpu::gpt::resume_on_cuda_matches_cpu`
    /// once failed because the first launch after `load_state` (the clip's norm launch) built the
    /// table from a count of 0, so the resumed step took step 1's bias corrections.
    #[test]
    fn a_table_built_after_load_state_starts_at_the_loaded_count() {
        let p = param(&[1.0, -2.0, 3.0]);
        let mut a = Adam::adamw(vec![("w".into(), p.clone())], 1e-2, 0.1);
        assert_eq!(a.fused.seed_scalars().unwrap(), None, "a fresh optimizer's table starts at 0");
        for g in [[0.5, -1.0, 2.0], [1.0, 1.0, -1.0], [0.1, 0.2, 0.3]] {
            set_grad(&p, &g);
            a.clip_grad_norm(1.0).unwrap();
            a.step().unwrap();
        }
        assert_eq!(a.steps().unwrap(), 3);
        let want = StepScalars { lr: 0.0, t: 3, ticket: 0, pad: 0 };
        assert_eq!(a.fused.seed_scalars().unwrap(), Some(want), "after steps: the count taken");
        let state: std::collections::HashMap<String, Tensor> = a.state().unwrap().into_iter().collect();

        let q = param(&p.to_vec_f64());
        let mut b = Adam::adamw(vec![("w".into(), q.clone())], 1e-2, 0.1);
        b.load_state(&state).unwrap();
        assert_eq!(b.steps().unwrap(), 3);
        assert_eq!(b.fused.seed_scalars().unwrap(), Some(want), "after load_state: the loaded count");
        // the first step after the resume: the clip comes first (on CUDA its launch builds the
        // table), then the step, which takes step 4's corrections and leaves 4 behind
        set_grad(&q, &[0.3, 0.3, -0.3]);
        b.clip_grad_norm(1.0).unwrap();
        assert_eq!(b.fused.seed_scalars().unwrap(), Some(want), "the clip does not count a step");
        b.step().unwrap();
        assert_eq!(b.steps().unwrap(), 4);
        assert_eq!(b.fused.seed_scalars().unwrap(), Some(StepScalars { t: 4, ..want }));
        // and it is the step the uninterrupted run takes
        set_grad(&p, &[0.3, 0.3, -0.3]);
        a.clip_grad_norm(1.0).unwrap();
        a.step().unwrap();
        assert_eq!(p.to_vec_f64(), q.to_vec_f64());
    }
}
