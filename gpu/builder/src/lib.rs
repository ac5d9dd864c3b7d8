//! Builds `kiln-gpu` into one PTX module per architecture, checks it, and assembles it with ptxas.
//!
//! Used by the host crate's build script (so a fresh clone's `cargo test` builds the PTX it needs)
//! and by `cargo xtask build-ptx` (which adds the ptxas report). Both drive the same nested cargo
//! invocation with the same environment, into the same target directory, so each reuses the other's
//! work and nothing is rebuilt unless the kernel sources change.
//!
//! The route (see the README's toolchain section): rustc's own NVPTX backend, `core` built from
//! source (`-Zbuild-std=core`), the crate compiled as an rlib with one codegen unit and `--emit=asm`;
//! the `.s` file is the PTX module.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The architectures kiln builds, with their rustc target CPU and extra target features.
/// (Mirrors `kiln_gpu::Arch`, which the builder cannot depend on: it runs before that crate exists.)
pub const ARCHS: [(&str, &str); 3] = [("sm_80", ""), ("sm_90a", ""), ("sm_100a", "+ptx86")];

/// The kernel crate's package name.
pub const GPU_PACKAGE: &str = "kiln-gpu";

/// Why a build failed.
#[derive(Debug)]
pub enum BuildError {
    /// Starting a tool failed.
    Spawn { tool: String, source: std::io::Error },
    /// The nested cargo build of the kernel crate failed; its output was printed.
    Cargo { arch: String, status: String },
    /// The build succeeded but no `.s` file was found.
    NoAsm { dir: PathBuf },
    /// The module calls functions it does not define (a call into `core` that was not inlined).
    UnresolvedExtern { arch: String, functions: Vec<String> },
    /// ptxas rejected a module.
    Ptxas { arch: String, log: String },
    /// A file could not be read or written.
    Io { path: PathBuf, source: std::io::Error },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Spawn { tool, source } => write!(f, "could not run `{tool}`: {source}"),
            BuildError::Cargo { arch, status } => write!(
                f,
                "building kiln-gpu for {arch} failed ({status}); the compiler's messages are above. \
                 Is the pinned nightly installed with rust-src (`rustup toolchain install` in the repo)?"
            ),
            BuildError::NoAsm { dir } => write!(f, "no PTX (.s) file found under {}", dir.display()),
            BuildError::UnresolvedExtern { arch, functions } => write!(
                f,
                "the {arch} module declares unresolved functions: {}. Kernels cannot link against core: \
                 mark the helper #[inline(always)] or avoid the core function that is not inlined",
                functions.join(", ")
            ),
            BuildError::Ptxas { arch, log } => write!(f, "ptxas rejected the {arch} module:\n{log}"),
            BuildError::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for BuildError {}

/// One built PTX module.
#[derive(Debug, Clone)]
pub struct PtxModule {
    /// Architecture name (`"sm_90a"`).
    pub arch: String,
    /// The module rustc wrote.
    pub path: PathBuf,
    /// The PTX text.
    pub text: String,
    /// Its `.entry` symbols, in order.
    pub entries: Vec<String>,
}

/// Builds PTX for `kiln-gpu` in a workspace.
#[derive(Debug, Clone)]
pub struct Builder {
    workspace: PathBuf,
    target_dir: PathBuf,
    cargo: PathBuf,
    verbose: bool,
}

/// Environment variables a build script or cargo alias sets that must not leak into the nested build:
/// they would retarget it, change its flags, or change its fingerprints between the build script and
/// the xtask (which would make each rebuild what the other built).
fn leaks_into_nested_cargo(key: &str) -> bool {
    (key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_NET_OFFLINE")
        || key.starts_with("__CARGO")
        || key.starts_with("DEP_")
        || matches!(
            key,
            "RUSTC"
                | "RUSTC_WRAPPER"
                | "RUSTC_WORKSPACE_WRAPPER"
                | "RUSTDOC"
                | "RUSTFLAGS"
                | "RUSTDOCFLAGS"
                | "RUSTC_LINKER"
                | "TARGET"
                | "HOST"
                | "OUT_DIR"
                | "OPT_LEVEL"
                | "PROFILE"
                | "DEBUG"
                | "NUM_JOBS"
                | "MAKEFLAGS"
                | "MFLAGS"
                | "CARGO"
        )
}

impl Builder {
    /// A builder for the workspace at `workspace`, building into `workspace/target/ptx/<arch>`.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        let workspace = workspace.into();
        let target_dir = workspace.join("target").join("ptx");
        let cargo = std::env::var_os("CARGO").map(PathBuf::from).unwrap_or_else(|| "cargo".into());
        Builder { workspace, target_dir, cargo, verbose: false }
    }

    /// Print each nested command before running it.
    pub fn verbose(mut self, v: bool) -> Self {
        self.verbose = v;
        self
    }

    /// The directory holding each architecture's nested target directory.
    pub fn target_dir(&self) -> &Path {
        &self.target_dir
    }

    /// The files whose change means the PTX must be rebuilt (for `cargo:rerun-if-changed`).
    pub fn source_paths(&self) -> Vec<PathBuf> {
        let gpu = self.workspace.join("gpu");
        vec![
            gpu.join("src"),
            gpu.join("Cargo.toml"),
            gpu.join("macros").join("src"),
            gpu.join("macros").join("Cargo.toml"),
        ]
    }

    /// The rustc flags for one architecture.
    pub fn rustflags(arch: &str, features: &str) -> Vec<String> {
        let mut flags = vec![
            format!("-Ctarget-cpu={arch}"),
            "-Ccodegen-units=1".into(),
            "-Zunstable-options".into(),
            "-Cpanic=immediate-abort".into(),
            // MIR jump threading can duplicate a barrier into divergent branches (an upstream hazard).
            "-Zmir-enable-passes=-JumpThreading".into(),
            // Register tiles (`[f32; 64]` accumulators indexed in nested loops) stay in registers only
            // if those loops are unrolled completely; LLVM's default threshold leaves the GEMM tiles in
            // local memory (256-576 bytes of stack each). 2000 unrolls the tile loops and not the k
            // loop around them (20000 unrolls that too and spills).
            "-Cllvm-args=-unroll-threshold=2000".into(),
        ];
        if !features.is_empty() {
            flags.push(format!("-Ctarget-feature={features}"));
        }
        flags
    }

    /// Builds the module for `arch` (one of [`ARCHS`]) and checks it.
    pub fn build(&self, arch: &str) -> Result<PtxModule, BuildError> {
        let features = ARCHS.iter().find(|(a, _)| *a == arch).map(|(_, f)| *f).unwrap_or("");
        let target_dir = self.target_dir.join(arch);
        let mut cmd = Command::new(&self.cargo);
        let vars: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        for (k, _) in vars {
            if k.to_str().is_some_and(leaks_into_nested_cargo) {
                cmd.env_remove(&k);
            }
        }
        cmd.current_dir(&self.workspace)
            .args([
                "rustc",
                "--package",
                GPU_PACKAGE,
                "--release",
                "--target",
                "nvptx64-nvidia-cuda",
                "-Zbuild-std=core",
            ])
            .arg("--manifest-path")
            .arg(self.workspace.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir)
            .args(["--", "--emit=asm"])
            .env("CARGO_ENCODED_RUSTFLAGS", Self::rustflags(arch, features).join("\x1f"))
            // The workspace's release profile keeps line tables for host backtraces; in PTX they add
            // DWARF sections that ptxas 12.x rejects, and kiln's kernels do not need them.
            .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3");
        if !self.verbose {
            cmd.arg("--cap-lints=warn").env("CARGO_TERM_QUIET", "true");
        }
        if self.verbose {
            eprintln!("[kiln-ptx] {cmd:?}");
        }
        let status =
            cmd.status().map_err(|source| BuildError::Spawn { tool: self.cargo.display().to_string(), source })?;
        if !status.success() {
            return Err(BuildError::Cargo { arch: arch.into(), status: status.to_string() });
        }
        let deps = target_dir.join("nvptx64-nvidia-cuda").join("release").join("deps");
        let path = newest_asm(&deps)?;
        let text = std::fs::read_to_string(&path).map_err(|source| BuildError::Io { path: path.clone(), source })?;
        let unresolved = unresolved_externs(&text);
        if !unresolved.is_empty() {
            return Err(BuildError::UnresolvedExtern { arch: arch.into(), functions: unresolved });
        }
        let text = apply_launch_bounds(&text);
        let entries = entries(&text);
        Ok(PtxModule { arch: arch.into(), path, text, entries })
    }
}

fn newest_asm(deps: &Path) -> Result<PathBuf, BuildError> {
    let rd = std::fs::read_dir(deps).map_err(|source| BuildError::Io { path: deps.into(), source })?;
    rd.filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "s")
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("kiln_gpu-"))
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .ok_or(BuildError::NoAsm { dir: deps.into() })
}

