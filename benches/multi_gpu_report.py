"""Joins the multi-GPU benchmarks of one device call into benches/results/multi_gpu.{json,md}.

    bin/kiln allreduce --bytes 1073741824 --gpus 2 --json ar_kiln.json
    python3 benches/torch_allreduce.py --bytes 1073741824 --gpus 2 --json ar_torch.json
    bin/kiln dist-bench --gpus 2 --json dist.json
    bin/kiln dist-bench --gpus 2 --no-overlap --json dist_no_overlap.json      (optional)
    bin/kiln dist-bench --gpus 2 --zero1 --json dist_zero1.json                (optional)
    python3 benches/torch_ddp.py --gpus 1 --json ddp1.json
    python3 benches/torch_ddp.py --gpus 2 --json ddp2.json
    python3 benches/multi_gpu_report.py --kiln-allreduce ar_kiln.json --torch-allreduce ar_torch.json \\
        --kiln-dist dist.json [--kiln-dist-no-overlap dist_no_overlap.json] [--kiln-dist-zero1 dist_zero1.json] \\
        --torch-ddp-1 ddp1.json --torch-ddp-n ddp2.json --device "2 x NVIDIA H100 ..." --commit abc1234 \\
        [--out benches/results]

Writes `multi_gpu.json` as {"device", "date", "commit", "command", "rows": [{"case", "kiln_ms",
"reference", "reference_ms", ...}], "timeline": [...]} and `multi_gpu.md` with the same rows, the
scaling, and the timeline of one kiln step (compute and communication streams) as a table and as
text lanes. Inputs that are not given leave their rows out; nothing is made up.
"""

import argparse
import datetime
import json
import os


def load(path):
    if not path:
        return None
    with open(path) as f:
        return json.load(f)


