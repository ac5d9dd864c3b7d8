//! Shared by the GPU benchmarks: the median time of a closure over CUDA events
//! (`kiln::cuda::timing`, for closures that panic on failure).

use kiln::cuda::Device;
use std::sync::Arc;

/// The shared device, or `None` after printing why `bench` measures nothing (no GPU: the bench
/// exits 0, so that `cargo bench` works on machines without one).
#[allow(dead_code)]
pub fn gpu_or_skip(bench: &str) -> Option<Arc<Device>> {
    match Device::shared() {
        Ok(d) => Some(d),
        Err(e) => {
            println!("{bench}: no GPU ({e}); nothing measured");
            None
        }
    }
}

/// Whether `name` is among the comma-separated names in environment variable `var` (every name
/// when the variable is unset): the benches' subset selectors (`KILN_BENCH_MODELS=...`).
#[allow(dead_code)]
pub fn wanted(var: &str, name: &str) -> bool {
    std::env::var(var).map(|v| v.split(',').any(|w| w == name)).unwrap_or(true)
}

/// Median milliseconds of `f` over `reps` runs, timed with CUDA events on the device's stream after
/// two warm-ups.
#[allow(dead_code)]
pub fn median_ms(dev: &Device, reps: usize, f: impl FnMut()) -> f64 {
    median_ms_batched(dev, reps, 1, f)
}

/// Median over `reps` samples of the milliseconds per call when `batch` calls run back to back
/// between two events: the host's per-call work (checks, allocation, launches) overlaps the
/// device's, as in a training step, instead of the device idling for it at every sample.
#[allow(dead_code)]
pub fn median_ms_batched(dev: &Device, reps: usize, batch: usize, mut f: impl FnMut()) -> f64 {
    kiln::cuda::timing::median_ms(dev, reps, batch, || {
        f();
        Ok(())
    })
    .expect("timing with CUDA events")
}

/// Milliseconds for `calls` back-to-back calls of `f` between two CUDA events on the device's
/// stream (waits for the second).
#[allow(dead_code)]
pub fn events_ms(dev: &Device, calls: u64, mut f: impl FnMut()) -> f64 {
    kiln::cuda::timing::events_ms(dev, calls, || {
        f();
        Ok(())
    })
    .expect("timing with CUDA events")
}
