//! `cargo xtask figures`: the guide's plots, drawn from recorded results.
//!
//! - `guide/src/figures/ladder-4096.svg`: every kernel of `benches/results/gemm_ladder_4096.json` (what
//!   `kiln gemm --ladder --json PATH` writes) as a bar of TFLOP/s, with cuBLAS timed around it and the
//!   hardware's peak for its operands.
//! - `guide/src/figures/roofline.svg`: the roofline of the ladder's GPU, with the best kernel of each rung
//!   at the arithmetic intensity of an ideal GEMM of the ladder's shape.
//!
//! The peaks come from `guide/figures-src/peaks.json` (sources in `guide/src/hardware.md`). The SVG is
//! written as text, so the same JSON always gives the same bytes: `cargo xtask figures --check` (and
//! this module's test) fail when a committed figure differs from what its JSON gives.

use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

type Res<T> = Result<T, String>;

/// The ladder's JSON, the peaks' JSON, and the figures drawn from them.
pub const LADDER_JSON: &str = "benches/results/gemm_ladder_4096.json";
/// The hardware's peaks.
pub const PEAKS_JSON: &str = "guide/figures-src/peaks.json";
/// Where the figures go.
pub const OUT_DIR: &str = "guide/src/figures";

fn read_json(ws: &Path, rel: &str) -> Res<Value> {
    let path = ws.join(rel);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// One kernel of a recorded ladder.
#[derive(Clone, Debug, PartialEq)]
pub struct Rung {
    /// The guide's rung.
    pub rung: u64,
    /// The kernel.
    pub kernel: String,
    /// What cuBLAS ran beside it (`SGEMM NN`, `GemmEx bf16`, ...).
    pub cublas: String,
    /// TFLOP/s, `None` when it did not run.
    pub tflops: Option<f64>,
    /// cuBLAS's TFLOP/s around it.
    pub cublas_tflops: Option<f64>,
    /// Its TFLOP/s over cuBLAS's, as recorded (from the unrounded times).
    pub ratio: Option<f64>,
    /// Why it did not run.
    pub reason: Option<String>,
}

impl Rung {
    /// Whether its operands are f32 (the CUDA-core rungs, against the FP32 peak).
    pub fn fp32(&self) -> bool {
        self.cublas.starts_with("SGEMM") || self.kernel.starts_with("sgemm")
    }
}

/// A recorded ladder: where and when it ran, and its kernels in ladder order.
#[derive(Clone, Debug)]
pub struct Ladder {
    pub device: String,
    pub date: String,
    pub commit: String,
    pub run: Option<u64>,
    pub shape: (u64, u64, u64),
    pub rows: Vec<Rung>,
}

/// Parses the JSON `kiln gemm --ladder --json` writes.
pub fn ladder(v: &Value) -> Res<Ladder> {
    let s = |k: &str| v[k].as_str().map(String::from).ok_or_else(|| format!("ladder JSON without `{k}`"));
    let dim = |k: &str| v["shape"][k].as_u64().ok_or_else(|| format!("ladder JSON without `shape.{k}`"));
    let rows = v["rows"].as_array().ok_or("ladder JSON without `rows`")?;
    let rows = rows
        .iter()
        .map(|r| {
            Ok(Rung {
                rung: r["rung"].as_u64().ok_or_else(|| format!("row without `rung`: {r}"))?,
                kernel: r["kernel"].as_str().ok_or_else(|| format!("row without `kernel`: {r}"))?.to_string(),
                cublas: r["cublas"].as_str().unwrap_or("").to_string(),
                tflops: r["tflops"].as_f64(),
                cublas_tflops: r["cublas_tflops"].as_f64(),
                ratio: r["ratio"].as_f64(),
                reason: r["reason"].as_str().map(String::from),
            })
        })
        .collect::<Res<Vec<_>>>()?;
    Ok(Ladder {
        device: s("device")?,
        date: s("date")?,
        commit: v["commit"].as_str().unwrap_or("unknown").to_string(),
        run: v["run"].as_u64(),
        shape: (dim("m")?, dim("n")?, dim("k")?),
        rows,
    })
}

/// A GPU's peaks, TFLOP/s and TB/s.
#[derive(Clone, Debug)]
pub struct Peaks {
    pub name: String,
    pub fp32: f64,
    pub bf16: f64,
    pub hbm: f64,
}

/// The peaks of the card whose `match` string the device name contains.
pub fn peaks_for(v: &Value, device: &str) -> Res<Peaks> {
    let cards = v["cards"].as_array().ok_or("peaks JSON without `cards`")?;
    let card = cards
        .iter()
        .find(|c| c["match"].as_str().is_some_and(|m| device.contains(m)))
        .ok_or_else(|| format!("no peaks for device `{device}` in {PEAKS_JSON}"))?;
    let num = |k: &str| card[k].as_f64().ok_or_else(|| format!("peaks JSON: card without `{k}`"));
    Ok(Peaks {
        name: card["name"].as_str().unwrap_or(device).to_string(),
        fp32: num("fp32_tflops")?,
        bf16: num("bf16_dense_tflops")?,
        hbm: num("hbm_tb_s")?,
    })
}

/// A minimal SVG writer: elements as text, numbers with one decimal, so output is reproducible.
struct Svg {
    w: f64,
    h: f64,
    body: String,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

impl Svg {
    fn new(w: f64, h: f64) -> Svg {
        Svg { w, h, body: String::new() }
    }
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, stroke: &str) {
        let _ = writeln!(
            self.body,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{fill}" stroke="{stroke}"/>"#
        );
    }
    fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str, width: f64, dash: Option<&str>) {
        let dash = dash.map(|d| format!(r#" stroke-dasharray="{d}""#)).unwrap_or_default();
        let _ = writeln!(
            self.body,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{stroke}" stroke-width="{width}"{dash}/>"#
        );
    }
    fn text(&mut self, x: f64, y: f64, s: &str, size: f64, anchor: &str, fill: &str, bold: bool) {
        let weight = if bold { r#" font-weight="bold""# } else { "" };
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" font-family="sans-serif" font-size="{size}" text-anchor="{anchor}" fill="{fill}"{weight}>{}</text>"#,
            esc(s)
        );
    }
    fn rotated_text(&mut self, x: f64, y: f64, s: &str, size: f64, degrees: f64, fill: &str) {
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" font-family="sans-serif" font-size="{size}" text-anchor="middle" fill="{fill}" transform="rotate({degrees:.1} {x:.1} {y:.1})">{}</text>"#,
            esc(s)
        );
    }
    fn circle(&mut self, x: f64, y: f64, r: f64, fill: &str) {
        let _ = writeln!(
            self.body,
            r##"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{fill}" stroke="#000" stroke-width="0.5"/>"##
        );
    }
    fn finish(self) -> String {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\">\n\
             <!-- generated by `cargo xtask figures` (xtask/src/figures.rs); do not edit -->\n\
             <rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#fff\"/>\n{}</svg>\n",
            self.body,
            w = self.w,
            h = self.h
        )
    }
}

