//! Builds the PTX modules the host embeds, so that a fresh clone needs no manual step before
//! `cargo test`. The same builder drives `cargo xtask build-ptx`; both share `target/ptx`.
//!
//! When ptxas is found (where `cargo xtask build-ptx` looks: `$PTXAS`, `$CUDA_HOME/bin`, `PATH`,
//! `.tools/ptxas`, the `nvidia-cuda-nvcc-cu12` wheel), each module is also assembled into a cubin,
//! embedded beside its PTX: a device that can run it loads it without the driver's JIT pass. The
//! three modules are assembled in parallel, and each cubin is kept in `target/ptx/cubin` for the
//! next build of the same PTX. Without ptxas (or with `KILN_EMBED_CUBINS=0`) only the PTX is
//! embedded, and the build says once what that costs.

use std::path::{Path, PathBuf};

/// Set to `0` to embed no cubins (skips ptxas even where it is found).
const EMBED_CUBINS_ENV: &str = "KILN_EMBED_CUBINS";

#[path = "build/toolchain.rs"]
mod toolchain;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest.parent().expect("host/ lives in the workspace").to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let builder = kiln_ptx_builder::Builder::new(&workspace);
    for p in builder.source_paths() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    for var in ["KILN_SKIP_PTX", "PTXAS", "CUDA_HOME", EMBED_CUBINS_ENV] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    // A cargo that refuses -Z flags stops here, with what to do (cargo's own error names no remedy).
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let version = toolchain::cargo_version(&cargo);
    let pinned = toolchain::pinned_channel(&workspace).unwrap_or_else(|| "the pinned nightly".into());
    if let Some(v) = &version
        && !toolchain::accepts_z_flags(v, std::env::var_os("RUSTC_BOOTSTRAP").is_some_and(|b| b == "1"))
    {
        eprintln!("kiln: {}", toolchain::not_nightly_message(v, &pinned, &workspace.join("rust-toolchain.toml")));
        std::process::exit(1);
    }

    let mut modules = Vec::new();
    for (arch, _) in kiln_ptx_builder::ARCHS {
        let module = match builder.build(arch) {
            Ok(m) => m,
            Err(e) => {
                // A build script's panic is how cargo reports a failed build; the message says what to do.
                let running = version.as_deref().and_then(|v| v.lines().next()).unwrap_or("an unknown cargo");
                panic!("kiln: {e} (kiln pins {pinned}; this build runs {running})");
            }
        };
        let dest = out.join(format!("kiln_{arch}.ptx"));
        write_if_changed(&dest, module.text.as_bytes());
        modules.push((arch, module.text, dest));
    }

    let cubins = cubins(&workspace, &builder, &modules, &out);

    let mut table = String::from("/// The PTX modules built from kiln-gpu, by architecture name.\n");
    table.push_str("pub static MODULES: &[(&str, &str)] = &[\n");
    for (arch, _, dest) in &modules {
        table.push_str(&format!("    ({arch:?}, include_str!({:?})),\n", dest.display().to_string()));
    }
    table.push_str("];\n");
    table.push_str("/// The cubins ptxas assembled from `MODULES` at build time, by architecture name.\n");
    table.push_str("pub static CUBINS: &[(&str, &[u8])] = &[\n");
    for (arch, path) in &cubins.made {
        table.push_str(&format!("    ({arch:?}, include_bytes!({:?})),\n", path.display().to_string()));
    }
    table.push_str("];\n");
    table.push_str("/// The ptxas that assembled `CUBINS` (its path and version), when one was run.\n");
    table.push_str(&format!("pub static ASSEMBLER: Option<(&str, &str)> = {:?};\n", cubins.assembler));
    table.push_str("/// Why no ptxas was run, when none was.\n");
    table.push_str(&format!("pub static NOT_ASSEMBLED_BECAUSE: Option<&str> = {:?};\n", cubins.skipped));
    table.push_str("/// The modules ptxas rejected, with the first line of what it said.\n");
    table.push_str("pub static REJECTED: &[(&str, &str)] = &[\n");
    for (arch, why) in &cubins.rejected {
        table.push_str(&format!("    ({arch:?}, {why:?}),\n"));
    }
    table.push_str("];\n");
    write_if_changed(&out.join("ptx_modules.rs"), table.as_bytes());
}

