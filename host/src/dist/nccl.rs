//! Finding and loading NCCL at run time.
//!
//! cudarc's `nccl` feature is on for its types (`ncclComm_t`, `ncclUniqueId`), but its loader only
//! tries names like `libnccl.so` and `libnccl.so.12`, never `libnccl.so.2` (the name NCCL and
//! PyTorch's `nvidia-nccl-cu12` wheel ship). kiln therefore opens the library itself, by absolute
//! path where it finds one, and resolves the few entry points it calls. Order of search:
//! 1. `KILN_NCCL_LIB` (a file, or a directory holding `libnccl.so.2`); if set, nothing else is tried;
//! 2. `libnccl.so.2` and `libnccl.so` by name (`LD_LIBRARY_PATH`, the linker cache);
//! 3. Python's site-packages (`nvidia/nccl/lib/libnccl.so.2`, or `nvidia/*/lib/libnccl.so.2` as the
//!    CUDA 13 wheels lay it out), asked of `python3` and globbed under the
//!    usual prefixes, then CUDA's and the system's library directories.

use crate::error::{Error, Result};
use cudarc::nccl::sys::{ncclComm_t, ncclUniqueId};
use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Environment variable naming the NCCL library (a file, or the directory that holds it).
pub const NCCL_LIB_ENV: &str = "KILN_NCCL_LIB";

/// The library's file name.
pub const NCCL_SONAME: &str = "libnccl.so.2";

type Res = c_int;

/// The NCCL entry points kiln calls, resolved from one loaded library.
pub struct Nccl {
    _lib: libloading::Library,
    /// Where the library was found (a path or the name the linker resolved).
    pub source: String,
    pub(crate) get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> Res,
    pub(crate) comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> Res,
    pub(crate) comm_destroy: unsafe extern "C" fn(ncclComm_t) -> Res,
    pub(crate) comm_abort: unsafe extern "C" fn(ncclComm_t) -> Res,
    pub(crate) all_reduce:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> Res,
    pub(crate) broadcast:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> Res,
    pub(crate) reduce_scatter:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, ncclComm_t, *mut c_void) -> Res,
    pub(crate) all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, ncclComm_t, *mut c_void) -> Res,
    pub(crate) comm_get_async_error: unsafe extern "C" fn(ncclComm_t, *mut Res) -> Res,
    pub(crate) group_start: unsafe extern "C" fn() -> Res,
    pub(crate) group_end: unsafe extern "C" fn() -> Res,
    get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("source", &self.source).finish()
    }
}

impl Nccl {
    /// The process's NCCL, found and loaded once; a typed error ([`Error::NoNccl`]) saying where
    /// kiln looked and how to point at the library when it is missing. Sets `NCCL_NVLS_ENABLE=0`
    /// first unless the environment sets it (NVLink multicast stays off).
    pub fn get() -> Result<&'static Nccl> {
        static NCCL: OnceLock<std::result::Result<Nccl, (String, String)>> = OnceLock::new();
        NCCL.get_or_init(|| {
            if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
                // SAFETY: set once, before NCCL is loaded, from the first thread that asks for it;
                // kiln reads no environment concurrently at this point.
                unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
            }
            load()
        })
        .as_ref()
        .map_err(|(detail, searched)| Error::NoNccl { detail: detail.clone(), searched: searched.clone() })
    }

    /// Turns an `ncclResult_t` into a typed error naming `context`.
    pub(crate) fn check(&self, code: Res, context: impl FnOnce() -> String) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let msg = unsafe { std::ffi::CStr::from_ptr((self.get_error_string)(code)) }.to_string_lossy().into_owned();
        Err(Error::Nccl { context: context(), code: code as u32, msg })
    }
}

/// Where to look, in order: `env` is `KILN_NCCL_LIB`'s value, `site_dirs` Python's site-packages
/// directories. Entries without a `/` are names for the dynamic linker.
pub fn candidates(env: Option<&str>, site_dirs: &[PathBuf]) -> Vec<String> {
    if let Some(v) = env.filter(|v| !v.is_empty()) {
        let p = Path::new(v);
        return vec![if p.is_dir() { p.join(NCCL_SONAME).display().to_string() } else { v.to_string() }];
    }
    let mut out = vec![NCCL_SONAME.to_string(), "libnccl.so".to_string()];
    for d in site_dirs {
        out.push(d.join("nvidia/nccl/lib").join(NCCL_SONAME).display().to_string());
        // CUDA 13 wheels install under one directory per CUDA major (nvidia/cu13/lib)
        if let Ok(rd) = std::fs::read_dir(d.join("nvidia")) {
            let mut subs: Vec<PathBuf> = rd.flatten().map(|e| e.path().join("lib").join(NCCL_SONAME)).collect();
            subs.sort();
            out.extend(subs.into_iter().filter(|p| p.exists()).map(|p| p.display().to_string()));
        }
    }
    for d in ["/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"] {
        out.push(format!("{d}/{NCCL_SONAME}"));
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|c| seen.insert(c.clone()));
    out
}