const BLUE: &str = "#4e79a7";
const GREEN: &str = "#59a14f";
const RED: &str = "#e15759";
const GREY: &str = "#888";

/// TFLOP/s as the ladder's table prints them: 3 significant digits.
fn fmt_t(t: f64) -> String {
    if t >= 100.0 {
        format!("{t:.0}")
    } else if t >= 1.0 {
        format!("{t:.1}")
    } else {
        format!("{t:.3}")
    }
}

fn provenance(l: &Ladder) -> String {
    let run = l.run.map(|r| format!("run {r}, ")).unwrap_or_default();
    format!("{}, {run}{}, commit {}", l.device, l.date, l.commit)
}

/// The ladder as horizontal bars: two panels (f32 operands against the FP32 peak, 16-bit operands
/// against the bf16 dense peak), one row per kernel in ladder order, cuBLAS as a tick on each row.
pub fn ladder_svg(l: &Ladder, p: &Peaks) -> String {
    let (m, n, k) = l.shape;
    let row_h = 17.0;
    let (label_w, plot_w, left) = (300.0, 430.0, 20.0);
    let panels: [(&str, Vec<&Rung>, f64, f64, &str); 2] = [
        (
            "f32 operands (CUDA cores; rungs 1-7, 13) vs cuBLAS SGEMM, TF32 off",
            l.rows.iter().filter(|r| r.fp32()).collect(),
            p.fp32,
            70.0,
            BLUE,
        ),
        (
            "bf16 / f16 operands, f32 out (tensor cores; rungs 8-12, 14, 15) vs cuBLAS GemmEx",
            l.rows.iter().filter(|r| !r.fp32()).collect(),
            p.bf16,
            1000.0,
            GREEN,
        ),
    ];
    let rows: usize = panels.iter().map(|p| p.1.len()).sum();
    let height = 70.0 + rows as f64 * row_h + 2.0 * 70.0 + 40.0;
    let width = left + label_w + plot_w + 190.0;
    let mut s = Svg::new(width, height.round());
    s.text(
        width / 2.0,
        22.0,
        &format!("kiln gemm --ladder at {m} x {n} x {k}: every kernel against cuBLAS and the peak"),
        14.0,
        "middle",
        "#000",
        true,
    );
    s.text(width / 2.0, 40.0, &provenance(l), 11.0, "middle", "#333", false);
    let mut y0 = 60.0;
    for (title, rungs, peak, top, color) in panels {
        let x0 = left + label_w;
        let x = |t: f64| x0 + t.min(top) / top * plot_w;
        s.text(left, y0 + 14.0, title, 12.0, "start", "#000", true);
        let yt = y0 + 24.0;
        let yb = yt + rungs.len() as f64 * row_h;
        // grid
        let step = top / 7.0;
        let step = if top <= 100.0 { 10.0 } else { (step / 100.0).round() * 100.0 };
        let mut g = 0.0;
        while g <= top + 1e-9 {
            s.line(x(g), yt, x(g), yb, "#e4e4e4", 1.0, None);
            s.text(x(g), yb + 13.0, &format!("{g}"), 10.0, "middle", "#333", false);
            g += step;
        }
        s.text(x0 + plot_w / 2.0, yb + 27.0, "TFLOP/s", 10.5, "middle", "#333", false);
        for (i, r) in rungs.iter().enumerate() {
            let y = yt + i as f64 * row_h;
            s.text(x0 - 6.0, y + 12.0, &format!("{}  {}", r.rung, r.kernel), 10.5, "end", "#000", false);
            match r.tflops {
                Some(t) => {
                    s.rect(x0, y + 3.0, x(t) - x0, row_h - 6.0, color, "none");
                    let mut note = fmt_t(t);
                    if let Some(c) = r.cublas_tflops {
                        s.line(x(c), y + 1.0, x(c), y + row_h - 1.0, "#000", 2.0, None);
                        let ratio = r.ratio.unwrap_or(t / c);
                        note += &format!("  ({ratio:.2} of cuBLAS, {:.0}% of peak)", 100.0 * t / peak);
                    }
                    s.text(x0 + plot_w + 6.0, y + 12.0, &note, 10.0, "start", "#333", false);
                }
                None => {
                    let why = r.reason.as_deref().unwrap_or("did not run");
                    let why = if why.contains("sm_100a") { "skipped: sm_100a only (Blackwell)" } else { "skipped" };
                    s.text(x0 + 6.0, y + 12.0, why, 10.0, "start", GREY, false);
                }
            }
        }
        s.line(x(peak), yt - 4.0, x(peak), yb, RED, 2.0, None);
        s.text(x(peak) - 4.0, yt - 7.0, &format!("peak {peak}"), 10.0, "end", RED, false);
        s.rect(x0, yt, plot_w, yb - yt, "none", "#000");
        y0 = yb + 44.0;
    }
    let legend_y = y0 + 2.0;
    s.line(left, legend_y - 4.0, left, legend_y + 6.0, "#000", 2.0, None);
    s.text(
        left + 6.0,
        legend_y + 5.0,
        &format!(
            "cuBLAS, timed just before and after each kernel in the same process. Red: the {} peak for the operands \
             ({} FP32, {} bf16 dense), from guide/src/hardware.md.",
            p.name, p.fp32, p.bf16
        ),
        10.0,
        "start",
        "#333",
        false,
    );
    s.text(
        left,
        legend_y + 21.0,
        "Data: benches/results/gemm_ladder_4096.json. Regenerate with `cargo xtask figures`.",
        10.0,
        "start",
        "#333",
        false,
    );
    s.finish()
}

