"""PyTorch references for benches/engine_step.rs (issue 31), measured in the same run: one SGD
training step (forward, cross-entropy, backward, SGD lr 0.01) of `layers` bias-free Linear layers of
`width` with ReLU between, on the three models, as
- f32 eager and f32 as a CUDA graph (TF32 off: true f32 products),
- bf16 under autocast (f32 parameters, bf16 products and activations: PyTorch's mixed precision),
  eager and as a CUDA graph (autocast's weight cache off, as capture needs),
and the peak device memory of each (`torch.cuda.max_memory_allocated`, reset before the case).
Usage: python3 benches/torch_engine_step.py [out.json]
"""
import json
import sys
import torch

from torch_mlp_step import time_ms  # same folder: the median of CUDA-event samples

MODELS = [(64, 256, 4), (256, 1024, 4), (4096, 1024, 8)]
LR = 0.01


def case(batch, width, layers, autocast, graph, reps, per):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    mods = []
    for l in range(layers):
        mods.append(torch.nn.Linear(width, width, bias=False))
        if l + 1 < layers:
            mods.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*mods).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.randn(batch, width, device="cuda")
    t = (torch.arange(batch, device="cuda") * 37) % width
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast, cache_enabled=not graph):
            loss = loss_fn(model(x).float(), t)
        loss.backward()
        opt.step()

    if not graph:
        ms = time_ms(step, reps, per)
    else:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast, cache_enabled=False):
                loss = loss_fn(model(x).float(), t)
            loss.backward()
            opt.step()
        ms = time_ms(g.replay, reps, per)
    torch.cuda.synchronize()
    return ms, torch.cuda.max_memory_allocated()


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    print(f"torch {torch.__version__} on {res['device']}: ms per training step, peak memory")
    for batch, width, layers in MODELS:
        reps, per = (7, 3) if batch * width >= 1 << 22 else (15, 10)
        for dtype, autocast in [("f32", False), ("bf16", True)]:
            for mode, graph in [("eager", False), ("graph", True)]:
                ms, peak = case(batch, width, layers, autocast, graph, reps, per)
                name = f"torch {'f32' if not autocast else 'bf16 autocast'} {mode}"
                row = {"model": f"{batch}x{width}x{layers}", "dtype": dtype, "mode": mode,
                       "reference": name, "ms": ms, "peak_bytes": peak}
                res["rows"].append(row)
                print(f"b{batch} w{width} d{layers} {name}: {ms:.4f} ms, peak {peak / 2**20:.1f} MiB")
    out = sys.argv[1] if len(sys.argv) > 1 else "torch_engine_step.json"
    with open(out, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main()