/// What the build embeds besides the PTX.
struct Cubins {
    /// `ptxas` path and version, when it ran.
    assembler: Option<(String, String)>,
    /// Why it did not run.
    skipped: Option<String>,
    /// Each assembled module's cubin (in `OUT_DIR`).
    made: Vec<(&'static str, PathBuf)>,
    /// The modules ptxas rejected, with the first line of its log.
    rejected: Vec<(&'static str, String)>,
}

/// Assembles every module (in parallel threads, through the builder's cubin cache) and copies the
/// cubins into `out`; warns once when no ptxas is found.
fn cubins(
    workspace: &Path,
    builder: &kiln_ptx_builder::Builder,
    modules: &[(&'static str, String, PathBuf)],
    out: &Path,
) -> Cubins {
    let mut result = Cubins { assembler: None, skipped: None, made: Vec::new(), rejected: Vec::new() };
    if std::env::var(EMBED_CUBINS_ENV).is_ok_and(|v| v == "0") {
        result.skipped = Some(format!("{EMBED_CUBINS_ENV}=0 at build time"));
        return result;
    }
    let Some(ptxas) = kiln_ptx_builder::find_ptxas(workspace) else {
        println!(
            "cargo:warning=kiln: no ptxas found ($PTXAS, $CUDA_HOME/bin, PATH, .tools/ptxas, the nvidia-cuda-nvcc-cu12 \
             wheel), so only PTX is embedded: the first load of kiln's module in a process JIT-compiles it (about 16 s \
             on an H200 when the driver's cache does not have it). To embed cubins: `bash .ci/install-ptxas`, then \
             `touch host/build.rs` and build again."
        );
        result.skipped = Some("no ptxas was found at build time".into());
        return result;
    };
    println!("cargo:rerun-if-changed={}", ptxas.display());
    let version = kiln_ptx_builder::ptxas_version(&ptxas).unwrap_or_else(|| "version unknown".into());
    result.assembler = Some((ptxas.display().to_string(), version));
    let cache = builder.target_dir().join("cubin");
    let assembled: Vec<_> = std::thread::scope(|s| {
        let jobs: Vec<_> = modules
            .iter()
            .map(|(arch, text, _)| {
                let (ptxas, cache) = (&ptxas, &cache);
                (*arch, s.spawn(move || kiln_ptx_builder::assemble_cached(ptxas, text, arch, cache)))
            })
            .collect();
        jobs.into_iter().map(|(arch, job)| (arch, job.join().expect("an assembling thread panicked"))).collect()
    });
    for (arch, cubin) in assembled {
        match cubin {
            Ok(cached) => {
                let bytes =
                    std::fs::read(&cached).unwrap_or_else(|e| panic!("kiln: reading {}: {e}", cached.display()));
                let dest = out.join(format!("kiln_{arch}.cubin"));
                write_if_changed(&dest, &bytes);
                result.made.push((arch, dest));
            }
            Err(e) => {
                let text = e.to_string();
                let lines = || text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.contains("rejected the"));
                let first = lines()
                    .find(|l| l.contains("error") || l.contains("fatal"))
                    .or_else(|| lines().next())
                    .unwrap_or("")
                    .to_string();
                println!(
                    "cargo:warning=kiln: {} could not assemble the {arch} module ({first}); that module is embedded as \
                     PTX only (a newer ptxas, e.g. `bash .ci/install-ptxas`, assembles it)",
                    ptxas.display()
                );
                result.rejected.push((arch, first));
            }
        }
    }
    result
}

/// Writes `bytes` to `path` unless it already holds them (an unchanged file keeps its time stamp,
/// so the crate that embeds it is not rebuilt).
fn write_if_changed(path: &Path, bytes: &[u8]) {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return;
    }
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("kiln: writing {}: {e}", path.display()));
}