/// The marker `#[kernel(max_threads = N)]` leaves in an entry's body (an inline-asm comment).
pub const MAX_THREADS_MARKER: &str = "// kiln.maxntid ";

/// The marker `#[kernel(cluster = N)]` leaves in an entry's body.
pub const CLUSTER_MARKER: &str = "// kiln.cluster ";

/// The marker `#[kernel(max_threads = N, min_blocks = B)]` leaves in an entry's body.
pub const MIN_BLOCKS_MARKER: &str = "// kiln.minnctapersm ";

/// Each entry-body marker, the directive it becomes, and whether the directive takes three
/// dimensions (`N, 1, 1`) or one number (Rust has no nvptx attributes for these).
const DIRECTIVES: [(&str, &str, bool); 3] = [
    (MAX_THREADS_MARKER, ".maxntid", true),
    (CLUSTER_MARKER, ".reqnctapercluster", true),
    (MIN_BLOCKS_MARKER, ".minnctapersm", false),
];

/// Turns each entry's markers into PTX directives between the entry's parameter list and its body:
/// the launch bound ([`MAX_THREADS_MARKER`] `N`) into `.maxntid N, 1, 1`, so ptxas budgets registers
/// for N threads per block, and the cluster size ([`CLUSTER_MARKER`] `N`) into
/// `.reqnctapercluster N, 1, 1`, and the occupancy bound ([`MIN_BLOCKS_MARKER`] `B`) into
/// `.minnctapersm B`. Entries without markers are unchanged; applying it twice changes nothing.
pub fn apply_launch_bounds(ptx: &str) -> String {
    let lines: Vec<&str> = ptx.lines().collect();
    let mut out = String::with_capacity(ptx.len() + 256);
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        let is_entry = l.trim_start().starts_with(".visible .entry ") || l.trim_start().starts_with(".entry ");
        if !is_entry {
            out.push_str(l);
            out.push('\n');
            i += 1;
            continue;
        }
        // The body opens at the first line that is `{`; it ends at the matching `}` at column 0.
        let open = (i..lines.len()).find(|&j| lines[j].trim() == "{");
        let close = open.and_then(|o| (o..lines.len()).find(|&j| lines[j] == "}"));
        let end = open.unwrap_or(i);
        for l in &lines[i..end] {
            out.push_str(l);
            out.push('\n');
        }
        if let (Some(o), Some(c)) = (open, close) {
            for (marker, directive, dims) in DIRECTIVES {
                let n = lines[o..c]
                    .iter()
                    .find_map(|b| b.trim().strip_prefix(marker.trim_end()).and_then(|n| n.trim().parse::<u32>().ok()));
                let already = lines[i..end].iter().any(|l| l.trim_start().starts_with(directive));
                if let (Some(n), false) = (n, already) {
                    if dims {
                        out.push_str(&format!("{directive} {n}, 1, 1\n"));
                    } else {
                        out.push_str(&format!("{directive} {n}\n"));
                    }
                }
            }
        }
        i = end;
        if open.is_some() {
            out.push_str(lines[i]);
            out.push('\n');
            i += 1;
        }
    }
    out
}

