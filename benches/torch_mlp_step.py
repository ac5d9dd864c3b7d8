"""PyTorch on the models of benches/mlp_step.rs, for the comparison in the same run: one training
step (forward, cross-entropy, backward, SGD lr 0.01) of `layers` bias-free Linear layers of `width`
with ReLU between, eager and captured as a CUDA graph: f32 (TF32 off), f32 with TF32 matmuls
(`allow_tf32`, for kiln's tf32 megakernel path) and bf16.
Usage: python3 benches/torch_mlp_step.py [out.json]
"""
import json
import sys
import torch

MODELS = [(64, 256, 4), (256, 1024, 4), (4096, 1024, 8)]


def time_ms(f, reps, per):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(per):
            f()
        e.record()
        e.synchronize()
        ms.append(s.elapsed_time(e) / per)
    return sorted(ms)[reps // 2]


def model_for(width, layers, dtype):
    mods = []
    for l in range(layers):
        mods.append(torch.nn.Linear(width, width, bias=False))
        if l + 1 < layers:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods).cuda().to(dtype)


def measure(batch, width, layers, dtype, reps, per):
    torch.manual_seed(0)
    model = model_for(width, layers, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width, device="cuda", dtype=dtype)
    t = (torch.arange(batch, device="cuda") * 37) % width
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x).float(), t).backward()
        opt.step()

    eager = time_ms(step, reps, per)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss_fn(model(x).float(), t).backward()
        opt.step()
    graph = time_ms(g.replay, reps, per)
    return eager, graph


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "models": []}
    print(f"torch {torch.__version__} on {res['device']}: ms per training step")
    for batch, width, layers in MODELS:
        reps, per = (5, 2) if batch * width >= 1 << 22 else (15, 10)
        row = {"batch": batch, "width": width, "layers": layers}
        for name, dtype in [("f32", torch.float32), ("tf32", torch.float32), ("bf16", torch.bfloat16)]:
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            eager, graph = measure(batch, width, layers, dtype, reps, per)
            row[f"{name}_eager_ms"], row[f"{name}_graph_ms"] = eager, graph
            print(f"b{batch} w{width} d{layers} {name}: eager {eager:.3f} ms, CUDA graph {graph:.3f} ms")
        res["models"].append(row)
    out = sys.argv[1] if len(sys.argv) > 1 else "torch_mlp_step.json"
    with open(out, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main()
