//! The PTX modules built from `kiln-gpu` (by the build script, embedded in the binary), the cubins
//! ptxas assembled from them where the build found ptxas, and the choice of module and of image
//! for a device.
//!
//! A device loads one module ([`arch_for`]). Of that module it loads the embedded cubin when there
//! is one that runs on the device ([`choose_image`]): no compilation at load time. Otherwise it
//! loads the PTX, which the driver JIT-compiles on the first load in a process (about 16 s for
//! kiln's sm_90a module on an H200), unless the driver's cache on disk already holds the result.
//! `$KILN_PTX_DIR` replaces the embedded images with files; `KILN_FORCE_PTX=1` loads PTX even
//! where a cubin would run (to time the JIT, or to rule the cubin out).

use crate::error::{Error, Result};
use kiln_gpu::Arch;
use std::borrow::Cow;
use std::path::{Path, PathBuf};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/ptx_modules.rs"));
}

/// Environment variable naming a directory of `kiln_<arch>.ptx` files to load instead of the
/// embedded ones (the GPU bundle sets it so that the PTX it ran is on disk beside the results).
pub const PTX_DIR_ENV: &str = "KILN_PTX_DIR";

/// Set to `1` to load PTX (embedded, or from `$KILN_PTX_DIR`) even where a cubin would run.
pub const FORCE_PTX_ENV: &str = "KILN_FORCE_PTX";

/// The embedded PTX text of `arch`'s module.
pub fn embedded(arch: Arch) -> &'static str {
    embedded::MODULES
        .iter()
        .find(|(name, _)| *name == arch.name())
        .map(|(_, text)| *text)
        .expect("the build script embeds every architecture in kiln_gpu::Arch::ALL")
}

/// The embedded cubin of `arch`'s module: what ptxas made of [`embedded`]`(arch)` at build time.
/// `None` where the build found no ptxas, or ptxas rejected that module.
pub fn embedded_cubin(arch: Arch) -> Option<&'static [u8]> {
    embedded::CUBINS.iter().find(|(name, _)| *name == arch.name()).map(|(_, bytes)| *bytes)
}

/// The architectures whose cubin is embedded, oldest first.
pub fn embedded_cubins() -> Vec<Arch> {
    Arch::ALL.into_iter().filter(|a| embedded_cubin(*a).is_some()).collect()
}

/// The ptxas that assembled the embedded cubins, when the build ran one: its path and its version
/// line ("Cuda compilation tools, release 12.9, V12.9.86").
pub fn cubin_assembler() -> Option<(&'static str, &'static str)> {
    embedded::ASSEMBLER
}

/// Why the build ran no ptxas (none was found, or `KILN_EMBED_CUBINS=0`), when it ran none.
pub fn cubins_not_assembled_because() -> Option<&'static str> {
    embedded::NOT_ASSEMBLED_BECAUSE
}

/// The modules the build's ptxas rejected (so only their PTX is embedded), with the first line
/// of what it said.
pub fn rejected_cubins() -> &'static [(&'static str, &'static str)] {
    embedded::REJECTED
}

/// One paragraph on the embedded cubins: which there are and what assembled them, or why there are
/// none and what that costs (`kiln info` prints it).
pub fn cubin_summary() -> String {
    let names: Vec<&str> = embedded_cubins().into_iter().map(Arch::name).collect();
    let mut s = if names.is_empty() {
        format!(
            "no cubins built into this binary ({}): a device's first load of its module in a process \
             JIT-compiles the PTX (about 16 s on an H200 unless the driver's cache holds it); \
             `bash .ci/install-ptxas` and a rebuild embed them",
            cubins_not_assembled_because().unwrap_or("ptxas rejected every module")
        )
    } else {
        let (path, version) = cubin_assembler().unwrap_or(("ptxas", "version unknown"));
        format!("cubins built into this binary: {} (assembled by {path}, {version})", names.join(", "))
    };
    for (arch, why) in rejected_cubins() {
        s.push_str(&format!("\n  no {arch} cubin: ptxas rejected the module ({why}); its PTX is embedded"));
    }
    s
}

