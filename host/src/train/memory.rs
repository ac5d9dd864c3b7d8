//! What a run needs in host and device memory, checked before it starts.

use crate::error::{Error, Result};

/// Bytes of memory a piece of work needs, by place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Host memory.
    pub host: u64,
    /// GPU memory (0 for work that stays on the CPU).
    pub device: u64,
}

/// The host memory available to this process, in bytes: `MemAvailable` of `/proc/meminfo`, and
/// no more than the room left under the cgroup's limit in a container (`memory.max` minus the
/// working set: `memory.current` less the reclaimable `inactive_file` of `memory.stat`). None
/// where neither can be read (the check is then skipped; a size beyond 64 bits is still refused).
pub fn host_memory_available() -> Option<u64> {
    let field = |text: &str, key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.split_whitespace().next() == Some(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| field(&m, "MemAvailable:"))
        .and_then(|kib| kib.checked_mul(1024));
    let read = |f: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{f}")).ok();
    let cgroup = read("memory.max").and_then(|max| max.trim().parse::<u64>().ok()).map(|max| {
        let current = read("memory.current").and_then(|c| c.trim().parse::<u64>().ok()).unwrap_or(0);
        let inactive = read("memory.stat").and_then(|s| field(&s, "inactive_file")).unwrap_or(0);
        max.saturating_sub(current.saturating_sub(inactive))
    });
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Checks `need` against the host's available memory and, when `gpu` is given, the GPU's free
/// memory: [`Error::OutOfMemory`] naming `what` and `hint` (what to lower) if either falls short.
pub fn check_memory(what: &str, need: MemoryNeed, gpu: Option<&crate::cuda::Device>, hint: &str) -> Result<()> {
    let short = |place, needed, available| Error::OutOfMemory {
        what: what.to_string(),
        place,
        needed,
        available,
        hint: hint.to_string(),
    };
    match host_memory_available() {
        Some(available) if need.host > available => return Err(short("host", need.host, available)),
        None if need.host == u64::MAX => return Err(short("host", need.host, 0)),
        _ => {}
    }
    if let Some(d) = gpu {
        let (free, _) = d.context().mem_get_info().map_err(Error::driver("reading the GPU's free memory"))?;
        if need.device > free as u64 {
            return Err(short("GPU", need.device, free as u64));
        }
    }
    Ok(())
}
