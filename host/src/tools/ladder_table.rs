//! The whole ladder, one command: `kiln gemm --ladder [--shape MxNxK]` runs every kernel of
//! [`gemm_ladder::kernel_names`], in that order, on the same random inputs, checks each against the
//! f64 reference as `kiln gemm --kernel` does, times cuBLAS just before and just after each (the
//! mean of the two: the GPU's clocks drift as it heats, so a reference measured minutes earlier
//! favours whichever side ran first), and prints the table the guide's GEMM chapters quote.
//!
//! cuBLAS is loaded at run time (cudarc's dynamic loading): where `libcublas` is not found, the
//! table has no cuBLAS columns and says why. Kernels the device's module lacks (the `wgmma`
//! kernels outside sm_90a, `tcgen05` outside sm_100a) and kernels that refuse the shape are listed
//! as skipped, with the reason.

use super::gemm_ladder::{self, Operands, RungRun};
use crate::cuda::gemm::Layout;
use crate::cuda::{Device, DeviceBuffer, cublas, timing};
use crate::error::{Error, Result};
use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{cublasComputeType_t, cublasMath_t};
use half::prelude::HalfFloatVecExt;
use half::{bf16, f16};
use kiln_gpu::kernels::mma_tile::GemmShape;

/// What became of one kernel of the ladder.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// It ran: its check and time, and cuBLAS's milliseconds around it (the mean of the medians
    /// before and after; `None` without cuBLAS or where the cuBLAS call failed, see the notes).
    Ran {
        /// The kernel's run.
        run: RungRun,
        /// cuBLAS's milliseconds for the same product.
        cublas_ms: Option<f64>,
    },
    /// Not run: the device's module lacks it, or it refused the shape (why).
    Skipped(String),
    /// Its launch or its setup failed (the error).
    Failed(String),
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Row {
    /// The kernel.
    pub kernel: &'static str,
    /// The guide's rung ([`gemm_ladder::rung`]).
    pub rung: u32,
    /// What cuBLAS runs beside it.
    pub operands: Operands,
    /// What became of it.
    pub outcome: Outcome,
}

impl Row {
    /// Whether it ran and stayed within its error bound.
    pub fn passed(&self) -> bool {
        matches!(&self.outcome, Outcome::Ran { run, .. } if run.passed())
    }
}

/// The ladder's table: where it ran, on what, and a row per kernel in ladder order.
#[derive(Clone, Debug)]
pub struct LadderTable {
    /// The device's name.
    pub device: String,
    /// Its compute capability.
    pub compute_capability: (u32, u32),
    /// The module it loads (`sm_90a`).
    pub module: &'static str,
    /// The product.
    pub shape: GemmShape,
    /// Timed launches per median (the kernel's and each cuBLAS measurement's).
    pub reps: usize,
    /// Seed of the random inputs.
    pub seed: u64,
    /// `Ok` when cuBLAS was loaded, else why it was not.
    pub cublas: std::result::Result<(), String>,
    /// A row per kernel, in ladder order.
    pub rows: Vec<Row>,
    /// Anything else to say below the table (a cuBLAS call that failed).
    pub notes: Vec<String>,
}

impl LadderTable {
    /// Whether every kernel that was run passed its error bound, and none failed.
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|r| match r.outcome {
            Outcome::Ran { .. } => r.passed(),
            Outcome::Skipped(_) => true,
            Outcome::Failed(_) => false,
        })
    }
}

/// Kernel TFLOP/s over cuBLAS TFLOP/s for the same product: `cublas_ms / kernel_ms`.
pub fn ratio(kernel_ms: f64, cublas_ms: f64) -> f64 {
    cublas_ms / kernel_ms
}

/// `2 m n k` floating-point operations in `ms` milliseconds, in TFLOP/s.
pub fn tflops(s: GemmShape, ms: f64) -> f64 {
    2.0 * s.m as f64 * s.n as f64 * s.k as f64 / ms / 1e9
}

/// The mean of cuBLAS's medians measured before and after a kernel, `None` unless both are there.
pub fn bracketed(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    Some((before? + after?) / 2.0)
}