/// Whether a cubin assembled for `arch` runs on a device of compute capability `major.minor`.
///
/// Machine code is compatible within a major version, from the minor it was built for upward: an
/// sm_80 cubin runs on 8.0, 8.6, 8.7 and 8.9, never on 9.0 or 12.0. An arch-specific cubin (the `a`
/// of sm_90a, sm_100a) runs on exactly its own compute capability: sm_90a on 9.0, sm_100a on 10.0
/// and not on 10.3.
pub fn cubin_runs_on(arch: Arch, major: u32, minor: u32) -> bool {
    let (built_major, built_minor) = (arch.sm() / 10, arch.sm() % 10);
    let arch_specific = arch.name().ends_with('a');
    if arch_specific {
        (major, minor) == (built_major, built_minor)
    } else {
        major == built_major && minor >= built_minor
    }
}

/// Which image of a module a device loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    /// Machine code ptxas assembled: loaded as is.
    Cubin,
    /// PTX: the driver JIT-compiles it for the device.
    Ptx,
}

/// The image of module `arch` that a device of compute capability `major.minor` loads, when the
/// cubins of `cubins` are on offer: the cubin where there is one for `arch` that runs on the
/// device ([`cubin_runs_on`]), else the PTX.
pub fn choose_image(arch: Arch, major: u32, minor: u32, cubins: &[Arch]) -> ImageKind {
    if cubins.contains(&arch) && cubin_runs_on(arch, major, minor) { ImageKind::Cubin } else { ImageKind::Ptx }
}

/// Where a device's module image comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageSource {
    /// The cubin embedded in the binary.
    EmbeddedCubin(Arch),
    /// The PTX embedded in the binary.
    EmbeddedPtx(Arch),
    /// A cubin in `$KILN_PTX_DIR`.
    FileCubin(PathBuf),
    /// A PTX file in `$KILN_PTX_DIR`.
    FilePtx(PathBuf),
}

impl ImageSource {
    /// Cubin or PTX.
    pub fn kind(&self) -> ImageKind {
        match self {
            ImageSource::EmbeddedCubin(_) | ImageSource::FileCubin(_) => ImageKind::Cubin,
            ImageSource::EmbeddedPtx(_) | ImageSource::FilePtx(_) => ImageKind::Ptx,
        }
    }
}

impl std::fmt::Display for ImageSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageSource::EmbeddedCubin(a) => write!(f, "the embedded {} cubin (no JIT compilation)", a.name()),
            ImageSource::EmbeddedPtx(a) => write!(f, "the embedded {} PTX (the driver JIT-compiles it)", a.name()),
            ImageSource::FileCubin(p) => write!(f, "{} (a cubin, from {PTX_DIR_ENV})", p.display()),
            ImageSource::FilePtx(p) => {
                write!(f, "{} (PTX from {PTX_DIR_ENV}; the driver JIT-compiles it)", p.display())
            }
        }
    }
}

/// The image source for module `arch` on a device of compute capability `major.minor`, given the
/// override directory (`$KILN_PTX_DIR`), whether PTX is forced (`KILN_FORCE_PTX=1`) and the
/// embedded cubins. With a directory: its `kiln_<arch>.cubin` where that file exists and runs on
/// the device, else its `kiln_<arch>.ptx`. Without one: the embedded image [`choose_image`] picks.
pub fn image_source_in(
    arch: Arch,
    major: u32,
    minor: u32,
    dir: Option<&Path>,
    force_ptx: bool,
    cubins: &[Arch],
) -> ImageSource {
    let cubin_allowed = !force_ptx && cubin_runs_on(arch, major, minor);
    match dir {
        Some(dir) => {
            let cubin = dir.join(format!("kiln_{}.cubin", arch.name()));
            if cubin_allowed && cubin.is_file() {
                ImageSource::FileCubin(cubin)
            } else {
                ImageSource::FilePtx(dir.join(file_name(arch)))
            }
        }
        None => match choose_image(arch, major, minor, cubins) {
            ImageKind::Cubin if !force_ptx => ImageSource::EmbeddedCubin(arch),
            _ => ImageSource::EmbeddedPtx(arch),
        },
    }
}

