"""PyTorch on the same shapes as benches/tensor_ops.rs, for the comparison in the same run.

Usage: python3 benches/torch_tensor_ops.py [out.json]
"""
import json
import sys

import torch
import torch.nn.functional as F

ROWS, COLS, REPS = 16384, 4096, 20
BATCH = 5  # calls per timed sample, as benches/tensor_ops.rs


def time_ms(f):
    f(); f()
    torch.cuda.synchronize()
    ms = []
    for _ in range(REPS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(BATCH):
            f()
        e.record(); e.synchronize()
        ms.append(s.elapsed_time(e) / BATCH)
    return sorted(ms)[REPS // 2]


def main():
    x = torch.randn(ROWS, COLS, device="cuda")
    y = torch.randn(ROWS, COLS, device="cuda")
    w, b = torch.ones(COLS, device="cuda"), torch.zeros(COLS, device="cuda")
    t = (torch.arange(ROWS, device="cuda") * 31) % COLS
    dst = torch.empty_like(x)
    nbytes = x.numel() * 4
    copy = time_ms(lambda: dst.copy_(x))
    copy_gbs = 2 * nbytes / copy / 1e6
    ops = [
        ("add", 3 * nbytes, lambda: x + y),
        ("relu", 2 * nbytes, lambda: torch.relu(x)),
        ("softmax", 2 * nbytes, lambda: torch.softmax(x, -1)),
        ("layer_norm", 2 * nbytes, lambda: F.layer_norm(x, (COLS,), w, b, 1e-5)),
        ("cross_entropy", nbytes, lambda: F.cross_entropy(x, t)),
    ]
    res = {"device": torch.cuda.get_device_name(), "copy_gbs": copy_gbs, "ops": []}
    print(f"torch {torch.__version__} on {res['device']}: copy {copy_gbs:.0f} GB/s")
    for name, moved, f in ops:
        ms = time_ms(f)
        gbs = moved / ms / 1e6
        res["ops"].append({"op": name, "ms": ms, "gbs": gbs, "of_copy": gbs / copy_gbs})
        print(f"{name:<14} {ms:9.3f} ms {gbs:9.0f} GB/s {100 * gbs / copy_gbs:6.0f}% of copy")
    out = sys.argv[1] if len(sys.argv) > 1 else "torch_tensor_ops.json"
    with open(out, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main()