/// The `.entry` symbols of a PTX module.
pub fn entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest =
                l.trim_start().strip_prefix(".visible .entry ").or_else(|| l.trim_start().strip_prefix(".entry "))?;
            Some(rest.split(|c: char| c == '(' || c.is_whitespace()).next()?.to_string())
        })
        .collect()
}

/// Functions the module declares with `.extern .func` (calls it cannot resolve).
pub fn unresolved_externs(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix(".extern .func")?;
            let rest = rest.trim_start();
            // `.extern .func (.param ...) name(` or `.extern .func name(`
            let rest = if rest.starts_with('(') { rest.split_once(')').map(|(_, r)| r.trim_start())? } else { rest };
            Some(rest.split(|c: char| c == '(' || c.is_whitespace()).next()?.to_string())
        })
        .collect()
}

/// Locates ptxas: `$PTXAS`, `$CUDA_HOME/bin`, `PATH`, the project-local PyPI install kiln's CI makes
/// (`<workspace>/.tools/ptxas`), then the `nvidia-cuda-nvcc-cu12` wheel in the current Python.
pub fn find_ptxas(workspace: &Path) -> Option<PathBuf> {
    let exists = |p: PathBuf| p.is_file().then_some(p);
    if let Some(p) = std::env::var_os("PTXAS").map(PathBuf::from).and_then(exists) {
        return Some(p);
    }
    if let Some(p) = std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("bin").join("ptxas")).and_then(exists)
    {
        return Some(p);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if let Some(p) = exists(dir.join("ptxas")) {
                return Some(p);
            }
        }
    }
    let local = workspace.join(".tools").join("ptxas").join("nvidia").join("cuda_nvcc").join("bin").join("ptxas");
    if let Some(p) = exists(local) {
        return Some(p);
    }
    let out = Command::new("python3")
        .args(["-c", "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])"])
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    exists(PathBuf::from(dir.trim()).join("bin").join("ptxas"))
}