/// Whether `KILN_FORCE_PTX=1` is set.
pub fn force_ptx() -> bool {
    std::env::var(FORCE_PTX_ENV).is_ok_and(|v| v == "1")
}

/// The image source for module `arch` on a device of compute capability `major.minor` in this
/// process ([`image_source_in`] with `$KILN_PTX_DIR`, `KILN_FORCE_PTX` and the embedded cubins).
pub fn image_source(arch: Arch, major: u32, minor: u32) -> ImageSource {
    let dir = std::env::var_os(PTX_DIR_ENV).map(PathBuf::from);
    image_source_in(arch, major, minor, dir.as_deref(), force_ptx(), &embedded_cubins())
}

/// The PTX for `arch`: from `$KILN_PTX_DIR/kiln_<arch>.ptx` when that variable is set, else embedded.
pub fn module_text(arch: Arch) -> Result<Cow<'static, str>> {
    match std::env::var_os(PTX_DIR_ENV) {
        Some(dir) => read_text(PathBuf::from(dir).join(file_name(arch))).map(Cow::Owned),
        None => Ok(Cow::Borrowed(embedded(arch))),
    }
}

fn read_text(path: PathBuf) -> Result<String> {
    std::fs::read_to_string(&path).map_err(|source| Error::PtxFile { path, source })
}