/// TFLOP/s to about three significant digits: 757, 47.5, 0.500, 0.000262.
fn fmt_tflops(t: f64) -> String {
    if t >= 100.0 {
        format!("{t:.0}")
    } else if t >= 1.0 {
        format!("{t:.1}")
    } else if t > 0.0 {
        let decimals = (2 - t.log10().floor() as i32).clamp(3, 12) as usize;
        format!("{t:.decimals$}")
    } else {
        format!("{t}")
    }
}

/// Milliseconds with four significant digits (at least three decimals).
fn fmt_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{ms:.0}")
    } else if ms >= 1.0 {
        format!("{ms:.3}")
    } else {
        format!("{ms:.4}")
    }
}

/// What cuBLAS runs beside a kernel with these operands, as the table names it.
pub fn cublas_name(op: Operands) -> &'static str {
    match op {
        Operands::F32(Layout::NN) => "SGEMM NN",
        Operands::F32(Layout::NT) => "SGEMM NT",
        Operands::F32(Layout::TN) => "SGEMM TN",
        Operands::Bf16 => "GemmEx bf16",
        Operands::F16 => "GemmEx f16",
    }
}

/// How a column is aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A Markdown table with its cells padded to each column's width (readable in a terminal, and
/// pasted into the guide as it is).
pub fn markdown(header: &[&str], align: &[Align], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let width = |c: usize| {
        rows.iter().map(|r| r.get(c).map_or(0, |x| x.chars().count())).max().unwrap_or(0).max(header[c].len()).max(3)
    };
    let widths: Vec<usize> = (0..cols).map(width).collect();
    let line = |cells: Vec<String>| -> String {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(c, x)| match align[c] {
                Align::Left => format!("{x:<w$}", w = widths[c]),
                Align::Right => format!("{x:>w$}", w = widths[c]),
            })
            .collect();
        format!("| {} |", padded.join(" | "))
    };
    let mut out = vec![line(header.iter().map(|h| h.to_string()).collect())];
    out.push(line(
        (0..cols)
            .map(|c| match align[c] {
                Align::Left => "-".repeat(widths[c]),
                Align::Right => format!("{}:", "-".repeat(widths[c] - 1)),
            })
            .collect(),
    ));
    for r in rows {
        out.push(line((0..cols).map(|c| r.get(c).cloned().unwrap_or_default()).collect()));
    }
    out.join("\n")
}

/// The columns of the table, with cuBLAS's last three.
pub const COLUMNS: [&str; 10] =
    ["rung", "kernel", "max error", "bound", "check", "ms", "TFLOP/s", "cuBLAS", "cuBLAS TFLOP/s", "of cuBLAS"];

/// The cells of one row (`with_cublas`: all ten columns, else the first seven).
pub fn cells(row: &Row, shape: GemmShape, with_cublas: bool) -> Vec<String> {
    let mut c = vec![row.rung.to_string(), format!("`{}`", row.kernel)];
    match &row.outcome {
        Outcome::Ran { run, cublas_ms } => {
            c.push(format!("{:.1e}", run.max_error));
            c.push(format!("{:.1e}", run.bound));
            c.push(if run.passed() { "ok" } else { "FAILED" }.into());
            c.push(fmt_ms(run.ms));
            c.push(fmt_tflops(run.tflops));
            if with_cublas {
                c.push(cublas_name(row.operands).into());
                match cublas_ms {
                    Some(ms) => {
                        c.push(fmt_tflops(tflops(shape, *ms)));
                        c.push(format!("{:.2}", ratio(run.ms, *ms)));
                    }
                    None => c.extend(["-".to_string(), "-".to_string()]),
                }
            }
        }
        Outcome::Skipped(_) | Outcome::Failed(_) => {
            let what = if matches!(row.outcome, Outcome::Skipped(_)) { "skipped" } else { "ERROR" };
            c.extend(["", "", what, "", ""].map(String::from));
            if with_cublas {
                c.extend(["", "", ""].map(String::from));
            }
        }
    }
    c
}