/// Resources ptxas reports for one kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// Entry name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory in bytes.
    pub shared: u32,
    /// Stack frame in bytes.
    pub stack: u32,
    /// Spill stores in bytes.
    pub spill_stores: u32,
    /// Spill loads in bytes.
    pub spill_loads: u32,
}

/// Assembles `ptx` for `arch` into `cubin`; returns ptxas's per-kernel report.
pub fn assemble(ptxas: &Path, ptx: &Path, arch: &str, cubin: &Path) -> Result<Vec<KernelResources>, BuildError> {
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(ptx)
        .arg("-o")
        .arg(cubin)
        .output()
        .map_err(|source| BuildError::Spawn { tool: ptxas.display().to_string(), source })?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(BuildError::Ptxas { arch: arch.into(), log });
    }
    Ok(parse_ptxas_report(&log))
}

/// A stable 64-bit FNV-1a hash of `parts` (the cubin cache's key: `std`'s hashers may change
/// between Rust releases).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain((part.len() as u64).to_le_bytes().iter()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// How many cubins of one architecture [`assemble_cached`] keeps (the newest used).
pub const CUBIN_CACHE_KEEP: usize = 3;

/// Assembles the PTX `text` for `arch` with `ptxas` (with [`assemble`]'s arguments, so the cubin
/// is the one `cargo xtask build-ptx` makes of the same PTX), or reuses the cubin an earlier call
/// made of the same text with the same ptxas. Cubins live in `dir` as `kiln_<arch>-<key>.cubin`,
/// the key a hash of the PTX, the architecture, and the ptxas binary's path, size and modification
/// time; each architecture keeps its [`CUBIN_CACHE_KEEP`] most recently used. A cubin appears under
/// its final name only once ptxas has written all of it, so concurrent builds never read half of
/// one. Returns the cubin's path.
pub fn assemble_cached(ptxas: &Path, text: &str, arch: &str, dir: &Path) -> Result<PathBuf, BuildError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BuildError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let meta = std::fs::metadata(ptxas).map_err(io(ptxas))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let key = fnv1a(&[
        text.as_bytes(),
        arch.as_bytes(),
        ptxas.as_os_str().as_encoded_bytes(),
        &meta.len().to_le_bytes(),
        &mtime.to_le_bytes(),
    ]);
    let stem = format!("kiln_{arch}-{key:016x}");
    let cubin = dir.join(format!("{stem}.cubin"));
    if cubin.is_file() {
        // Mark it used, for the pruning below (a failure only makes it an earlier candidate).
        if let Ok(f) = std::fs::File::options().append(true).open(&cubin) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        return Ok(cubin);
    }
    let tmp = format!("{stem}.{}", std::process::id());
    let ptx = dir.join(format!("{tmp}.ptx"));
    let partial = dir.join(format!("{tmp}.cubin.partial"));
    std::fs::write(&ptx, text).map_err(io(&ptx))?;
    let assembled = assemble(ptxas, &ptx, arch, &partial);
    let _ = std::fs::remove_file(&ptx);
    if let Err(e) = assembled {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &cubin).map_err(io(&cubin))?;
    prune_cubins(dir, arch, CUBIN_CACHE_KEEP);
    Ok(cubin)
}

