//! Dynamic loss scaling for f16 training ([`LossScaler`]).

use super::Optimizer;
use crate::error::{Error, Result};

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
    use crate::optim::Sgd;
    use crate::tensor::Tensor;

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