/// The roofline of the ladder's card (log-log), with the best kernel of each rung at the intensity of
/// an ideal GEMM of the ladder's shape (each matrix through DRAM once).
pub fn roofline_svg(l: &Ladder, p: &Peaks) -> String {
    let (m, n, k) = l.shape;
    let (mf, nf, kf) = (m as f64, n as f64, k as f64);
    let flops = 2.0 * mf * nf * kf;
    let ai_f32 = flops / (4.0 * (mf * kf + kf * nf + mf * nf));
    let ai_16 = flops / (2.0 * (mf * kf + kf * nf) + 4.0 * mf * nf);
    let (w, h, ox, oy, pw, ph) = (860.0, 560.0, 80.0, 56.0, 700.0, 400.0);
    let (xmin, xmax, ymin, ymax) = (-1.0f64, 4.0f64, -1.0f64, 3.5f64);
    let x = |v: f64| ox + (v.log10() - xmin) / (xmax - xmin) * pw;
    let y = |v: f64| oy + ph - (v.log10() - ymin) / (ymax - ymin) * ph;
    let mut s = Svg::new(w, h);
    s.text(
        w / 2.0,
        22.0,
        &format!("Roofline of the {} ({} TB/s) with the ladder at {m} x {n} x {k}", p.name, p.hbm),
        14.0,
        "middle",
        "#000",
        true,
    );
    s.text(w / 2.0, 40.0, &provenance(l), 11.0, "middle", "#333", false);
    for e in -1..=4 {
        let v = 10f64.powi(e);
        s.line(x(v), oy, x(v), oy + ph, "#e4e4e4", 1.0, None);
        s.text(x(v), oy + ph + 15.0, &format!("{v}"), 10.0, "middle", "#333", false);
    }
    for e in -1..=3 {
        let v = 10f64.powi(e);
        s.line(ox, y(v), ox + pw, y(v), "#e4e4e4", 1.0, None);
        s.text(ox - 5.0, y(v) + 4.0, &format!("{v}"), 10.0, "end", "#333", false);
    }
    s.text(
        ox + pw / 2.0,
        oy + ph + 34.0,
        "arithmetic intensity (FLOP per byte of DRAM traffic)",
        11.0,
        "middle",
        "#000",
        false,
    );
    s.rotated_text(ox - 45.0, oy + ph / 2.0, "TFLOP/s", 11.0, -90.0, "#000");
    for (peak, color, name) in [(p.fp32, BLUE, "FP32"), (p.bf16, GREEN, "bf16 dense")] {
        let ridge = peak / p.hbm;
        s.line(x(0.1), y(0.1 * p.hbm), x(ridge), y(peak), "#000", 1.5, None);
        s.line(x(ridge), y(peak), x(10f64.powf(xmax)), y(peak), color, 2.0, None);
        s.line(x(ridge), y(peak), x(ridge), oy + ph, color, 1.0, Some("3,3"));
        s.text(
            x(10f64.powf(xmax)) - 4.0,
            y(peak) - 6.0,
            &format!("{name} peak {peak} TFLOP/s"),
            10.5,
            "end",
            color,
            false,
        );
        s.text(x(ridge) + 4.0, oy + ph - 6.0, &format!("ridge {ridge:.1}"), 10.0, "start", color, false);
    }
    // the bandwidth roof's label, along the slope
    let angle = -(ph / (ymax - ymin)).atan2(pw / (xmax - xmin)).to_degrees();
    let (lx, ly) = (x(0.5), y(0.5 * p.hbm) - 10.0);
    s.rotated_text(lx, ly, &format!("HBM {} TB/s", p.hbm), 10.5, angle, "#000");
    // best kernel per rung, labels stacked to the left of the points
    for (ai, fp32, color) in [(ai_f32, true, BLUE), (ai_16, false, GREEN)] {
        let mut best: Vec<(f64, u64, &str)> = Vec::new();
        for r in l.rows.iter().filter(|r| r.fp32() == fp32) {
            let Some(t) = r.tflops else { continue };
            match best.iter_mut().find(|b| b.1 == r.rung) {
                Some(b) if b.0 >= t => {}
                Some(b) => *b = (t, r.rung, &r.kernel),
                None => best.push((t, r.rung, &r.kernel)),
            }
        }
        best.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut last = f64::NEG_INFINITY;
        for (t, rung, kernel) in best {
            s.circle(x(ai), y(t), 4.0, color);
            let ly = y(t).max(last + 12.0);
            last = ly;
            s.line(x(ai) - 5.0, y(t), x(ai) - 40.0, ly, "#999", 0.6, None);
            s.text(x(ai) - 43.0, ly + 4.0, &format!("rung {rung}: {} ({kernel})", fmt_t(t)), 9.5, "end", "#000", false);
        }
    }
    s.rect(ox, oy, pw, ph, "none", "#000");
    let notes = [
        format!(
            "Points: the fastest kernel of each rung, at the intensity of an ideal GEMM (each matrix through DRAM once): \
             {ai_f32:.0} FLOP/byte for f32"
        ),
        format!(
            "operands, {ai_16:.0} for 16-bit inputs and an f32 output. Both lie right of the ridges, so the distance to \
             the flat roof is the kernel's own."
        ),
        "Data: benches/results/gemm_ladder_4096.json; peaks: guide/figures-src/peaks.json. `cargo xtask figures`."
            .to_string(),
    ];
    for (i, t) in notes.iter().enumerate() {
        s.text(40.0, oy + ph + 62.0 + 15.0 * i as f64, t, 10.5, "start", "#333", false);
    }
    s.finish()
}