/// A module to load: PTX text (the driver compiles it) or a cubin ptxas already assembled.
pub enum ModuleImage {
    /// PTX source.
    Ptx(Cow<'static, str>),
    /// A cubin for exactly this architecture.
    Cubin(Cow<'static, [u8]>),
}

/// The image `source` names.
pub fn read_image(source: &ImageSource) -> Result<ModuleImage> {
    Ok(match source {
        ImageSource::EmbeddedCubin(a) => ModuleImage::Cubin(Cow::Borrowed(
            embedded_cubin(*a).expect("image_source_in names an embedded cubin only where there is one"),
        )),
        ImageSource::EmbeddedPtx(a) => ModuleImage::Ptx(Cow::Borrowed(embedded(*a))),
        ImageSource::FileCubin(path) => ModuleImage::Cubin(Cow::Owned(
            std::fs::read(path).map_err(|source| Error::PtxFile { path: path.clone(), source })?,
        )),
        ImageSource::FilePtx(path) => ModuleImage::Ptx(Cow::Owned(read_text(path.clone())?)),
    })
}

/// What a device of compute capability `major.minor` loads for module `arch` in this process
/// ([`image_source`]), and the image itself.
pub fn module_image(arch: Arch, major: u32, minor: u32) -> Result<(ImageSource, ModuleImage)> {
    let source = image_source(arch, major, minor);
    let image = read_image(&source)?;
    Ok((source, image))
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

/// The target a cubin was assembled for, read from its ELF header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CubinTarget {
    /// The SM version (80 for sm_80, 100 for sm_100a).
    pub sm: u32,
    /// Whether it is arch-specific (the `a` of sm_90a).
    pub arch_specific: bool,
}

impl CubinTarget {
    /// Whether this is the target of module `arch`.
    pub fn is(self, arch: Arch) -> bool {
        self.sm == arch.sm() && self.arch_specific == arch.name().ends_with('a')
    }
}

/// The target of a cubin (a 64-bit little-endian ELF file for `EM_CUDA`), or `None` for anything
/// else. The SM version sits in `e_flags`: in bits 0-7 with bit 11 for arch-specific up to ELF ABI
/// version 7 (ptxas for sm_80 and sm_90a), in bits 8-15 with bit 3 from version 8 (sm_100 and newer).
pub fn cubin_target(bytes: &[u8]) -> Option<CubinTarget> {
    const EM_CUDA: u16 = 190;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return None;
    }
    if u16::from_le_bytes([bytes[18], bytes[19]]) != EM_CUDA {
        return None;
    }
    let flags = u32::from_le_bytes([bytes[48], bytes[49], bytes[50], bytes[51]]);
    let abi_version = bytes[8];
    Some(if abi_version >= 8 {
        CubinTarget { sm: (flags >> 8) & 0xff, arch_specific: flags & 0x8 != 0 }
    } else {
        CubinTarget { sm: flags & 0xff, arch_specific: flags & 0x800 != 0 }
    })
}

/// The module a device of compute capability `major.minor` loads, or the error that says why none.
pub fn arch_for(name: &str, major: u32, minor: u32) -> Result<Arch> {
    Arch::for_compute_capability(major, minor).ok_or_else(|| Error::UnsupportedDevice {
        name: name.into(),
        major,
        minor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Arch; 3] = Arch::ALL;

    /// The module and image a device of `major.minor` loads, with `cubins` embedded.
    fn pick(major: u32, minor: u32, cubins: &[Arch]) -> (Arch, ImageKind) {
        let arch = arch_for("test device", major, minor).expect("a supported device");
        (arch, choose_image(arch, major, minor, cubins))
    }

    #[test]
    fn ampere_loads_the_sm80_cubin() {
        assert_eq!(pick(8, 0, &ALL), (Arch::Sm80, ImageKind::Cubin));
    }

    #[test]
    fn later_ampere_and_ada_load_the_sm80_cubin() {
        // sm_80 machine code runs on every 8.x from 8.0 up (the A10's 8.6, the L4's 8.9).
        assert_eq!(pick(8, 6, &ALL), (Arch::Sm80, ImageKind::Cubin));
        assert_eq!(pick(8, 9, &ALL), (Arch::Sm80, ImageKind::Cubin));
    }

    #[test]
    fn hopper_loads_the_sm90a_cubin() {
        assert_eq!(pick(9, 0, &ALL), (Arch::Sm90a, ImageKind::Cubin));
    }

    #[test]
    fn blackwell_datacenter_loads_the_sm100a_cubin_on_10_0_only() {
        assert_eq!(pick(10, 0, &ALL), (Arch::Sm100a, ImageKind::Cubin));
        // An arch-specific cubin runs on its own compute capability only.
        assert_eq!(pick(10, 3, &ALL), (Arch::Sm100a, ImageKind::Ptx));
    }

    #[test]
    fn newer_majors_jit_the_sm80_ptx() {
        // 12.0 (consumer Blackwell) has no module of its own: sm_80's PTX, compiled by the driver,
        // since sm_80 machine code does not run on another major version.
        assert_eq!(pick(12, 0, &ALL), (Arch::Sm80, ImageKind::Ptx));
    }

    #[test]
    fn without_cubins_every_device_loads_ptx() {
        for (major, minor) in [(8, 0), (8, 6), (9, 0), (10, 0), (12, 0)] {
            assert_eq!(pick(major, minor, &[]).1, ImageKind::Ptx, "{major}.{minor}");
        }
    }

    #[test]
    fn a_missing_cubin_is_not_replaced_by_another_modules() {
        // Only sm_80's cubin (ptxas rejected the others): 9.0 still loads its own module, as PTX.
        assert_eq!(pick(9, 0, &[Arch::Sm80]), (Arch::Sm90a, ImageKind::Ptx));
        assert_eq!(pick(8, 6, &[Arch::Sm80]), (Arch::Sm80, ImageKind::Cubin));
    }

    #[test]
    fn devices_below_8_0_are_refused() {
        assert!(matches!(arch_for("old", 7, 5), Err(Error::UnsupportedDevice { major: 7, minor: 5, .. })));
    }

    #[test]
    fn cubin_compatibility_follows_the_driver_rules() {
        assert!(cubin_runs_on(Arch::Sm80, 8, 7));
        assert!(!cubin_runs_on(Arch::Sm80, 9, 0));
        assert!(!cubin_runs_on(Arch::Sm80, 10, 0));
        assert!(!cubin_runs_on(Arch::Sm90a, 10, 0));
        assert!(!cubin_runs_on(Arch::Sm100a, 10, 1));
        assert!(!cubin_runs_on(Arch::Sm100a, 12, 0));
    }

    #[test]
    fn force_ptx_and_the_embedded_sources() {
        assert_eq!(image_source_in(Arch::Sm90a, 9, 0, None, false, &ALL), ImageSource::EmbeddedCubin(Arch::Sm90a));
        assert_eq!(image_source_in(Arch::Sm90a, 9, 0, None, true, &ALL), ImageSource::EmbeddedPtx(Arch::Sm90a));
        assert_eq!(image_source_in(Arch::Sm90a, 9, 0, None, false, &[]), ImageSource::EmbeddedPtx(Arch::Sm90a));
        assert_eq!(image_source_in(Arch::Sm80, 12, 0, None, false, &ALL), ImageSource::EmbeddedPtx(Arch::Sm80));
    }

    #[test]
    fn ptx_dir_cubins_follow_the_same_rules() {
        let dir = std::env::temp_dir().join(format!("kiln-ptx-dir-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cubin = dir.join("kiln_sm_80.cubin");
        let ptx = dir.join("kiln_sm_80.ptx");
        // Without a cubin file: the directory's PTX, even with cubins embedded.
        assert_eq!(image_source_in(Arch::Sm80, 8, 6, Some(&dir), false, &ALL), ImageSource::FilePtx(ptx.clone()));
        std::fs::write(&cubin, b"cubin").unwrap();
        assert_eq!(image_source_in(Arch::Sm80, 8, 6, Some(&dir), false, &[]), ImageSource::FileCubin(cubin.clone()));
        // The directory's sm_80 cubin does not run on 12.0, and KILN_FORCE_PTX refuses it.
        assert_eq!(image_source_in(Arch::Sm80, 12, 0, Some(&dir), false, &ALL), ImageSource::FilePtx(ptx.clone()));
        assert_eq!(image_source_in(Arch::Sm80, 8, 0, Some(&dir), true, &ALL), ImageSource::FilePtx(ptx));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_cubin_targets_from_elf_headers() {
        // The first 64 bytes of ptxas 12.9's cubins: ELF ABI 7 (sm_80, sm_90a), 8 (sm_100a).
        fn header(abi: u8, flags: u32) -> Vec<u8> {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(b"\x7fELF");
            h[4] = 2;
            h[5] = 1;
            h[8] = abi;
            h[18..20].copy_from_slice(&190u16.to_le_bytes());
            h[48..52].copy_from_slice(&flags.to_le_bytes());
            h
        }
        let t = |abi, flags| cubin_target(&header(abi, flags)).expect("a cubin header");
        assert!(t(7, 0x0050_0550).is(Arch::Sm80));
        assert!(t(7, 0x005a_0d5a).is(Arch::Sm90a));
        assert!(!t(7, 0x0050_055a).is(Arch::Sm90a), "sm_90 without the a");
        assert!(t(8, 0x0600_640a).is(Arch::Sm100a));
        assert_eq!(t(8, 0x0600_780a), CubinTarget { sm: 120, arch_specific: true });
        let mut not_cuda = header(7, 0x0050_0550);
        not_cuda[18] = 62; // x86-64
        assert_eq!(cubin_target(&not_cuda), None);
        assert_eq!(cubin_target(b".version 8.6\n.target sm_80"), None);
    }
}