impl std::fmt::Display for LadderTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let GemmShape { m, n, k } = self.shape;
        let (major, minor) = self.compute_capability;
        writeln!(f, "device: {} (compute capability {major}.{minor}, module {})", self.device, self.module)?;
        writeln!(
            f,
            "product: {m}x{n}x{k}, the same random inputs in [-1, 1) for every kernel (seed {}), median of {} launches",
            self.seed, self.reps
        )?;
        writeln!(
            f,
            "max error: max |got - want| / sum |a b| against an f64 reference, within the bound k u to pass \
             (u = 2^-23 for f32 inputs, 2^-22 for bf16 and f16)"
        )?;
        let with_cublas = self.cublas.is_ok();
        match &self.cublas {
            Ok(()) => writeln!(
                f,
                "cuBLAS: timed just before and just after each kernel (the mean), in the same process on the same \
                 inputs: SGEMM with TF32 off (CUBLAS_DEFAULT_MATH) for the f32 rungs in their layout, GemmEx \
                 (bf16 or f16 in, f32 compute and out) for the tensor-core rungs; \"of cuBLAS\" is the kernel's \
                 TFLOP/s over cuBLAS's"
            )?,
            Err(why) => writeln!(f, "cuBLAS: not loaded ({why}), so the table has no cuBLAS columns")?,
        }
        writeln!(f)?;
        let cols = if with_cublas { 10 } else { 7 };
        use Align::{Left, Right};
        let align = [Right, Left, Right, Right, Left, Right, Right, Left, Right, Right];
        let rows: Vec<Vec<String>> = self.rows.iter().map(|r| cells(r, self.shape, with_cublas)).collect();
        writeln!(f, "{}", markdown(&COLUMNS[..cols], &align[..cols], &rows))?;
        let skipped: Vec<String> = self
            .rows
            .iter()
            .filter_map(|r| match &r.outcome {
                Outcome::Skipped(why) => Some(format!("- `{}`: {why}", r.kernel)),
                _ => None,
            })
            .collect();
        if !skipped.is_empty() {
            write!(f, "\nskipped:\n{}\n", skipped.join("\n"))?;
        }
        let failed: Vec<String> = self
            .rows
            .iter()
            .filter_map(|r| match &r.outcome {
                Outcome::Failed(e) => Some(format!("- `{}`: {e}", r.kernel)),
                _ => None,
            })
            .collect();
        if !failed.is_empty() {
            write!(f, "\nerrors:\n{}\n", failed.join("\n"))?;
        }
        if !self.notes.is_empty() {
            write!(f, "\nnotes:\n{}\n", self.notes.iter().map(|n| format!("- {n}")).collect::<Vec<_>>().join("\n"))?;
        }
        let ran = self.rows.iter().filter(|r| matches!(r.outcome, Outcome::Ran { .. })).count();
        let passed = self.rows.iter().filter(|r| r.passed()).count();
        write!(
            f,
            "\n{ran} of {} kernels ran, {passed} within their error bound: {}",
            self.rows.len(),
            if self.passed() { "ok" } else { "FAILED" }
        )
    }
}

/// Where and how a ladder was run, recorded with its JSON ([`LadderTable::to_json`]).
#[derive(Clone, Debug)]
pub struct Provenance {
    /// The date of the run (UTC, `YYYY-MM-DD`).
    pub date: String,
    /// The commit of the source the binary was built from, where known.
    pub commit: Option<String>,
    /// The command line that ran it.
    pub command: String,
}