/// Every figure this task writes: (path under the workspace, its SVG).
pub fn generate(ws: &Path) -> Res<Vec<(PathBuf, String)>> {
    let l = ladder(&read_json(ws, LADDER_JSON)?)?;
    let p = peaks_for(&read_json(ws, PEAKS_JSON)?, &l.device)?;
    let out = Path::new(OUT_DIR);
    Ok(vec![(out.join("ladder-4096.svg"), ladder_svg(&l, &p)), (out.join("roofline.svg"), roofline_svg(&l, &p))])
}

/// Writes the figures (or, with `check`, fails where a committed one differs).
pub fn figures(ws: &Path, check: bool) -> Res<()> {
    let mut stale = Vec::new();
    for (rel, svg) in generate(ws)? {
        let path = ws.join(&rel);
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        if check {
            if old != svg {
                stale.push(rel.display().to_string());
            }
        } else if old != svg {
            std::fs::write(&path, svg).map_err(|e| format!("writing {}: {e}", path.display()))?;
            println!("wrote {}", rel.display());
        } else {
            println!("unchanged {}", rel.display());
        }
    }
    if stale.is_empty() {
        Ok(())
    } else {
        Err(format!("figures differ from their data (run `cargo xtask figures`): {}", stale.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_figures_are_what_their_json_gives() {
        let ws = crate::workspace();
        figures(&ws, true).unwrap();
    }

    #[test]
    fn the_recorded_ladder_parses_and_its_peaks_are_found() {
        let ws = crate::workspace();
        let l = ladder(&read_json(&ws, LADDER_JSON).unwrap()).unwrap();
        assert_eq!(l.shape, (4096, 4096, 4096));
        assert!(l.rows.iter().any(|r| r.kernel == "sgemm_naive" && r.fp32() && r.tflops.is_some()));
        assert!(l.rows.iter().any(|r| r.kernel == "gemm_tcgen05_bf16" && r.tflops.is_none()));
        let p = peaks_for(&read_json(&ws, PEAKS_JSON).unwrap(), &l.device).unwrap();
        assert!(p.bf16 > p.fp32 && p.hbm > 0.0);
        // every figure is well-formed enough to open and close one svg element
        for (_, svg) in generate(&ws).unwrap() {
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
            assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        }
    }
}
