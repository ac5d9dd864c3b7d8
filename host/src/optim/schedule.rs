//! Learning-rate schedules ([`LrSchedule`]): the rate for each step from the base rate.

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
