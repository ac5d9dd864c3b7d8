//! Shared by the GPU benchmarks: the median time of a closure over CUDA events.

use kiln::cuda::Device;

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
    f();
    f();
    dev.synchronize().expect("warm-up");
    let mut ms: Vec<f64> = (0..reps).map(|_| events_ms(dev, batch as u64, &mut f) / batch as f64).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    ms[reps / 2]
}

/// Milliseconds for `calls` back-to-back calls of `f` between two CUDA events on the device's
/// stream (waits for the second).
#[allow(dead_code)]
pub fn events_ms(dev: &Device, calls: u64, mut f: impl FnMut()) -> f64 {
    use cudarc::driver::sys::CUevent_flags;
    let ctx = dev.context();
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).expect("event");
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).expect("event");
    start.record(dev.stream()).expect("record");
    for _ in 0..calls {
        f();
    }
    end.record(dev.stream()).expect("record");
    end.synchronize().expect("sync");
    start.elapsed_ms(&end).expect("elapsed") as f64
}