impl LadderTable {
    /// The table as JSON, the form `cargo xtask figures` plots (`benches/results/gemm_ladder_*.json`):
    /// `{device, compute_capability, module, date, commit, command, shape: {m, n, k}, reps, seed,
    /// cublas, rows: [{rung, kernel, status, cublas, ms, tflops, cublas_tflops, ratio, max_err,
    /// bound, reason}]}`. Times and rates are unrounded; `cublas` is `null` when cuBLAS was loaded,
    /// else why not; a row's cuBLAS fields are `null` without a cuBLAS time, its measurements
    /// `null` unless it ran (`status` `ok` or `failed_check`; `skipped` and `error` give a
    /// `reason`).
    pub fn to_json(&self, p: &Provenance) -> String {
        use serde_json::{Value, json};
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let mut v = json!({ "rung": r.rung, "kernel": r.kernel, "cublas": cublas_name(r.operands) });
                match &r.outcome {
                    Outcome::Ran { run, cublas_ms } => {
                        v["status"] = json!(if run.passed() { "ok" } else { "failed_check" });
                        v["ms"] = json!(run.ms);
                        v["tflops"] = json!(run.tflops);
                        v["cublas_tflops"] = json!(cublas_ms.map(|ms| tflops(self.shape, ms)));
                        v["ratio"] = json!(cublas_ms.map(|ms| ratio(run.ms, ms)));
                        v["max_err"] = json!(run.max_error);
                        v["bound"] = json!(run.bound);
                    }
                    Outcome::Skipped(why) => {
                        v["status"] = json!("skipped");
                        v["reason"] = json!(why);
                    }
                    Outcome::Failed(e) => {
                        v["status"] = json!("error");
                        v["reason"] = json!(e);
                    }
                }
                v
            })
            .collect();
        let GemmShape { m, n, k } = self.shape;
        let (major, minor) = self.compute_capability;
        let doc = json!({
            "device": self.device,
            "compute_capability": format!("{major}.{minor}"),
            "module": self.module,
            "date": p.date,
            "commit": p.commit,
            "command": p.command,
            "shape": { "m": m, "n": n, "k": k },
            "reps": self.reps,
            "seed": self.seed,
            "cublas": self.cublas.as_ref().err(),
            "notes": self.notes,
            "rows": rows,
        });
        let mut s = serde_json::to_string_pretty(&doc).expect("a JSON value serializes");
        s.push('\n');
        s
    }
}

/// Today's date in UTC as `YYYY-MM-DD`, from the system clock (days since 1970 to a civil date).
pub fn utc_date_today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    civil_date((secs / 86_400) as i64)
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's `civil_from_days`).
pub fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02}")
}

/// Whether `e` is a kernel refusing the product or the device (a typed refusal before any
/// launch), not a failure.
fn refusal(e: &Error) -> bool {
    matches!(e, Error::Unsupported { .. } | Error::Shape { .. } | Error::KernelUnavailable { .. })
}

/// cuBLAS with the ladder's inputs on the device: f32 A (m k values) and B (k n values) as every
/// FP32 rung reads them, their bf16 and f16 roundings (A m x k, B n x k), and an output of its own.
struct Cublas {
    blas: CudaBlas,
    a32: DeviceBuffer<f32>,
    b32: DeviceBuffer<f32>,
    a_bf16: DeviceBuffer<bf16>,
    b_bf16: DeviceBuffer<bf16>,
    a_f16: DeviceBuffer<f16>,
    b_f16: DeviceBuffer<f16>,
    c: DeviceBuffer<f32>,
}

impl Cublas {
    /// Loads cuBLAS and uploads the inputs; `Ok(Err(why))` where cuBLAS is not here.
    fn load(dev: &Device, s: GemmShape, seed: u64) -> Result<std::result::Result<Cublas, String>> {
        if !cublas::available() {
            return Ok(Err("libcublas not found: put the CUDA libraries on LD_LIBRARY_PATH for the ratios".into()));
        }
        let blas = match CudaBlas::new(dev.stream().clone()) {
            Ok(b) => b,
            Err(e) => return Ok(Err(format!("creating a cuBLAS handle failed: {e:?}"))),
        };
        // TF32 off for SGEMM: cuBLAS's default math (set explicitly)
        if let Err(e) = cublas::set_math_mode(&blas, cublasMath_t::CUBLAS_DEFAULT_MATH) {
            return Ok(Err(e.to_string()));
        }
        let (a, b) = gemm_ladder::inputs(s, seed);
        Ok(Ok(Cublas {
            blas,
            a32: dev.upload(&a)?,
            b32: dev.upload(&b)?,
            a_bf16: dev.upload(&Vec::<bf16>::from_f32_slice(&a))?,
            b_bf16: dev.upload(&Vec::<bf16>::from_f32_slice(&b))?,
            a_f16: dev.upload(&Vec::<f16>::from_f32_slice(&a))?,
            b_f16: dev.upload(&Vec::<f16>::from_f32_slice(&b))?,
            c: dev.zeros::<f32>(s.m as usize * s.n as usize)?,
        }))
    }

