#!/usr/bin/env python3
"""Converts a `kiln gemm --ladder` table printed before `--json` existed into the JSON that
`kiln gemm --ladder --json PATH` writes (and `cargo xtask figures` reads). Used once, for run 205:

    python3 guide/figures-src/ladder_txt_to_json.py \
        benches/results/raw/issue34-run205-ladder-4096.txt benches/results/gemm_ladder_4096.json \
        --date 2026-11-28 --commit 832a497 --run 205 \
        --command "bin/kiln gemm --ladder --shape 4096x4096x4096"

The values are the table's, as printed (rounded to its digits); `ms` and `tflops` are not
recomputed. Standard library only.
"""

import argparse
import json
import re

ap = argparse.ArgumentParser()
ap.add_argument("txt")
ap.add_argument("out")
ap.add_argument("--date", required=True)
ap.add_argument("--commit", required=True)
ap.add_argument("--run", type=int, required=True)
ap.add_argument("--command", required=True)
a = ap.parse_args()

text = open(a.txt).read()
dev = re.search(r"^device: (.*) \(compute capability (\S+), module (\S+)\)$", text, re.M)
prod = re.search(r"^product: (\d+)x(\d+)x(\d+), .*\(seed (\d+)\), median of (\d+) launches$", text, re.M)
skipped = dict(re.findall(r"^- `(\w+)`: (.*)$", text, re.M))


def num(s):
    return float(s) if s else None


rows = []
for line in text.splitlines():
    if not re.match(r"^\|\s+\d+ \|", line):
        continue
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    rung, kernel, err, bound, check, ms, tf, cub, cub_tf, ratio = c
    kernel = kernel.strip("`")
    row = {"rung": int(rung), "kernel": kernel, "cublas": cub or None}
    if check == "skipped":
        row["status"] = "skipped"
        row["reason"] = skipped[kernel]
    else:
        row.update(
            status="ok" if check == "ok" else "failed_check",
            ms=num(ms),
            tflops=num(tf),
            cublas_tflops=num(cub_tf),
            ratio=num(ratio),
            max_err=num(err),
            bound=num(bound),
        )
    rows.append(row)

doc = {
    "device": dev[1],
    "compute_capability": dev[2],
    "module": dev[3],
    "date": a.date,
    "commit": a.commit,
    "command": a.command,
    "run": a.run,
    "source": f"{a.txt}, converted by guide/figures-src/ladder_txt_to_json.py (values as printed)",
    "shape": {"m": int(prod[1]), "n": int(prod[2]), "k": int(prod[3])},
    "reps": int(prod[5]),
    "seed": int(prod[4]),
    "cublas": None,
    "notes": [],
    "rows": rows,
}
with open(a.out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print("wrote", a.out, len(rows), "rows")
