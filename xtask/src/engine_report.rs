//! `cargo xtask engine-report`: joins `benches/engine_step`'s JSON (kiln) with
//! `benches/torch_engine_step.py`'s (PyTorch, same run) into `engine_step.json` and `engine_step.md`:
//! one row per model, dtype and mode, kiln's ms per step against the PyTorch variant of the same
//! case, as the ratio issue 31 sets its targets in (kiln / PyTorch; <= 1.0 meets it), and the peak
//! device memory of both.

use serde_json::{Value, json};
use std::path::Path;

type Res<T> = Result<T, String>;

fn read(path: &Path) -> Res<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn rows(v: &Value, what: &Path) -> Res<Vec<Value>> {
    v["rows"].as_array().cloned().ok_or_else(|| format!("{}: no \"rows\" array", what.display()))
}

/// The joined rows: for each kiln row, the PyTorch row of the same model, dtype and mode.
pub fn join(kiln: &Value, torch: &Value) -> Res<Vec<Value>> {
    let (k, t) = (rows(kiln, Path::new("kiln"))?, rows(torch, Path::new("torch"))?);
    let key = |r: &Value| (r["model"].clone(), r["dtype"].clone(), r["mode"].clone());
    k.iter()
        .map(|r| {
            let case = format!(
                "{} {} {}",
                r["model"].as_str().unwrap_or("?"),
                r["dtype"].as_str().unwrap_or("?"),
                r["mode"].as_str().unwrap_or("?")
            );
            let p = t.iter().find(|p| key(p) == key(r)).ok_or_else(|| format!("no PyTorch row for {case}"))?;
            let ratio = match (r["ms"].as_f64(), p["ms"].as_f64()) {
                (Some(a), Some(b)) if b > 0.0 => json!(a / b),
                _ => Value::Null,
            };
            Ok(json!({
                "case": case,
                "kiln_ms": r["ms"],
                "reference": p["reference"],
                "reference_ms": p["ms"],
                "ratio": ratio,
                "kiln_path": r["kiln_path"],
                "kiln_peak_bytes": r["peak_bytes"],
                "reference_peak_bytes": p["peak_bytes"],
                "note": r["note"],
            }))
        })
        .collect()
}

fn ms(v: &Value) -> String {
    v.as_f64().map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into())
}

fn mib(v: &Value) -> String {
    v.as_f64().map(|x| format!("{:.1}", x / (1u64 << 20) as f64)).unwrap_or_else(|| "-".into())
}

/// The Markdown table of the joined rows.
pub fn markdown(device: &str, date: &str, commit: &str, command: &str, rows: &[Value]) -> String {
    let mut s = format!(
        "# The engine's training step against PyTorch (issue 31)\n\n{device}, {date}, commit {commit}, `{command}`. \
         ms per SGD step (median); ratio = kiln / PyTorch (<= 1.0 meets the target); peak device memory \
         in MiB (kiln: the stream-ordered pool's high-water mark; PyTorch: `max_memory_allocated`).\n\n\
         | case | kiln ms | PyTorch | PyTorch ms | ratio | kiln MiB | PyTorch MiB | kiln runs it as |\n\
         | --- | ---: | --- | ---: | ---: | ---: | ---: | --- |\n"
    );
    for r in rows {
        let note = r["note"].as_str().filter(|n| !n.is_empty()).map(|n| format!(" ({n})")).unwrap_or_default();
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {}{note} |\n",
            r["case"].as_str().unwrap_or("?"),
            ms(&r["kiln_ms"]),
            r["reference"].as_str().unwrap_or("?"),
            ms(&r["reference_ms"]),
            r["ratio"].as_f64().map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into()),
            mib(&r["kiln_peak_bytes"]),
            mib(&r["reference_peak_bytes"]),
            r["kiln_path"].as_str().unwrap_or("?"),
        );
    }
    s
}

/// Writes `engine_step.json` and `engine_step.md` into `out_dir` (the table, then the hand-written
/// analysis in `engine_step.notes.md` there, if any).
pub fn engine_report(kiln: &Path, torch: &Path, out_dir: &Path, command: &str, date: &str, commit: &str) -> Res<()> {
    let (k, t) = (read(kiln)?, read(torch)?);
    let rows = join(&k, &t)?;
    let device = k["device"].as_str().unwrap_or("?").to_string();
    let doc = json!({"device": device, "date": date, "commit": commit, "command": command,
        "torch": t["torch"], "rows": rows});
    std::fs::create_dir_all(out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let j = out_dir.join("engine_step.json");
    std::fs::write(&j, serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n")
        .map_err(|e| format!("{}: {e}", j.display()))?;
    let m = out_dir.join("engine_step.md");
    // the measured analysis of where the time goes, written by hand beside the table, follows it
    let notes = std::fs::read_to_string(out_dir.join("engine_step.notes.md")).unwrap_or_default();
    let text = markdown(&device, date, commit, command, &rows);
    let text = if notes.is_empty() { text } else { format!("{text}\n{notes}") };
    std::fs::write(&m, text).map_err(|e| format!("{}: {e}", m.display()))?;
    println!("wrote {} and {}", j.display(), m.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_by_model_dtype_and_mode_and_refuses_a_missing_reference() {
        let kiln = json!({"device": "GPU", "rows": [
            {"model": "64x256x4", "dtype": "f32", "mode": "eager", "ms": 0.3, "peak_bytes": 1048576, "kiln_path": "p", "note": ""},
            {"model": "64x256x4", "dtype": "f32", "mode": "graph", "ms": null, "peak_bytes": 0, "kiln_path": "p", "note": "refused"}]});
        let torch = json!({"rows": [
            {"model": "64x256x4", "dtype": "f32", "mode": "graph", "ms": 0.1, "reference": "torch f32 graph", "peak_bytes": 2},
            {"model": "64x256x4", "dtype": "f32", "mode": "eager", "ms": 0.15, "reference": "torch f32 eager", "peak_bytes": 2}]});
        let rows = join(&kiln, &torch).unwrap();
        assert_eq!(rows[0]["reference"], "torch f32 eager");
        assert!((rows[0]["ratio"].as_f64().unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(rows[1]["ratio"], Value::Null);
        let md = markdown("GPU", "2026-11-28", "abc", "cmd", &rows);
        assert!(md.contains("| 64x256x4 f32 eager | 0.300 | torch f32 eager | 0.150 | 2.00 | 1.0 |"), "{md}");
        assert!(md.contains("(refused)"), "{md}");
        let torch_missing = json!({"rows": []});
        assert!(join(&kiln, &torch_missing).unwrap_err().contains("no PyTorch row for 64x256x4 f32 eager"));
    }
}