/// Python's site-packages directories: those `python3` reports, then globs of the usual prefixes.
pub fn site_packages() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let script = "import site,sys;print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]+sys.path))";
    if let Ok(out) = std::process::Command::new("python3").args(["-c", script]).output()
        && out.status.success()
    {
        dirs.extend(String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(PathBuf::from));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut prefixes =
        vec![PathBuf::from("/usr/local/lib"), PathBuf::from("/usr/lib"), PathBuf::from("/opt/conda/lib")];
    prefixes.extend(home.map(|h| h.join(".local/lib")));
    for pre in prefixes {
        let Ok(rd) = std::fs::read_dir(&pre) else { continue };
        let mut pys: Vec<PathBuf> =
            rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("python3")).map(|e| e.path()).collect();
        pys.sort();
        for py in pys {
            dirs.push(py.join("dist-packages"));
            dirs.push(py.join("site-packages"));
        }
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

fn load() -> std::result::Result<Nccl, (String, String)> {
    let env = std::env::var(NCCL_LIB_ENV).ok();
    let sites = if env.as_deref().is_some_and(|v| !v.is_empty()) { Vec::new() } else { site_packages() };
    open(&candidates(env.as_deref(), &sites))
}

/// Opens the first candidate that loads and has NCCL's entry points.
fn open(cands: &[String]) -> std::result::Result<Nccl, (String, String)> {
    let mut detail = String::from("no candidate exists");
    for c in cands {
        if c.contains('/') && !Path::new(c).exists() {
            detail = format!("{c}: no such file");
            continue;
        }
        // SAFETY: loading NCCL runs its initializers, which only set up library state.
        match unsafe { libloading::Library::new(c) } {
            Ok(lib) => match resolve(lib, c.clone()) {
                Ok(n) => return Ok(n),
                Err(e) => detail = format!("{c}: {e}"),
            },
            Err(e) => detail = format!("{c}: {e}"),
        }
    }
    Err((detail, cands.join(", ")))
}

fn resolve(lib: libloading::Library, source: String) -> std::result::Result<Nccl, String> {
    // SAFETY: each symbol is an NCCL entry point with the C signature given by its field's type
    // (nccl.h, NCCL 2.x); the pointers stay valid while `_lib` is held in the same struct.
    unsafe {
        macro_rules! sym {
            ($n:literal) => {
                *lib.get(concat!($n, "\0").as_bytes()).map_err(|e| format!("no symbol {} ({e})", $n))?
            };
        }
        Ok(Nccl {
            get_unique_id: sym!("ncclGetUniqueId"),
            comm_init_rank: sym!("ncclCommInitRank"),
            comm_destroy: sym!("ncclCommDestroy"),
            comm_abort: sym!("ncclCommAbort"),
            all_reduce: sym!("ncclAllReduce"),
            broadcast: sym!("ncclBroadcast"),
            reduce_scatter: sym!("ncclReduceScatter"),
            all_gather: sym!("ncclAllGather"),
            comm_get_async_error: sym!("ncclCommGetAsyncError"),
            group_start: sym!("ncclGroupStart"),
            group_end: sym!("ncclGroupEnd"),
            get_error_string: sym!("ncclGetErrorString"),
            source,
            _lib: lib,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_points_at_a_file_or_a_directory_and_nothing_else_is_tried() {
        assert_eq!(candidates(Some("/x/libnccl.so.2"), &[PathBuf::from("/site")]), ["/x/libnccl.so.2"]);
        let dir = std::env::temp_dir();
        assert_eq!(candidates(Some(dir.to_str().unwrap()), &[]), [dir.join(NCCL_SONAME).display().to_string()]);
    }

    #[test]
    fn without_env_names_then_site_packages_then_system_dirs() {
        let c = candidates(None, &[PathBuf::from("/py/site-packages"), PathBuf::from("/py/site-packages")]);
        assert_eq!(&c[..3], ["libnccl.so.2", "libnccl.so", "/py/site-packages/nvidia/nccl/lib/libnccl.so.2"]);
        assert!(c.contains(&"/usr/local/cuda/lib64/libnccl.so.2".to_string()));
        assert_eq!(c.iter().filter(|x| x.contains("/py/")).count(), 1, "duplicates removed");
    }

    #[test]
    fn cuda_13_wheel_layout_is_found() {
        let site = std::env::temp_dir().join(format!("kiln-nccl-site-{}", std::process::id()));
        let lib = site.join("nvidia/cu13/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join(NCCL_SONAME), b"").unwrap();
        let c = candidates(None, std::slice::from_ref(&site));
        let _ = std::fs::remove_dir_all(&site);
        assert!(c.contains(&lib.join(NCCL_SONAME).display().to_string()), "{c:?}");
    }

    #[test]
    fn a_library_that_is_not_there_or_not_nccl_is_refused_with_the_reason() {
        let (detail, searched) = open(&["/nonexistent/libnccl.so.2".into()]).unwrap_err();
        assert!(detail.contains("no such file") && searched.contains("/nonexistent"), "{detail}");
        // libc loads but has no NCCL symbols.
        let (detail, _) = open(&["libc.so.6".into()]).unwrap_err();
        assert!(detail.contains("libc.so.6") && detail.contains("nccl"), "{detail}");
    }

    #[test]
    fn a_missing_library_is_a_typed_error_that_says_how_to_point_at_it() {
        let err = Error::NoNccl { detail: "x: not found".into(), searched: "a, b".into() };
        let s = err.to_string();
        assert!(s.contains(NCCL_LIB_ENV) && s.contains("LD_LIBRARY_PATH") && s.contains("a, b"), "{s}");
    }
}
