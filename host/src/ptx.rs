//! The PTX modules built from `kiln-gpu` (by the build script, embedded in the binary), and the
//! choice of module for a device.

use crate::error::{Error, Result};
use kiln_gpu::Arch;
use std::borrow::Cow;
use std::path::PathBuf;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/ptx_modules.rs"));
}

/// Environment variable naming a directory of `kiln_<arch>.ptx` files to load instead of the
/// embedded ones (the GPU bundle sets it so that the PTX it ran is on disk beside the results).
pub const PTX_DIR_ENV: &str = "KILN_PTX_DIR";

/// The embedded PTX text of `arch`'s module.
pub fn embedded(arch: Arch) -> &'static str {
    embedded::MODULES
        .iter()
        .find(|(name, _)| *name == arch.name())
        .map(|(_, text)| *text)
        .expect("the build script embeds every architecture in kiln_gpu::Arch::ALL")
}

/// The PTX for `arch`: from `$KILN_PTX_DIR/kiln_<arch>.ptx` when that variable is set, else embedded.
pub fn module_text(arch: Arch) -> Result<Cow<'static, str>> {
    match std::env::var_os(PTX_DIR_ENV) {
        Some(dir) => {
            let path = PathBuf::from(dir).join(file_name(arch));
            std::fs::read_to_string(&path).map(Cow::Owned).map_err(|source| Error::PtxFile { path, source })
        }
        None => Ok(Cow::Borrowed(embedded(arch))),
    }
}

/// A module to load: PTX text (the driver compiles it) or a cubin ptxas already assembled.
pub enum ModuleImage {
    /// PTX source.
    Ptx(Cow<'static, str>),
    /// A cubin for exactly this architecture.
    Cubin(Vec<u8>),
}

/// What the device loads for `arch`: with `$KILN_PTX_DIR` set, the cubin `kiln_<arch>.cubin` there
/// when present (the GPU bundle ships the one ptxas assembled from the PTX beside it, so the driver
/// has no JIT pass to run), else `kiln_<arch>.ptx` there; without it, the embedded PTX.
pub fn module_image(arch: Arch) -> Result<ModuleImage> {
    if let Some(dir) = std::env::var_os(PTX_DIR_ENV) {
        let cubin = PathBuf::from(dir).join(format!("kiln_{}.cubin", arch.name()));
        if cubin.exists() {
            return std::fs::read(&cubin)
                .map(ModuleImage::Cubin)
                .map_err(|source| Error::PtxFile { path: cubin, source });
        }
    }
    module_text(arch).map(ModuleImage::Ptx)
}

/// The file name of `arch`'s module (`kiln_sm_90a.ptx`).
pub fn file_name(arch: Arch) -> String {
    format!("kiln_{}.ptx", arch.name())
}

/// The `.entry` names in a module.
pub fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .filter_map(|rest| rest.split('(').next())
        .collect()
}

/// The module a device of compute capability `major.minor` loads, or the error that says why none.
pub fn arch_for(name: &str, major: u32, minor: u32) -> Result<Arch> {
    Arch::for_compute_capability(major, minor).ok_or_else(|| Error::UnsupportedDevice {
        name: name.into(),
        major,
        minor,
    })
}