/// Removes all but the `keep` most recently used cached cubins of `arch` from `dir` (best effort).
fn prune_cubins(dir: &Path, arch: &str, keep: usize) {
    let prefix = format!("kiln_{arch}-");
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let mut cubins: Vec<(std::time::SystemTime, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".cubin"))
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    cubins.sort_by_key(|c| std::cmp::Reverse(c.0));
    for (_, p) in cubins.into_iter().skip(keep) {
        let _ = std::fs::remove_file(p);
    }
}

/// The version line of `ptxas --version` ("Cuda compilation tools, release 12.9, V12.9.86"), or
/// `None` when it cannot be run.
pub fn ptxas_version(ptxas: &Path) -> Option<String> {
    let out = Command::new(ptxas).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().find(|l| l.contains("release")).or_else(|| text.lines().last()).map(|l| l.trim().to_string())
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let idx = line.find(unit)?;
    line[..idx].split_whitespace().last()?.parse().ok()
}

/// Parses `ptxas -v` output into one record per entry function (device functions are skipped).
pub fn parse_ptxas_report(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    let mut current: Option<usize> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelResources { name, ..Default::default() });
            current = Some(out.len() - 1);
        } else if line.contains("Function properties for ") {
            let name = line.split("Function properties for ").nth(1).unwrap_or_default().trim();
            current = out.iter().position(|k| k.name == name);
        } else if let Some(i) = current {
            let k = &mut out[i];
            if line.contains("bytes stack frame") {
                k.stack = number_before(line, "bytes stack frame").unwrap_or(0);
                k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used ") && line.contains("registers") {
                k.registers = number_before(line, "registers").unwrap_or(0);
                k.shared = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_bound_markers_become_maxntid() {
        let ptx = ".visible .entry a(\n\t.param .u64 a_p\n)\n{\n\t// begin inline asm\n\t// kiln.maxntid 384\n\t// end inline asm\n\tret;\n}\n.visible .entry b(\n)\n{\n\tret;\n}\n";
        let got = apply_launch_bounds(ptx);
        assert_eq!(
            got,
            ".visible .entry a(\n\t.param .u64 a_p\n)\n.maxntid 384, 1, 1\n{\n\t// begin inline asm\n\t// kiln.maxntid 384\n\t// end inline asm\n\tret;\n}\n.visible .entry b(\n)\n{\n\tret;\n}\n"
        );
        assert_eq!(apply_launch_bounds(&got), got, "idempotent");
    }

    #[test]
    fn cluster_markers_become_reqnctapercluster() {
        let ptx = ".visible .entry a(\n)\n{\n\t// kiln.maxntid 384\n\t// kiln.cluster 2\n\tret;\n}\n";
        let got = apply_launch_bounds(ptx);
        assert_eq!(
            got,
            ".visible .entry a(\n)\n.maxntid 384, 1, 1\n.reqnctapercluster 2, 1, 1\n{\n\t// kiln.maxntid 384\n\t// kiln.cluster 2\n\tret;\n}\n"
        );
        assert_eq!(apply_launch_bounds(&got), got, "idempotent");
    }

    #[test]
    fn min_blocks_markers_become_minnctapersm() {
        let ptx = ".visible .entry a(\n)\n{\n\t// kiln.maxntid 256\n\t// kiln.minnctapersm 2\n\tret;\n}\n";
        let got = apply_launch_bounds(ptx);
        assert_eq!(
            got,
            ".visible .entry a(\n)\n.maxntid 256, 1, 1\n.minnctapersm 2\n{\n\t// kiln.maxntid 256\n\t// kiln.minnctapersm 2\n\tret;\n}\n"
        );
        assert_eq!(apply_launch_bounds(&got), got, "idempotent");
    }

    #[test]
    fn finds_entries_and_externs() {
        let ptx = "\
.extern .func  (.param .b32 func_retval0) vprintf(
.extern .func foo(
.visible .entry vector_add(
	.param .u64 a
)
.entry other(
";
        assert_eq!(entries(ptx), ["vector_add", "other"]);
        assert_eq!(unresolved_externs(ptx), ["vprintf", "foo"]);
    }

    #[test]
    fn parses_ptxas_report() {
        let log = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k1' for 'sm_90a'
ptxas info    : Function properties for k1
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem, 380 bytes cmem[0]
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'k2' for 'sm_90a'
ptxas info    : Function properties for k2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 372 bytes cmem[0]
";
        let r = parse_ptxas_report(log);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelResources {
                name: "k1".into(),
                registers: 40,
                shared: 128,
                stack: 8,
                spill_stores: 4,
                spill_loads: 12
            }
        );
        assert_eq!(r[1].registers, 10);
        assert_eq!(r[1].shared, 0);
    }

    /// A stand-in for ptxas (a shell script) that copies its input to `-o`, tagged with the
    /// `-arch` it was given, and counts its runs in `runs`.
    #[cfg(unix)]
    fn fake_ptxas(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("ptxas");
        let runs = dir.join("runs");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho run >> {runs:?}\narch=\"\"; out=\"\"; inp=\"\"\n\
                 while [ $# -gt 0 ]; do case \"$1\" in -arch=*) arch=\"$1\";; -v) ;; -o) out=\"$2\"; shift;; *) inp=\"$1\";; esac; shift; done\n\
                 {{ echo \"$arch\"; cat \"$inp\"; }} > \"$out\"\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script
    }

    #[cfg(unix)]
    #[test]
    fn cubin_cache_assembles_once_per_text_and_keeps_the_newest() {
        let dir = std::env::temp_dir().join(format!("kiln-cubin-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ptxas = fake_ptxas(&dir);
        let cache = dir.join("cache");
        let runs = || std::fs::read_to_string(dir.join("runs")).map(|s| s.lines().count()).unwrap_or(0);

        let a = assemble_cached(&ptxas, "ptx one\n", "sm_80", &cache).unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "-arch=sm_80\nptx one\n");
        assert_eq!(runs(), 1);
        assert_eq!(assemble_cached(&ptxas, "ptx one\n", "sm_80", &cache).unwrap(), a, "same text: the cached cubin");
        assert_eq!(runs(), 1, "ptxas did not run again");
        let b = assemble_cached(&ptxas, "ptx one\n", "sm_90a", &cache).unwrap();
        assert_ne!(a, b, "another architecture is another cubin");
        assert_eq!(runs(), 2);
        for i in 0..CUBIN_CACHE_KEEP + 2 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            assemble_cached(&ptxas, &format!("ptx {i}\n"), "sm_80", &cache).unwrap();
        }
        let left = |arch: &str| {
            std::fs::read_dir(&cache)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(&format!("kiln_{arch}-")))
                .count()
        };
        assert_eq!(left("sm_80"), CUBIN_CACHE_KEEP, "older sm_80 cubins pruned; no temporary files left");
        assert_eq!(left("sm_90a"), 1, "pruning one architecture leaves the others");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(unix)]
    #[test]
    fn cubin_cache_keeps_nothing_of_a_failed_assembly() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("kiln-cubin-cache-fail-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ptxas = dir.join("ptxas");
        std::fs::write(&ptxas, "#!/bin/sh\necho \"ptxas fatal : Unknown arch\" >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&ptxas, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cache = dir.join("cache");
        match assemble_cached(&ptxas, "ptx\n", "sm_100a", &cache) {
            Err(BuildError::Ptxas { arch, log }) => {
                assert_eq!(arch, "sm_100a");
                assert!(log.contains("Unknown arch"), "{log}");
            }
            other => panic!("expected ptxas's failure, got {other:?}"),
        }
        assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0, "no cubin, no temporary file");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn env_filter_keeps_toolchain_and_home() {
        assert!(leaks_into_nested_cargo("CARGO_ENCODED_RUSTFLAGS"));
        assert!(leaks_into_nested_cargo("RUSTFLAGS"));
        assert!(leaks_into_nested_cargo("OUT_DIR"));
        assert!(!leaks_into_nested_cargo("CARGO_HOME"));
        assert!(!leaks_into_nested_cargo("RUSTUP_TOOLCHAIN"));
        assert!(!leaks_into_nested_cargo("PATH"));
    }
}