def lanes(timeline, columns=72):
    """Text lanes of one step: '#' where the compute stream is in the backward pass, '=' where the
    communication stream runs a collective, '-' otherwise."""
    if not timeline:
        return []
    end = max(e["ms"] for e in timeline) or 1.0
    col = lambda ms: min(columns - 1, int(ms / end * columns))
    compute = ["-"] * columns
    comm = [" "] * columns
    at = {(e["stream"], e["label"]): e["ms"] for e in timeline}
    b0, b1 = at.get(("compute", "backward start")), at.get(("compute", "backward end"))
    if b0 is not None and b1 is not None:
        for c in range(col(b0), col(b1) + 1):
            compute[c] = "#"
    for e in timeline:
        if e["stream"] == "comm" and e["label"].endswith(" start"):
            name = e["label"][: -len(" start")]
            stop = at.get(("comm", name + " end"))
            if stop is not None:
                for c in range(col(e["ms"]), col(stop) + 1):
                    comm[c] = "="
    return [
        f"compute |{''.join(compute)}| {end:.3f} ms",
        f"comm    |{''.join(comm)}|",
        "         ('#' backward pass, '=' a collective on the communication stream)",
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kiln-allreduce")
    p.add_argument("--torch-allreduce")
    p.add_argument("--kiln-dist", required=True)
    p.add_argument("--kiln-dist-no-overlap")
    p.add_argument("--kiln-dist-zero1")
    p.add_argument("--torch-ddp-1")
    p.add_argument("--torch-ddp-n")
    p.add_argument("--device", required=True, help="the machine, in words")
    p.add_argument("--commit", required=True)
    p.add_argument("--command", default="", help="the commands run (default: a summary of the inputs)")
    p.add_argument("--out", default="benches/results")
    a = p.parse_args()

    kar, tar = load(a.kiln_allreduce), load(a.torch_allreduce)
    kd, kno, kz = load(a.kiln_dist), load(a.kiln_dist_no_overlap), load(a.kiln_dist_zero1)
    t1, tn = load(a.torch_ddp_1), load(a.torch_ddp_n)
    n = kd["gpus"]
    model = f"MLP {kd['batch']}x{kd['width']}x{kd['layers']} per GPU"
    for t in (t1, tn):
        if t and (t["batch"], t["width"], t["layers"]) != (kd["batch"], kd["width"], kd["layers"]):
            raise SystemExit(f"torch_ddp ran {t['batch']}x{t['width']}x{t['layers']}, kiln {model}: not the same model")

    rows = []
    if kar:
        row = {
            "case": f"all-reduce f32 sum, {kar['bytes'] >> 20} MiB, {kar['gpus']} GPUs",
            "kiln_ms": round(kar["ms"], 4),
            "kiln_busbw_gbs": round(kar["busbw_gbs"], 1),
            "reference": "torch.distributed all_reduce (NCCL), same call" if tar else None,
            "reference_ms": round(tar["ms"], 4) if tar else None,
        }
        if tar:
            row["reference_busbw_gbs"] = round(tar["busbw_gbs"], 1)
            row["ratio_bandwidth"] = round(kar["busbw_gbs"] / tar["busbw_gbs"], 4)
        rows.append(row)
    rows.append(
        {
            "case": f"{model}, 1 GPU, step",
            "kiln_ms": round(kd["ms_one"], 4),
            "reference": "PyTorch f32 eager, no DDP (torch_ddp.py --gpus 1)" if t1 else None,
            "reference_ms": round(t1["ms"], 4) if t1 else None,
        }
    )
    rows.append(
        {
            "case": f"{model}, {n} GPUs, step (buckets overlapped with the backward pass)",
            "kiln_ms": round(kd["ms_many"], 4),
            "reference": "PyTorch DDP f32 (25 MB buckets, overlapped)" if tn else None,
            "reference_ms": round(tn["ms"], 4) if tn else None,
            "ratio": round(kd["ms_many"] / tn["ms"], 4) if tn else None,
        }
    )
    scaling = {
        "case": f"{model}, throughput on {n} GPUs over 1 GPU",
        "kiln_ms": round(kd["ms_many"], 4),
        "kiln_scaling": round(kd["scaling"], 4),
        "reference": "PyTorch DDP over PyTorch on 1 GPU" if (t1 and tn) else None,
        "reference_ms": round(tn["ms"], 4) if tn else None,
    }
    if t1 and tn:
        scaling["reference_scaling"] = round(tn["rows_per_s"] / t1["rows_per_s"], 4)
    rows.append(scaling)
    for extra, what in ((kno, "gradients reduced after the backward pass"), (kz, "ZeRO-1")):
        if extra:
            rows.append(
                {
                    "case": f"{model}, {n} GPUs, step ({what})",
                    "kiln_ms": round(extra["ms_many"], 4),
                    "kiln_scaling": round(extra["scaling"], 4),
                    "reference": "kiln, buckets overlapped (row above)",
                    "reference_ms": round(kd["ms_many"], 4),
                }
            )
    timeline_row = {
        "case": f"{model}, {n} GPUs, one step on rank 0: backward / collectives / collectives during the backward",
        "kiln_ms": round(kd["ms_many"], 4),
        "backward_ms": round(kd["backward_ms"], 4),
        "comm_ms": round(kd["comm_ms"], 4),
        "comm_hidden_ms": round(kd["comm_hidden_ms"], 4),
        "reference": None,
        "reference_ms": None,
    }
    rows.append(timeline_row)

    command = a.command or "; ".join(
        x
        for x in [
            a.kiln_allreduce and "bin/kiln allreduce --json",
            a.torch_allreduce and "python3 benches/torch_allreduce.py --json",
            "bin/kiln dist-bench --json",
            a.kiln_dist_no_overlap and "bin/kiln dist-bench --no-overlap --json",
            a.kiln_dist_zero1 and "bin/kiln dist-bench --zero1 --json",
            a.torch_ddp_1 and "python3 benches/torch_ddp.py --gpus 1 --json",
            a.torch_ddp_n and f"python3 benches/torch_ddp.py --gpus {n} --json",
        ]
        if x
    )
    out = {
        "device": a.device,
        "date": datetime.date.today().isoformat(),
        "commit": a.commit,
        "command": command,
        "rows": rows,
        "timeline": kd["timeline"],
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "multi_gpu.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")

    fmt = lambda v, unit=" ms": "-" if v is None else f"{v:.3f}{unit}"
    md = [
        "# Multi-GPU (issue 33)",
        "",
        f"{a.device}, {out['date']}, commit {a.commit}. Commands: `{command}`.",
        "",
        "| case | kiln | reference (same call) | reference |",
        "| --- | ---: | --- | ---: |",
    ]
    for r in rows:
        kiln = fmt(r["kiln_ms"])
        if "kiln_busbw_gbs" in r:
            kiln += f", busbw {r['kiln_busbw_gbs']} GB/s"
        if "kiln_scaling" in r:
            kiln = f"{r['kiln_scaling']:.3f}x ({fmt(r['kiln_ms'])} a step)"
        if "comm_hidden_ms" in r:
            kiln = f"{r['backward_ms']:.3f} / {r['comm_ms']:.3f} / {r['comm_hidden_ms']:.3f} ms"
        ref = fmt(r["reference_ms"])
        if "reference_busbw_gbs" in r:
            ref += f", busbw {r['reference_busbw_gbs']} GB/s ({r['ratio_bandwidth']:.3f} of it)"
        if "reference_scaling" in r:
            ref = f"{r['reference_scaling']:.3f}x ({fmt(r['reference_ms'])} a step)"
        if r.get("ratio") is not None:
            ref += f" (kiln {r['ratio']:.3f}x of it)"
        md.append(f"| {r['case']} | {kiln} | {r['reference'] or '-'} | {ref} |")
    md += [
        "",
        f"## One step on {n} GPUs (rank 0, CUDA events, ms from the forward's start)",
        "",
        "```",
        *lanes(kd["timeline"]),
        "```",
        "",
        "| ms | stream | event |",
        "| ---: | --- | --- |",
    ]
    md += [f"| {e['ms']:.3f} | {e['stream']} | {e['label']} |" for e in kd["timeline"]]
    md += ["", "No multi-host run was possible here: every number above comes from one machine.", ""]
    with open(os.path.join(a.out, "multi_gpu.md"), "w") as f:
        f.write("\n".join(md))
    print(f"wrote {a.out}/multi_gpu.json and {a.out}/multi_gpu.md")


if __name__ == "__main__":
    main()
