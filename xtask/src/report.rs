//! `cargo xtask bench-report`: turns the JSON the GPU benches write into the Markdown table and the
//! SVG plot recorded under `benches/results/`.

use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

type Res<T> = Result<T, String>;

fn read(path: &Path) -> Res<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// One GEMM measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmRow {
    /// Problem shape.
    pub mnk: (u64, u64, u64),
    /// Kernel name.
    pub kernel: String,
    /// TFLOP/s.
    pub tflops: f64,
    /// cuBLAS TFLOP/s in the same run.
    pub cublas: f64,
}

/// Parses `benches/gemm.rs`'s JSON.
pub fn gemm_rows(v: &Value) -> Res<Vec<GemmRow>> {
    let rows = v["results"].as_array().ok_or("no `results` array")?;
    rows.iter()
        .map(|r| {
            let num = |k: &str| r[k].as_f64().ok_or_else(|| format!("result without `{k}`: {r}"));
            Ok(GemmRow {
                mnk: (num("m")? as u64, num("n")? as u64, num("k")? as u64),
                kernel: r["kernel"].as_str().ok_or("result without `kernel`")?.to_string(),
                tflops: num("tflops")?,
                cublas: num("cublas_tflops")?,
            })
        })
        .collect()
}

/// The Markdown table: one row per shape and kernel, with the ratio to cuBLAS.
pub fn gemm_markdown(device: &str, rows: &[GemmRow], command: &str, date: &str) -> String {
    let mut s = format!("# GEMM on {device}\n\n{date}, `{command}`; cuBLAS measured in the same process.\n\n");
    s += "| m x n x k | kernel | TFLOP/s | cuBLAS TFLOP/s | ratio |\n| --- | --- | ---: | ---: | ---: |\n";
    for r in rows {
        let (m, n, k) = r.mnk;
        s += &format!(
            "| {m} x {n} x {k} | {} | {:.1} | {:.1} | {:.2} |\n",
            r.kernel,
            r.tflops,
            r.cublas,
            r.tflops / r.cublas
        );
    }
    s
}

/// The SVG plot: TFLOP/s against m (square problems), one line per kernel plus cuBLAS.
pub fn gemm_plot(rows: &[GemmRow], out: &Path) -> Res<()> {
    let square: Vec<&GemmRow> = rows.iter().filter(|r| r.mnk.0 == r.mnk.1 && r.mnk.1 == r.mnk.2).collect();
    if square.is_empty() {
        return Err("no square problems to plot".into());
    }
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &square {
        series.entry(r.kernel.clone()).or_default().push((r.mnk.0 as f64, r.tflops));
        let fp32 = r.kernel.starts_with("sgemm");
        let name = if fp32 { "cuBLAS SGEMM" } else { "cuBLAS bf16" };
        let e = series.entry(name.to_string()).or_default();
        if !e.iter().any(|(x, _)| *x == r.mnk.0 as f64) {
            e.push((r.mnk.0 as f64, r.cublas));
        }
    }
    let xmax = square.iter().map(|r| r.mnk.0).max().unwrap_or(1) as f64 * 1.1;
    let ymax = series.values().flatten().map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let root = SVGBackend::new(out, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption("kiln GEMM ladder vs cuBLAS", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax.max(1.0))
        .map_err(|e| e.to_string())?;
    chart.configure_mesh().x_desc("m = n = k").y_desc("TFLOP/s").draw().map_err(|e| e.to_string())?;
    for (i, (name, mut pts)) in series.into_iter().enumerate() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Writes `gemm.md` and `gemm.svg` for the bench JSON at `input` into `out_dir`.
pub fn gemm_report(input: &Path, out_dir: &Path, command: &str, date: &str) -> Res<()> {
    let v = read(input)?;
    let rows = gemm_rows(&v)?;
    let device = v["device"].as_str().unwrap_or("unknown device");
    std::fs::create_dir_all(out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let md = out_dir.join("gemm.md");
    std::fs::write(&md, gemm_markdown(device, &rows, command, date)).map_err(|e| format!("{}: {e}", md.display()))?;
    gemm_plot(&rows, &out_dir.join("gemm.svg"))?;
    println!("wrote {} and {}", md.display(), out_dir.join("gemm.svg").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_from_bench_json() {
        let v: Value = serde_json::from_str(
            r#"{"device":"TEST GPU","results":[
            {"m":1024,"n":1024,"k":1024,"kernel":"sgemm_naive","ms":1.0,"tflops":1.5,"cublas_tflops":20.0},
            {"m":2048,"n":2048,"k":2048,"kernel":"sgemm_naive","ms":1.0,"tflops":1.4,"cublas_tflops":40.0},
            {"m":4096,"n":1024,"k":4096,"kernel":"sgemm_naive","ms":1.0,"tflops":1.3,"cublas_tflops":45.0}]}"#,
        )
        .unwrap();
        let rows = gemm_rows(&v).unwrap();
        assert_eq!(rows.len(), 3);
        let md = gemm_markdown("TEST GPU", &rows, "cargo bench --bench gemm", "2026-11-21");
        assert!(md.contains("| 1024 x 1024 x 1024 | sgemm_naive | 1.5 | 20.0 | 0.07 |"), "{md}");
        let dir = std::env::temp_dir().join(format!("kiln-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = dir.join("g.svg");
        gemm_plot(&rows, &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("<svg") && text.contains("cuBLAS SGEMM") && text.contains("sgemm_naive"));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(gemm_rows(&serde_json::json!({"results": [{"m": 1}]})).is_err());
    }
}
