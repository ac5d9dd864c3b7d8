#!/usr/bin/env python3
"""Assembles benches/results/attention.{json,md} from one device call's outputs.

Inputs: KILN_TXT, the concatenated output of `kiln attention --kernel K --shape BxHxSxD [--causal]
[--backward] --reps N` runs, each preceded by a header line `== K SHAPE [--causal]`; and
TORCH_JSON, what benches/torch_attention.py wrote in the same call. One row per case, direction
(forward; forward+backward where kiln ran `--backward`, named by the forward kernel and the backward
kernel the run printed: `flash_fwd_wgmma_bf16 + Wgmma2 backward`) and kernel; `ratio_time` is kiln ms over
PyTorch ms (<= 1.0 meets issue 35's target).

Usage: python3 benches/attention_report.py KILN_TXT TORCH_JSON --date D --commit C --command CMD
       [--run NAME] [--out benches/results/attention] [--notes benches/results/attention.notes.md]
"""
import argparse
import json
import re


def parse_kiln(path):
    """[(kernel, shape, causal, {fwd_ms, fwd_tflops, bwd_ms, bwd_tflops, check, bwd_check})]."""
    runs, cur = [], None
    for line in open(path):
        m = re.match(r"== (\S+) (\d+)x(\d+)x(\d+)x(\d+)\s*(--causal)?", line)
        if m:
            cur = {"kernel": m.group(1), "shape": tuple(int(m.group(i)) for i in range(2, 6)), "causal": bool(m.group(6))}
            runs.append(cur)
            continue
        if cur is None:
            continue
        if m := re.search(r"^\s*error: (.*)", line):
            cur["check"] = m.group(1).strip()
        elif m := re.search(r"backward error: (.*)", line):
            cur["bwd_check"] = m.group(1).strip()
        elif m := re.search(r"backward kernel: (\S+)", line):
            cur["bwd_kernel"] = m.group(1)
        elif m := re.search(r"backward time: ([\d.]+) ms \(median\), ([\d.]+) TFLOP/s", line):
            cur["bwd_ms"], cur["bwd_tflops"] = float(m.group(1)), float(m.group(2))
        elif m := re.search(r"^\s*time: ([\d.]+) ms \(median\), ([\d.]+) TFLOP/s", line):
            cur["fwd_ms"], cur["fwd_tflops"] = float(m.group(1)), float(m.group(2))
    return runs


def case_name(shape, causal, direction):
    b, h, s, d = shape
    return f"B{b} H{h} S{s} D{d}{' causal' if causal else ''} {direction}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln")
    ap.add_argument("torch")
    ap.add_argument("--date", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--run", default="")
    ap.add_argument("--out", default="benches/results/attention")
    ap.add_argument("--notes", help="a Markdown file appended after the table (where the time goes: ncu)")
    a = ap.parse_args()
    torch = json.load(open(a.torch))
    ref = {r["case"]: r for r in torch["rows"]}
    rows = []
    for r in parse_kiln(a.kiln):
        if "fwd_ms" not in r:
            continue
        b, h, s, d = r["shape"]
        flops = 4 * b * h * s * s * d / (2 if r["causal"] else 1)
        dirs = [("forward", r["fwd_ms"], flops, r.get("check", ""), r["kernel"])]
        if "bwd_ms" in r:
            # the backward kernel the run printed (Wgmma2, Wgmma, MmaSync, Simt), beside the forward's name
            kernel = r["kernel"] + (" + " + r["bwd_kernel"] + " backward" if "bwd_kernel" in r else "")
            dirs.append(("forward+backward", r["fwd_ms"] + r["bwd_ms"], 3.5 * flops, r.get("bwd_check", "not checked (size)"), kernel))
        for direction, ms, fl, check, kernel in dirs:
            case = case_name(r["shape"], r["causal"], direction)
            t = ref.get(case)
            rows.append({
                "case": case,
                "kernel": kernel,
                "kiln_ms": round(ms, 4),
                "kiln_tflops": round(fl / ms / 1e9, 1),
                "reference": "torch sdpa bf16",
                "reference_ms": t["ms"] if t else None,
                "reference_tflops": t["tflops"] if t else None,
                "ratio_time": ms / t["ms"] if t else None,
                "check": check,
            })
    out = {"device": torch["device"], "date": a.date, "commit": a.commit, "torch": torch["torch"],
           "command": a.command, "rows": rows}
    with open(a.out + ".json", "w") as fh:
        json.dump(out, fh, indent=1)
    with open(a.out + ".md", "w") as fh:
        fh.write("# Attention against PyTorch SDPA (issue 35)\n\n")
        fh.write(f"{torch['device']}, {a.date}, commit {a.commit}, PyTorch {torch['torch']}{', ' + a.run if a.run else ''}; "
                 f"`{a.command}`. bf16 in and out. TFLOP/s count 4 B H S^2 D for the forward (halved when causal) and "
                 "3.5x that for forward+backward (kiln: its forward plus its backward, timed separately, medians). "
                 "ratio = kiln ms / PyTorch ms (<= 1.0 meets the issue's target). `check` is kiln's error against the "
                 "f64 reference as `kiln attention` printed it (the backward is checked only up to a size).\n\n")
        fh.write("| case | kiln kernel | kiln ms | kiln TFLOP/s | SDPA ms | SDPA TFLOP/s | ratio |\n")
        fh.write("| --- | --- | ---: | ---: | ---: | ---: | ---: |\n")
        for r in rows:
            sd = f"{r['reference_ms']:.3f} | {r['reference_tflops']:.0f} | {r['ratio_time']:.2f}" if r["reference_ms"] else "- | - | -"
            fh.write(f"| {r['case']} | `{r['kernel']}` | {r['kiln_ms']:.3f} | {r['kiln_tflops']:.1f} | {sd} |\n")
        if a.notes:
            fh.write("\n" + open(a.notes).read())
    print(f"wrote {a.out}.json and {a.out}.md ({len(rows)} rows)")


if __name__ == "__main__":
    main()
