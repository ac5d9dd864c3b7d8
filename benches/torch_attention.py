"""PyTorch's scaled_dot_product_attention on issue 35's cases, for the comparison with
`kiln attention` in the same run: bf16, forward and forward+backward, causal and not, median of
CUDA-event samples. TFLOP/s counts 4 B H S^2 D for the forward (halved when causal) and 2.5x that
for the backward, as `kiln attention` does.
Usage: python3 benches/torch_attention.py [out.json]
"""
import json
import sys
import torch
import torch.nn.functional as F

from torch_mlp_step import time_ms  # same folder: the median of CUDA-event samples

CASES = [(4, 16, 4096, 128), (4, 32, 4096, 64), (1, 16, 16384, 128)]


def main():
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for b, h, s, d in CASES:
        for causal in (False, True):
            q, k, v = [torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
            do = torch.randn_like(q)
            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            def fwd_bwd():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                o.backward(do)
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            for name, f, fl in (("forward", fwd, flops), ("forward+backward", fwd_bwd, 3.5 * flops)):
                ms = time_ms(f, 7, 3)
                case = f"B{b} H{h} S{s} D{d}{' causal' if causal else ''} {name}"
                res["rows"].append({"case": case, "reference": "torch sdpa bf16", "ms": ms, "tflops": fl / ms / 1e9})
                print(f"{case}: {ms:.3f} ms, {fl / ms / 1e9:.0f} TFLOP/s")
    out = sys.argv[1] if len(sys.argv) > 1 else "torch_attention.json"
    with open(out, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main()
