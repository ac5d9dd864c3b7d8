//! Timing kernels with CUDA events on the device's stream (what the benchmarks and `kiln gemm` use).

use super::Device;
use crate::error::{Error, Result};

/// Milliseconds for `calls` back-to-back calls of `f` between two CUDA events on the device's
/// stream (waits for the second).
pub fn events_ms(dev: &Device, calls: u64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    use cudarc::driver::sys::CUevent_flags;
    let ctx = dev.context();
    let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(Error::driver("creating an event"));
    let (start, end) = (event()?, event()?);
    start.record(dev.stream()).map_err(Error::driver("recording an event"))?;
    for _ in 0..calls {
        f()?;
    }
    end.record(dev.stream()).map_err(Error::driver("recording an event"))?;
    end.synchronize().map_err(Error::driver("waiting for an event"))?;
    Ok(start.elapsed_ms(&end).map_err(Error::driver("reading an event"))? as f64)
}

/// Median over `reps` samples of the milliseconds per call when `batch` calls run back to back
/// between two events, after two warm-up calls.
pub fn median_ms(dev: &Device, reps: usize, batch: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    f()?;
    dev.synchronize()?;
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        ms.push(events_ms(dev, batch as u64, &mut f)? / batch as f64);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok(ms[ms.len() / 2])
}
