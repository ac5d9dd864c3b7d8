//! Loading a device's module image, and timing that load (`kiln info --load-time`).
//!
//! Which image a device loads is [`crate::ptx`]'s choice; this file hands it to the driver. A
//! cubin loads as is; PTX is JIT-compiled by the driver on its first load in a process, unless the
//! driver's cache on disk holds the result (`CUDA_CACHE_DISABLE=1` turns the cache off).

use super::Device;
use crate::error::{Error, Result};
use crate::ptx::{self, ImageKind, ImageSource, ModuleImage};
use cudarc::driver::{CudaContext, CudaModule};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Hands `source`'s image to the driver.
pub(super) fn load(ctx: &Arc<CudaContext>, source: &ImageSource) -> Result<Arc<CudaModule>> {
    let image = match ptx::read_image(source)? {
        ModuleImage::Ptx(text) => cudarc::nvrtc::Ptx::from_src(text.into_owned()),
        ModuleImage::Cubin(bytes) => cudarc::nvrtc::Ptx::from_binary(bytes.into_owned()),
    };
    ctx.load_module(image).map_err(Error::driver(format!("loading {source}")))
}

/// One timed load of a module image.
#[derive(Clone, Debug)]
pub struct ModuleLoadTime {
    /// What was loaded.
    pub source: ImageSource,
    /// How long the driver took (for PTX: its JIT compilation, or a lookup in its cache).
    pub elapsed: Duration,
}

/// Whether the driver's JIT cache is off in this process (`CUDA_CACHE_DISABLE=1`), so that a PTX
/// load times the compilation itself.
pub fn jit_cache_disabled() -> bool {
    std::env::var("CUDA_CACHE_DISABLE").is_ok_and(|v| v == "1")
}

impl Device {
    /// The image of its module this device loads ([`ptx::image_source`]: the embedded cubin where
    /// one runs on it, else the PTX; files from `$KILN_PTX_DIR` when set; PTX with `KILN_FORCE_PTX=1`).
    pub fn module_source(&self) -> ImageSource {
        let (major, minor) = self.compute_capability();
        ptx::image_source(self.arch(), major, minor)
    }

    /// Loads this device's module image ([`Device::module_source`]) and times the load; when that
    /// image was a cubin, then loads the same module's PTX too and times that: a first launch with
    /// and without the cubin, in one process. Each module is unloaded after its timing; the module
    /// the device launches from is not touched. Without `CUDA_CACHE_DISABLE=1` a PTX load may be a
    /// lookup in the driver's cache instead of a compilation.
    pub fn time_module_loads(&self) -> Result<Vec<ModuleLoadTime>> {
        let source = self.module_source();
        let mut sources = vec![source.clone()];
        if source.kind() == ImageKind::Cubin {
            let (major, minor) = self.compute_capability();
            let dir = std::env::var_os(ptx::PTX_DIR_ENV).map(std::path::PathBuf::from);
            sources.push(ptx::image_source_in(self.arch(), major, minor, dir.as_deref(), true, &[]));
        }
        let mut times = Vec::new();
        for source in sources {
            let start = Instant::now();
            let module = load(self.context(), &source)?;
            let elapsed = start.elapsed();
            drop(module);
            times.push(ModuleLoadTime { source, elapsed });
        }
        Ok(times)
    }
}
