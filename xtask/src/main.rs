//! `cargo xtask`: kiln's developer tasks.
//!
//! - `cargo xtask build-ptx`: build one PTX module per architecture, check it, list its kernels and,
//!   when ptxas is found, assemble it and print each kernel's registers, shared memory, stack and
//!   spills. `--require-ptxas` makes a missing ptxas an error (CI uses it).
//! - `cargo xtask test`: the README's test command: `build-ptx`, then `cargo test --workspace`, then
//!   `cargo doc --workspace` with broken intra-doc links as errors.
//! - `cargo xtask gpu-bundle DIR`: build the test binaries in release mode and the PTX into DIR, with
//!   `run.sh`, so that a GPU machine with only a driver runs the whole GPU suite (optionally under
//!   compute-sanitizer).
//! - `cargo xtask engine-report KILN TORCH`: the engine-step table of issue 31 from the two benches'
//!   JSON.
//! - `cargo xtask figures`: the guide's plots (the ladder, the roofline) from `benches/results/*.json`
//!   into `guide/src/figures/`; `--check` fails where a committed one differs.
//! - `cargo xtask book`: `mdbook build guide`, failing on its warnings and errors.

mod engine_report;
mod figures;
mod report;

use clap::{Parser, Subcommand};
use kiln_ptx_builder::{ARCHS, Builder, KernelResources, assemble, find_ptxas};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[derive(Parser)]
#[command(name = "xtask", about = "kiln developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build and check the PTX modules (sm_80, sm_90a, sm_100a); assemble them when ptxas is found.
    BuildPtx {
        /// Fail when no ptxas is found instead of skipping assembly.
        #[arg(long)]
        require_ptxas: bool,
        /// Where to copy the modules and cubins (default: target/ptx/out).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the nested cargo commands.
        #[arg(long, short)]
        verbose: bool,
    },
    /// The test command: build and check the PTX (assembled when ptxas is found; required with
    /// `--require-ptxas` or KILN_REQUIRE_PTXAS=1), then `cargo test --workspace`.
    Test {
        /// Fail when no ptxas is found.
        #[arg(long)]
        require_ptxas: bool,
        /// Extra arguments for `cargo test`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Turn a GEMM bench JSON (from `benches/gemm` / `run.sh --bench`) into a Markdown table and an
    /// SVG plot under DIR (default benches/results).
    BenchReport {
        /// The bench's JSON output.
        input: PathBuf,
        /// Output folder.
        #[arg(long, default_value = "benches/results")]
        out: PathBuf,
        /// The command that produced the JSON (recorded with the results).
        #[arg(long, default_value = ".bundle/run.sh --bench")]
        command: String,
        /// The date of the run (recorded with the results).
        #[arg(long)]
        date: String,
    },
    /// Run one of `benches/` on this machine's GPU (`cargo bench --bench NAME`), keep its JSON in
    /// `target/bench/NAME.json`, and for `gemm` also write the Markdown table and SVG plot into OUT
    /// (what `bench-report` does). Machines without cargo run the GPU bundle's `run.sh --bench`.
    Bench {
        /// The bench: gemm, tensor_ops or mlp_step.
        name: String,
        /// Folder for the gemm report.
        #[arg(long, default_value = "benches/results")]
        out: PathBuf,
        /// The date recorded with the gemm report (default: today, from `date -I`).
        #[arg(long)]
        date: Option<String>,
    },
    /// Join `benches/engine_step`'s JSON with `benches/torch_engine_step.py`'s (same run) into
    /// `engine_step.json` and `engine_step.md` under OUT: kiln / PyTorch per case, peak memory.
    EngineReport {
        /// kiln's JSON (`results/engine_step.json` from `run.sh --bench`).
        kiln: PathBuf,
        /// PyTorch's JSON (`results/torch_engine_step.json`).
        torch: PathBuf,
        /// Output folder.
        #[arg(long, default_value = "benches/results")]
        out: PathBuf,
        /// The command that produced the JSON (recorded with the results).
        #[arg(long, default_value = ".bundle/run.sh --bench")]
        command: String,
        /// The date of the run.
        #[arg(long)]
        date: String,
        /// The commit measured.
        #[arg(long)]
        commit: String,
    },
    /// Draw the guide's plots (the ladder against cuBLAS and the peaks, the roofline) from the recorded
    /// results (`benches/results/gemm_ladder_4096.json`) into guide/src/figures/.
    Figures {
        /// Write nothing; fail if a committed figure differs from what its data gives.
        #[arg(long)]
        check: bool,
    },
    /// Build the guide with mdBook (`mdbook build guide`, into target/book), failing on any warning or
    /// error it prints. Needs `mdbook` on PATH (`cargo install mdbook --locked --version 0.4.52`).
    Book,
    /// Build a self-contained GPU test bundle: release test binaries, PTX, and run.sh.
    GpuBundle {
        /// The folder to write (created; emptied first).
        dir: PathBuf,
    },
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.task {
        Task::BuildPtx { require_ptxas, out, verbose } => build_ptx(require_ptxas, out, verbose).map(|_| ()),
        Task::Test { require_ptxas, args } => {
            test(require_ptxas || std::env::var("KILN_REQUIRE_PTXAS").is_ok_and(|v| v == "1"), &args)
        }
        Task::GpuBundle { dir } => gpu_bundle(&dir),
        Task::Figures { check } => figures::figures(&workspace(), check),
        Task::Book => book(),
        Task::Bench { name, out, date } => bench(&name, &out, date),
        Task::BenchReport { input, out, command, date } => report::gemm_report(&input, &out, &command, &date),
        Task::EngineReport { kiln, torch, out, command, date, commit } => {
            engine_report::engine_report(&kiln, &torch, &out, &command, &date, &commit)
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_table(arch: &str, rows: &[KernelResources]) {
    // the name column as wide as the longest kernel name, so long names keep the columns aligned
    let w = rows.iter().map(|k| k.name.len()).max().unwrap_or(0).max("kernel".len());
    println!(
        "  {:<w$} {:>5} {:>10} {:>7} {:>12} {:>11}",
        "kernel", "regs", "smem (B)", "stack", "spill st (B)", "spill ld (B)"
    );
    for k in rows {
        println!(
            "  {:<w$} {:>5} {:>10} {:>7} {:>12} {:>11}",
            k.name, k.registers, k.shared, k.stack, k.spill_stores, k.spill_loads
        );
    }
    let spills: Vec<_> = rows.iter().filter(|k| k.spill_stores + k.spill_loads > 0).map(|k| k.name.as_str()).collect();
    if !spills.is_empty() {
        println!("  warning: {arch}: kernels with register spills: {}", spills.join(", "));
    }
}

/// Builds every module into `out`; returns the paths of the PTX files.
fn build_ptx(require_ptxas: bool, out: Option<PathBuf>, verbose: bool) -> Res<Vec<PathBuf>> {
    let ws = workspace();
    let builder = Builder::new(&ws).verbose(verbose);
    let out = out.unwrap_or_else(|| builder.target_dir().join("out"));
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let ptxas = find_ptxas(&ws);
    match &ptxas {
        Some(p) => println!("ptxas: {}", p.display()),
        None if require_ptxas => {
            return Err(
                "no ptxas found ($PTXAS, $CUDA_HOME/bin, PATH, .tools/ptxas, or the nvidia-cuda-nvcc-cu12 wheel); \
                        `bash .ci/install-ptxas` installs one into .tools/ptxas"
                    .into(),
            );
        }
        None => println!("ptxas: not found; modules are built and checked but not assembled (see README)"),
    }
    let mut paths = Vec::new();
    for (arch, _) in ARCHS {
        let m = builder.build(arch).map_err(|e| e.to_string())?;
        let ptx = out.join(format!("kiln_{arch}.ptx"));
        let changed = std::fs::read_to_string(&ptx).map(|old| old != m.text).unwrap_or(true);
        if changed {
            std::fs::write(&ptx, &m.text).map_err(|e| format!("writing {}: {e}", ptx.display()))?;
        }
        let version = m.text.lines().find(|l| l.starts_with(".version")).unwrap_or(".version ?");
        println!("{arch}: {} ({version}), {} kernels: {}", ptx.display(), m.entries.len(), m.entries.join(", "));
        if let Some(ptxas) = &ptxas {
            let cubin = out.join(format!("kiln_{arch}.cubin"));
            let rows = assemble(ptxas, &ptx, arch, &cubin).map_err(|e| e.to_string())?;
            let missing: Vec<_> = m.entries.iter().filter(|e| !rows.iter().any(|r| &r.name == *e)).collect();
            if !missing.is_empty() {
                return Err(format!("ptxas reported no resources for {missing:?} in {arch}"));
            }
            print_table(arch, &rows);
        }
        paths.push(ptx);
    }
    Ok(paths)
}

fn test(require_ptxas: bool, args: &[String]) -> Res<()> {
    build_ptx(require_ptxas, None, false)?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace())
        .args(["test", "--workspace"])
        .args(args)
        .status()
        .map_err(|e| format!("running cargo test: {e}"))?;
    if !status.success() {
        return Err(format!("cargo test failed ({status})"));
    }
    docs()
}

/// `cargo doc` of the workspace with broken and private intra-doc links as errors, so that the
/// API docs' links keep resolving (on the host, where device-only items do not exist: name those
/// in plain code spans).
fn docs() -> Res<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    println!("checking the API docs' links (cargo doc --workspace --no-deps)...");
    let status = Command::new(cargo)
        .current_dir(workspace())
        .args(["doc", "--workspace", "--no-deps", "--quiet"])
        .env("RUSTDOCFLAGS", "-D rustdoc::broken_intra_doc_links -D rustdoc::private_intra_doc_links")
        .status()
        .map_err(|e| format!("running cargo doc: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("cargo doc found broken intra-doc links ({status})")) }
}

/// `mdbook build guide` into target/book; any line mdBook prints at WARN or ERROR level fails it
/// (mdBook itself exits 0 after some warnings, such as a chapter file it cannot find).
fn book() -> Res<()> {
    let ws = workspace();
    let dest = ws.join("target/book");
    let out =
        Command::new("mdbook")
            .current_dir(&ws)
            .arg("build")
            .arg("guide")
            .arg("--dest-dir")
            .arg(&dest)
            .output()
            .map_err(|e| format!("running mdbook: {e} (install it: cargo install mdbook --locked --version 0.4.52)"))?;
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    print!("{log}");
    let bad: Vec<&str> = log.lines().filter(|l| l.contains("[WARN]") || l.contains("[ERROR]")).collect();
    if !out.status.success() {
        return Err(format!("mdbook build failed ({})", out.status));
    }
    if !bad.is_empty() {
        return Err(format!("mdbook build printed {} warning(s) or error(s)", bad.len()));
    }
    println!("book: {}", dest.join("index.html").display());
    Ok(())
}

fn bench(name: &str, out: &Path, date: Option<String>) -> Res<()> {
    let ws = workspace();
    let json = ws.join("target/bench").join(format!("{name}.json"));
    std::fs::create_dir_all(json.parent().expect("a folder")).map_err(|e| format!("target/bench: {e}"))?;
    let _ = std::fs::remove_file(&json);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&ws)
        .args(["bench", "-p", "kiln", "--bench", name])
        .env("KILN_BENCH_OUT", &json)
        .status()
        .map_err(|e| format!("running cargo bench: {e}"))?;
    if !status.success() {
        return Err(format!("cargo bench --bench {name} failed ({status})"));
    }
    if !json.exists() {
        return Err(format!(
            "benches/{name} wrote no results: it found no GPU (its message is above). Run it on a machine with \
             one, or build the GPU bundle (`cargo xtask gpu-bundle DIR`) and run `DIR/run.sh --bench` there"
        ));
    }
    println!("results: {}", json.display());
    if name == "gemm" {
        let date = match date {
            Some(d) => d,
            None => run(Command::new("date").arg("-I"))?.trim().to_string(),
        };
        report::gemm_report(&json, out, "cargo xtask bench gemm", &date)?;
    }
    Ok(())
}

fn run(cmd: &mut Command) -> Res<String> {
    let out = cmd.output().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# kiln GPU bundle: runs every test binary in tests/ with the PTX in ptx/.
# The GPU suite runs one process per test (a kernel that traps poisons only its own CUDA context),
# each under a time limit, so one failure never hides or hangs the others.
# Usage: ./run.sh [--sanitize] [--only PATTERN] [--bench]
#   --sanitize   also run each GPU test under compute-sanitizer (memcheck, racecheck, synccheck)
#   --only P     run only GPU tests whose name contains P
#   --bench      then run the benchmarks in benches/ (kiln's and PyTorch's, same shapes), results in results/
# Needs only an NVIDIA driver (and compute-sanitizer for --sanitize); no cargo.
set -u
cd "$(dirname "$0")"
# Tests fill every new uninitialized output with NaN (KILN_POISON=1) so an unwritten element fails;
# the benchmarks run without it.
export KILN_REQUIRE_GPU=1 KILN_POISON=1 KILN_PTX_DIR="$PWD/ptx"
# The tests that run the `kiln` binary as a user does run the copy in bin/ (kiln::testing::kiln_binary).
export KILN_BIN="$PWD/bin/kiln"
# Where the device tool collects outputs ($OUT), keep the whole log there too.
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then exec > >(tee -a "$OUT/run.log") 2>&1; fi
sanitize=0; only=""; bench=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=1 ;;
    --only) only="$2"; shift ;;
    --bench) bench=1 ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift
done
passed=0; failed=0; failures=""
record() { if [ "$1" = 0 ]; then passed=$((passed+1)); else failed=$((failed+1)); failures="$failures $2"; fi; }
gpu_tests=$(tests/gpu --list 2>/dev/null | sed -n 's/: test$//p' | grep -F -- "$only")
if [ -z "$only" ]; then
  for t in tests/*; do
    [ "$(basename "$t")" = gpu ] && continue
    echo "=== $t"; "$t" -q; record $? "$t"
  done
fi
for name in $gpu_tests; do
  echo "=== gpu $name"; timeout 60 tests/gpu --exact "$name"; record $? "$name"
done
if [ $sanitize = 1 ]; then
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$cs" ]; then record 1 compute-sanitizer-not-found
  else
    for tool in memcheck racecheck synccheck; do
      for name in $gpu_tests; do
        echo "=== compute-sanitizer --tool $tool $name"
        timeout 120 "$cs" --tool "$tool" --error-exitcode 99 tests/gpu --exact "$name"; record $? "$tool:$name"
      done
    done
  fi
fi
if [ $bench = 1 ]; then
  mkdir -p results
  # cuBLAS for the GEMM comparison: the CUDA toolkit's, or the one PyTorch's wheels carry.
  for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia.cublas as m; print(list(m.__path__)[0] + "/lib")' 2>/dev/null); do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
  done
  for b in benches/*; do
    case "$b" in
      *.py) echo "=== python3 $b"; python3 "$b" "results/$(basename "$b" .py).json"; record $? "$b" ;;
      *) echo "=== $b"; env -u KILN_POISON KILN_BENCH_OUT="results/$(basename "$b").json" "$b"; record $? "$b" ;;
    esac
  done
fi
# Where the device tool collects outputs ($OUT), leave the bench results there too.
if [ -n "${OUT:-}" ] && [ -d results ]; then cp results/* "$OUT"/ 2>/dev/null; fi
echo
[ -n "$failures" ] && echo "failed:$failures"
echo "bundle: $passed passed, $failed failed"
[ $failed = 0 ]
"#;

fn gpu_bundle(dir: &Path) -> Res<()> {
    let ws = workspace();
    let ptx_files = build_ptx(false, None, false)?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    println!("building release test binaries...");
    let json = run(Command::new(&cargo).current_dir(&ws).args([
        "test",
        "--release",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]))?;
    let mut exes = Vec::new();
    // The `kiln` binary the CLI tests run (cargo builds it for the integration tests).
    let mut kiln_bin = None;
    for line in json.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if v["reason"] == "compiler-artifact"
            && v["target"]["kind"][0] == "bin"
            && v["target"]["name"] == "kiln"
            && v["profile"]["test"] == false
            && let Some(exe) = v["executable"].as_str()
        {
            kiln_bin = Some(PathBuf::from(exe));
        }
        // proc-macro test binaries need the toolchain's shared libraries; the xtask has no GPU tests.
        if v["reason"] != "compiler-artifact"
            || v["profile"]["test"] != true
            || v["target"]["kind"][0] == "proc-macro"
            || v["target"]["name"] == "xtask"
        {
            continue;
        }
        let (Some(exe), Some(name), Some(kind)) =
            (v["executable"].as_str(), v["target"]["name"].as_str(), v["target"]["kind"][0].as_str())
        else {
            continue;
        };
        // Integration tests keep their name (`gpu`); unit-test binaries get their kind (`kiln-lib`).
        let file = if kind == "test" { name.to_string() } else { format!("{name}-{kind}") };
        exes.push((PathBuf::from(exe), file));
    }
    let bench_json = run(Command::new(&cargo).current_dir(&ws).args([
        "bench",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]))?;
    let mut benches = Vec::new();
    for line in bench_json.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if v["reason"] == "compiler-artifact"
            && v["target"]["kind"][0] == "bench"
            && let (Some(exe), Some(name)) = (v["executable"].as_str(), v["target"]["name"].as_str())
        {
            benches.push((PathBuf::from(exe), name.to_string()));
        }
    }
    if !exes.iter().any(|(_, n)| n == "gpu") {
        return Err("the GPU test binary was not built".into());
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("emptying {}: {e}", dir.display()))?;
    }
    let tests = dir.join("tests");
    let ptx = dir.join("ptx");
    let bench_dir = dir.join("benches");
    for d in [&tests, &ptx, &bench_dir] {
        std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    for (exe, name) in &exes {
        let dest = tests.join(name);
        std::fs::copy(exe, &dest).map_err(|e| format!("copying {}: {e}", exe.display()))?;
        // Debug sections are most of a test binary's size; a bundle travels, so drop them when
        // `strip` is there (symbols stay, so backtraces still name functions).
        let _ = Command::new("strip").arg("--strip-debug").arg(&dest).status();
    }
    for (exe, name) in &benches {
        let dest = bench_dir.join(name);
        std::fs::copy(exe, &dest).map_err(|e| format!("copying {}: {e}", exe.display()))?;
        let _ = Command::new("strip").arg("--strip-debug").arg(&dest).status();
    }
    for entry in std::fs::read_dir(ws.join("benches")).map_err(|e| format!("reading benches/: {e}"))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "py") {
            let name = path.file_name().expect("file name");
            std::fs::copy(&path, bench_dir.join(name)).map_err(|e| format!("copying {}: {e}", path.display()))?;
        }
    }
    for p in ptx_files {
        let name = p.file_name().expect("ptx file name");
        std::fs::copy(&p, ptx.join(name)).map_err(|e| format!("copying {}: {e}", p.display()))?;
        // The cubin ptxas assembled from the same PTX: the device loads it without a JIT pass
        // (minutes for the largest kernels, repeated in every test process).
        // Only a cubin at least as new as the PTX was assembled from it (without ptxas this build,
        // an older one may be left from other PTX).
        let cubin = p.with_extension("cubin");
        let modified = |f: &std::path::Path| f.metadata().and_then(|m| m.modified()).ok();
        if modified(&cubin).is_some_and(|c| modified(&p).is_some_and(|t| c >= t)) {
            let name = cubin.file_name().expect("cubin file name");
            std::fs::copy(&cubin, ptx.join(name)).map_err(|e| format!("copying {}: {e}", cubin.display()))?;
        }
    }
    let kiln_bin = kiln_bin.ok_or("the kiln binary was not built (the CLI tests run it)")?;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| format!("creating {}: {e}", bin.display()))?;
    std::fs::copy(&kiln_bin, bin.join("kiln")).map_err(|e| format!("copying {}: {e}", kiln_bin.display()))?;
    let script = dir.join("run.sh");
    std::fs::write(&script, RUN_SH).map_err(|e| format!("writing run.sh: {e}"))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod run.sh: {e}"))?;
    }
    println!(
        "bundle: {} ({} test binaries: {})",
        dir.display(),
        exes.len(),
        exes.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>().join(", ")
    );
    println!("run it on a GPU machine with: {}/run.sh [--sanitize]", dir.display());
    Ok(())
}