    /// One cuBLAS product of `op`'s kind, row-major `C (m x n)` from the buffers as they are.
    fn launch(&mut self, op: Operands, s: GemmShape) -> std::result::Result<(), String> {
        let c = &mut self.c;
        let compute = cublasComputeType_t::CUBLAS_COMPUTE_32F;
        match op {
            Operands::F32(layout) => cublas::sgemm(&self.blas, &self.a32, &self.b32, c, s, layout),
            Operands::Bf16 => cublas::gemm_ex_abt(&self.blas, &self.a_bf16, &self.b_bf16, c, s, compute),
            Operands::F16 => cublas::gemm_ex_abt(&self.blas, &self.a_f16, &self.b_f16, c, s, compute),
        }
        .map_err(|e| e.to_string())
    }

    /// The median milliseconds of `reps` cuBLAS products of `op`'s kind (after two warm-ups), or
    /// why there are none.
    fn time(&mut self, dev: &Device, op: Operands, s: GemmShape, reps: usize) -> std::result::Result<f64, String> {
        let mut failed: Option<String> = None;
        let ms = timing::median_ms(dev, reps, 1, || {
            if let Err(e) = self.launch(op, s) {
                failed.get_or_insert(e);
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
        match failed {
            Some(e) => Err(e),
            None => Ok(ms),
        }
    }
}

/// Runs the whole ladder on `s`: every kernel of [`gemm_ladder::kernel_names`] in order through
/// [`gemm_ladder::run`] (the same inputs from `seed`, the same check, `reps` timed launches), with
/// cuBLAS timed just before and just after each where cuBLAS loads. A kernel that fails is a row
/// of the table, not an error: the error is for what stops the whole table (uploading the inputs).
pub fn run_ladder(dev: &Device, s: GemmShape, reps: usize, seed: u64) -> Result<LadderTable> {
    let mut cublas = Cublas::load(dev, s, seed)?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for name in gemm_ladder::kernel_names() {
        let (Some(rung), Some(operands)) = (gemm_ladder::rung(name), gemm_ladder::operands(name)) else {
            unreachable!("every name of kernel_names has a rung and operands (unit-tested)");
        };
        let row = |outcome| Row { kernel: name, rung, operands, outcome };
        if let Some(why) = gemm_ladder::unavailable(name, dev.arch()) {
            rows.push(row(Outcome::Skipped(why)));
            continue;
        }
        let mut time_cublas = |when: &str| -> Option<f64> {
            let c = cublas.as_mut().ok()?;
            match c.time(dev, operands, s, reps) {
                Ok(ms) => Some(ms),
                Err(e) => {
                    notes.push(format!("cuBLAS {} {when} `{name}` failed: {e}", cublas_name(operands)));
                    None
                }
            }
        };
        let before = time_cublas("before");
        let outcome = match gemm_ladder::run(dev, name, s, reps, seed, None) {
            Ok(run) => {
                let after = time_cublas("after");
                Outcome::Ran { run, cublas_ms: bracketed(before, after) }
            }
            Err(e) if refusal(&e) => Outcome::Skipped(format!("refused this product: {e}")),
            Err(e) => Outcome::Failed(e.to_string()),
        };
        rows.push(row(outcome));
    }
    let (major, minor) = dev.compute_capability();
    Ok(LadderTable {
        device: dev.name().to_string(),
        compute_capability: (major, minor),
        module: dev.arch().name(),
        shape: s,
        reps,
        seed,
        cublas: cublas.map(|_| ()),
        rows,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_gpu::Arch;

    fn run(kernel: &'static str, ms: f64, max_error: f64) -> RungRun {
        let shape = GemmShape { m: 64, n: 64, k: 64 };
        RungRun {
            kernel,
            shape,
            what: String::new(),
            ms,
            tflops: tflops(shape, ms),
            checked: 4096,
            max_error,
            bound: 64.0 * 2f64.powi(-23),
        }
    }

    fn row(kernel: &'static str, outcome: Outcome) -> Row {
        Row {
            kernel,
            rung: gemm_ladder::rung(kernel).unwrap(),
            operands: gemm_ladder::operands(kernel).unwrap(),
            outcome,
        }
    }

    fn table(rows: Vec<Row>, cublas: std::result::Result<(), String>) -> LadderTable {
        LadderTable {
            device: "test device".into(),
            compute_capability: (9, 0),
            module: "sm_90a",
            shape: GemmShape { m: 64, n: 64, k: 64 },
            reps: 3,
            seed: 1,
            cublas,
            rows,
            notes: Vec::new(),
        }
    }

    #[test]
    fn ratio_tflops_and_bracketing_arithmetic() {
        // half the time of cuBLAS is twice its TFLOP/s
        assert_eq!(ratio(1.0, 2.0), 2.0);
        assert_eq!(ratio(4.0, 1.0), 0.25);
        // 2 * 1000^3 flops in 1 ms = 2 TFLOP/s
        assert!((tflops(GemmShape { m: 1000, n: 1000, k: 1000 }, 1.0) - 2.0).abs() < 1e-12);
        assert_eq!(bracketed(Some(1.0), Some(3.0)), Some(2.0));
        assert_eq!(bracketed(None, Some(3.0)), None);
        assert_eq!(bracketed(Some(1.0), None), None);
        assert_eq!(fmt_tflops(757.4), "757");
        assert_eq!(fmt_tflops(47.46), "47.5");
        assert_eq!(fmt_tflops(0.5), "0.500");
        assert_eq!(fmt_tflops(0.000_262_14), "0.000262");
        assert_eq!(fmt_ms(0.18123), "0.1812");
        assert_eq!(fmt_ms(2.5), "2.500");
    }

    #[test]
    fn markdown_pads_columns_and_marks_number_columns() {
        let t = markdown(
            &["rung", "kernel"],
            &[Align::Right, Align::Left],
            &[vec!["1".into(), "`sgemm_naive`".into()], vec!["13".into(), "`x`".into()]],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "| rung | kernel        |");
        assert_eq!(lines[1], "| ---: | ------------- |");
        assert_eq!(lines[2], "|    1 | `sgemm_naive` |");
        assert_eq!(lines[3], "|   13 | `x`           |");
        // every line has the same width: a terminal shows the columns aligned
        assert!(lines.iter().all(|l| l.len() == lines[0].len()));
    }

    #[test]
    fn the_table_with_cublas_has_ratios_and_lists_skipped_kernels_with_the_reason() {
        let why = gemm_ladder::unavailable(gemm_ladder::TCGEN05, Arch::Sm90a).unwrap();
        let t = table(
            vec![
                row("sgemm_naive", Outcome::Ran { run: run("sgemm_naive", 2.0, 1e-7), cublas_ms: Some(0.5) }),
                row("hgemm_mma_bf16", Outcome::Ran { run: run("hgemm_mma_bf16", 1.0, 1e-7), cublas_ms: None }),
                row(gemm_ladder::TCGEN05, Outcome::Skipped(why.clone())),
            ],
            Ok(()),
        );
        let text = t.to_string();
        let header = text.lines().find(|l| l.starts_with("| rung")).unwrap();
        for c in COLUMNS {
            assert!(header.contains(c), "{header}");
        }
        let naive = text.lines().find(|l| l.contains("`sgemm_naive`")).unwrap();
        let cells: Vec<&str> = naive.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(
            cells,
            ["1", "`sgemm_naive`", "1.0e-7", "7.6e-6", "ok", "2.000", "0.000262", "SGEMM NN", "0.00105", "0.25"]
        );
        let mma = text.lines().find(|l| l.contains("`hgemm_mma_bf16`")).unwrap();
        let cells: Vec<&str> = mma.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells[7..], ["GemmEx bf16", "-", "-"], "{mma}");
        assert!(text.contains("skipped:\n- `gemm_tcgen05_bf16`: built only into the sm_100a module"), "{text}");
        assert!(text.contains(&why));
        assert!(text.ends_with("2 of 3 kernels ran, 2 within their error bound: ok"), "{text}");
        assert!(t.passed());
    }

    #[test]
    fn without_cublas_the_table_says_why_and_drops_its_columns() {
        let t = table(
            vec![row("sgemm_smem", Outcome::Ran { run: run("sgemm_smem", 1.0, 1e-7), cublas_ms: None })],
            Err("libcublas not found".into()),
        );
        let text = t.to_string();
        assert!(text.contains("cuBLAS: not loaded (libcublas not found), so the table has no cuBLAS columns"));
        let header = text.lines().find(|l| l.starts_with("| rung")).unwrap();
        assert!(header.contains("TFLOP/s") && !header.contains("cuBLAS"), "{header}");
        let smem = text.lines().find(|l| l.contains("`sgemm_smem`")).unwrap();
        assert_eq!(smem.matches('|').count(), 8, "seven cells: {smem}");
    }

    #[test]
    fn a_kernel_over_its_bound_or_failing_fails_the_table() {
        let over = run("sgemm_smem", 1.0, 1e-3);
        let t = table(vec![row("sgemm_smem", Outcome::Ran { run: over, cublas_ms: Some(1.0) })], Ok(()));
        assert!(!t.passed());
        assert!(t.to_string().lines().any(|l| l.contains("`sgemm_smem`") && l.contains("FAILED")));
        let nan = run("sgemm_smem", 1.0, f64::NAN);
        assert!(!table(vec![row("sgemm_smem", Outcome::Ran { run: nan, cublas_ms: None })], Ok(())).passed());
        let t = table(vec![row("sgemm_smem", Outcome::Failed("launch failed".into()))], Ok(()));
        assert!(!t.passed());
        assert!(t.to_string().contains("errors:\n- `sgemm_smem`: launch failed"));
        // a skipped kernel alone is no failure
        assert!(table(vec![row("sgemm_smem", Outcome::Skipped("refused".into()))], Ok(())).passed());
    }

    #[test]
    fn the_json_has_the_provenance_and_one_row_per_kernel() {
        let why = gemm_ladder::unavailable(gemm_ladder::TCGEN05, Arch::Sm90a).unwrap();
        let t = table(
            vec![
                row("sgemm_naive", Outcome::Ran { run: run("sgemm_naive", 2.0, 1e-7), cublas_ms: Some(0.5) }),
                row("hgemm_mma_bf16", Outcome::Ran { run: run("hgemm_mma_bf16", 1.0, 1e-7), cublas_ms: None }),
                row(gemm_ladder::TCGEN05, Outcome::Skipped(why.clone())),
            ],
            Ok(()),
        );
        let p = Provenance { date: "2026-11-28".into(), commit: Some("abc1234".into()), command: "kiln gemm".into() };
        let v: serde_json::Value = serde_json::from_str(&t.to_json(&p)).unwrap();
        assert_eq!(v["device"], "test device");
        assert_eq!(v["date"], "2026-11-28");
        assert_eq!(v["commit"], "abc1234");
        assert_eq!(v["command"], "kiln gemm");
        assert_eq!(v["shape"]["k"], 64);
        assert!(v["cublas"].is_null());
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0]["kernel"], "sgemm_naive");
        assert_eq!(rows[0]["rung"], 1);
        assert_eq!(rows[0]["status"], "ok");
        assert_eq!(rows[0]["cublas"], "SGEMM NN");
        assert_eq!(rows[0]["ratio"], 0.25);
        assert_eq!(rows[0]["tflops"], tflops(GemmShape { m: 64, n: 64, k: 64 }, 2.0));
        assert_eq!(rows[0]["max_err"], 1e-7);
        assert!(rows[1]["cublas_tflops"].is_null() && rows[1]["ratio"].is_null());
        assert_eq!(rows[2]["status"], "skipped");
        assert_eq!(rows[2]["reason"], why.as_str());
        assert!(rows[2]["tflops"].is_null());
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(59), "1970-03-01");
        assert_eq!(civil_date(11_016), "2000-02-29");
        assert_eq!(civil_date(20_785), "2026-11-28");
    }
}
