#!/usr/bin/env python3
"""kiln's GPT against PyTorch: the same architecture, the same initial weights, the same batches.

Modes (run from the repository root; KILN is the kiln binary, default target/release/kiln):

  parity  kiln trains --steps N from its seed, writing its initial weights (--save-init) and its
          loss per step (--loss-log); PyTorch loads those weights, draws the same windows (the
          SplitMix64 generator of host/src/corpus.rs, reimplemented below) and trains with the
          same AdamW (betas 0.9/0.95, eps 1e-8, decay on the linear layers' weights only), warmup
          + cosine schedule, clipping and gradient accumulation. Prints both losses per step and
          fails when any step differs by more than 1% (f32) or 2% (bf16).

      python3 benches/torch_gpt.py parity --data FILE --dtype f32 --steps 200

  speed   ms per optimizer step, tokens/s and peak memory for char-mini at batch 64 and
          gpt2-small at batch 16 (vocabulary 50304) in bf16: kiln (`--bench-steps`), PyTorch eager
          with autocast, and torch.compile; MFU against $PEAK_TFLOPS (default 989, H100/H200 dense
          bf16); writes benches/results/gpt.json (and gpt.md).

      python3 benches/torch_gpt.py speed [--cases char-mini,gpt2-small] [--steps 20]

  ddp     PyTorch DDP on the speed cases' model: one process per GPU (NCCL, DDP's default buckets
          overlapping the backward), --batch windows per GPU, eager (no torch.compile), bf16
          autocast, fused AdamW, clipping; rank 0 prints one JSON line {"case", "gpus",
          "batch_per_gpu", "ms", "tokens_per_s", "device"} (tokens summed over ranks). `--gpus 1`
          runs the same model without DDP. $MASTER_PORT (default 29531) for the rendezvous.

      python3 benches/torch_gpt.py ddp --cases gpt2-small --gpus 2 --batch 16 [--steps 10]

  check   no PyTorch needed: recomputes kiln's first-step loss from its initial checkpoint in pure
          Python (f64) on the first batch, checking the name mapping, the head layout, the
          tokenizer, the split and the window generator (a tiny model only: it is slow).

      python3 benches/torch_gpt.py check --data FILE
"""

import argparse
import datetime
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

MASK = (1 << 64) - 1


# ---- data: host/src/corpus.rs ------------------------------------------------------------


class WindowRng:
    """SplitMix64, as kiln's corpus::WindowRng."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def tokenize(path, tokens):
    raw = open(path, "rb").read()
    if tokens == "bytes":
        ids, vocab = list(raw), 256
    else:
        text = raw.decode("utf-8")
        chars = sorted(set(text))
        index = {c: i for i, c in enumerate(chars)}
        ids, vocab = [index[c] for c in text], len(chars)
    n_train = int(len(ids) * 0.9)
    return ids[:n_train], ids[n_train:], vocab


def windows(tokens, batch, block, rng):
    span = len(tokens) - block
    x, y = [], []
    for _ in range(batch):
        s = rng.next_u64() % span
        x.append(tokens[s : s + block])
        y.append(tokens[s + 1 : s + block + 1])
    return x, y


def lr_at(base, t, warmup, total, min_ratio=0.1):
    """optim::LrSchedule::CosineWarmup with kiln's GPT settings."""
    warmup = min(warmup, total)
    if t < warmup:
        return base * (t + 1) / warmup
    span = max(total - warmup, 1)
    p = min((t - warmup) / span, 1.0)
    lo = base * min_ratio
    return lo + (base - lo) * 0.5 * (1.0 + math.cos(math.pi * p))


# ---- safetensors, read by hand (no package needed) ----------------------------------------


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, h in header.items():
        s, e = h["data_offsets"]
        out[name] = (h["dtype"], h["shape"], b[base + s : base + e])
    return out, meta


def config_of(meta):
    return {
        "vocab": int(meta["gpt.vocab"]),
        "block": int(meta["gpt.block"]),
        "width": int(meta["gpt.width"]),
        "layers": int(meta["gpt.layers"]),
        "heads": int(meta["gpt.heads"]),
        "tie": meta["gpt.tie_weights"] == "true",
        "bias": meta["gpt.bias"] == "true",
    }


def kiln_binary(args):
    return args.kiln or os.environ.get("KILN", "target/release/kiln")


def run_kiln(args, extra):
    cmd = [kiln_binary(args), "train", "--model", "gpt"] + extra
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out.stdout


# ---- PyTorch model (names as kiln's nn::gpt) ----------------------------------------------


def torch_model(cfg, tensors, device):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    C, H = cfg["width"], cfg["heads"]

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C, bias=cfg["bias"])
            self.c_proj = nn.Linear(C, C, bias=cfg["bias"])

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C, bias=cfg["bias"])
            self.c_proj = nn.Linear(4 * C, C, bias=cfg["bias"])

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.attn = Attn()
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg["vocab"], C)
            self.wpe = nn.Embedding(cfg["block"], C)
            self.h = nn.ModuleList([Block() for _ in range(cfg["layers"])])
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            self.lm_head = nn.Linear(C, cfg["vocab"], bias=False)
            if cfg["tie"]:
                self.lm_head.weight = self.wte.weight

        def forward(self, idx, targets):
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.h:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    m = Gpt()
    if tensors is not None:
        sd = {}
        for name, (dt, shape, data) in tensors.items():
            assert dt == "F32", f"{name}: {dt}"
            sd[name] = torch.frombuffer(bytearray(data), dtype=torch.float32).view(shape)
        if cfg["tie"]:
            sd["lm_head.weight"] = sd["wte.weight"]
        missing, unexpected = m.load_state_dict(sd, strict=False)
        assert not unexpected and not [k for k in missing if k != "lm_head.weight"], (missing, unexpected)
    return m.to(device)


def adamw(model, lr, wd, fused):
    import torch

    decay, rest = [], []
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        is_linear_weight = name.endswith(".weight") and (".attn." in name or ".mlp." in name or name == "lm_head.weight")
        (decay if is_linear_weight else rest).append(p)
    groups = [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


# ---- parity -------------------------------------------------------------------------------


def parity(args):
    import torch

    work = tempfile.mkdtemp(prefix="kiln-gpt-parity-")
    init = os.path.join(work, "init.safetensors")
    log = os.path.join(work, "kiln.log")
    common = ["--data", args.data, "--tokens", args.tokens, "--preset", args.preset, "--dropout", "0",
              "--batch", str(args.batch), "--grad-accum", str(args.grad_accum), "--lr", str(args.lr),
              "--warmup", str(args.warmup), "--weight-decay", str(args.weight_decay),
              "--clip-grad-norm", str(args.clip), "--seed", str(args.seed)]
    for flag, v in (("--block", args.block), ("--width", args.width), ("--layers", args.layers), ("--heads", args.heads)):
        if v:
            common += [flag, str(v)]
    run_kiln(args, common + ["--steps", str(args.steps), "--dtype", args.dtype, "--device", args.device,
                             "--eval-every", "0", "--save-init", init, "--loss-log", log,
                             "--checkpoint", os.path.join(work, "final.safetensors")])
    kiln_losses = [float(l.split()[1]) for l in open(log)]
    tensors, meta = read_safetensors(init)
    cfg = config_of(meta)
    device = "cuda" if args.device == "cuda" else "cpu"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = torch_model(cfg, tensors, device)
    opt = adamw(model, args.lr, args.weight_decay, fused=device == "cuda")
    train, _, _ = tokenize(args.data, args.tokens)
    rng = WindowRng(args.seed)
    tol = 0.01 if args.dtype == "f32" else 0.02
    worst = 0.0
    failed = []
    print(f"{'step':>5} {'kiln':>10} {'torch':>10} {'rel':>9}")
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(args.lr, step, args.warmup, args.steps)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(args.grad_accum):
            x, y = windows(train, args.batch, cfg["block"], rng)
            x = torch.tensor(x, device=device)
            y = torch.tensor(y, device=device)
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
                loss = model(x, y) / args.grad_accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        k = kiln_losses[step]
        rel = abs(k - total) / abs(total)
        worst = max(worst, rel)
        if rel > tol:
            failed.append(step + 1)
        print(f"{step + 1:>5} {k:>10.5f} {total:>10.5f} {rel:>9.2e}")
    print(json.dumps({"mode": "parity", "dtype": args.dtype, "steps": args.steps, "worst_rel": worst,
                      "tolerance": tol, "failed_steps": failed[:20], "ok": not failed}))
    return 0 if not failed else 1


# ---- speed --------------------------------------------------------------------------------

CASES = {
    "char-mini": {"preset": "char-mini", "batch": 64, "vocab": 256},
    "gpt2-small": {"preset": "gpt2-small", "batch": 16, "vocab": 50304},
}
SIZES = {"char-mini": (256, 384, 6, 6), "gpt2-small": (1024, 768, 12, 12)}


def train_step(net, model, opt, batch, block, g):
    """One training step on random windows: bf16 autocast, clipping at 1.0, the optimizer's step.
    `net` runs the forward (the model, compiled or wrapped in DDP), `model` holds the parameters."""
    import torch

    def step():
        x = torch.randint(0, 256, (batch, block), device="cuda", generator=g)
        y = torch.randint(0, 256, (batch, block), device="cuda", generator=g)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = net(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def torch_speed(case, steps, compiled):
    import torch

    block, width, layers, heads = SIZES[case["preset"]]
    cfg = {"vocab": case["vocab"], "block": block, "width": width, "layers": layers, "heads": heads,
           "tie": True, "bias": True}
    model = torch_model(cfg, None, "cuda")
    opt = adamw(model, 1e-4, 0.1, fused=True)
    step_fn = torch.compile(model) if compiled else model
    g = torch.Generator(device="cuda").manual_seed(0)
    B = case["batch"]
    step = train_step(step_fn, model, opt, B, block, g)

    for _ in range(5 if compiled else 3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / steps
    return ms, B * block / (ms / 1e3), torch.cuda.max_memory_allocated()


def ddp_worker(rank, args, case):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.cuda.set_device(rank)
    if args.gpus > 1:
        dist.init_process_group("nccl", rank=rank, world_size=args.gpus)
    block, width, layers, heads = SIZES[case["preset"]]
    cfg = {"vocab": case["vocab"], "block": block, "width": width, "layers": layers, "heads": heads,
           "tie": True, "bias": True}
    torch.manual_seed(0)
    model = torch_model(cfg, None, "cuda")
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank]) if args.gpus > 1 else model
    opt = adamw(model, 1e-4, 0.1, fused=True)
    g = torch.Generator(device="cuda").manual_seed(rank)
    B = args.batch
    step = train_step(net, model, opt, B, block, g)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    if args.gpus > 1:
        dist.barrier()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.steps):
        step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / args.steps
    if rank == 0:
        tokens = args.gpus * B * block / (ms / 1e3)
        print(json.dumps({"case": case["preset"], "gpus": args.gpus, "batch_per_gpu": B, "ms": round(ms, 3),
                          "tokens_per_s": round(tokens), "device": torch.cuda.get_device_name(0)}), flush=True)
    if args.gpus > 1:
        dist.destroy_process_group()


def ddp(args):
    import torch
    import torch.multiprocessing as mp

    have = torch.cuda.device_count()
    if not 1 <= args.gpus <= have:
        print(f"--gpus {args.gpus}: this machine has {have} GPU(s); use 1 to {have}", file=sys.stderr)
        return 2

    for name in args.cases.split(","):
        case = CASES[name]
        if args.gpus > 1:
            mp.spawn(ddp_worker, args=(args, case), nprocs=args.gpus, join=True)
        else:
            ddp_worker(0, args, case)
    return 0


def kiln_speed(args, name, case, data):
    out = run_kiln(args, ["--data", data, "--preset", case["preset"], "--batch", str(case["batch"]),
                          "--vocab", str(case["vocab"]), "--dropout", "0", "--dtype", "bf16", "--device", "cuda",
                          "--bench-steps", str(args.steps)])
    line = [l for l in out.splitlines() if l.startswith("{")][-1]
    return json.loads(line)


def flops_per_token(preset, vocab):
    """Training FLOPs per token: 6 N (forward and backward of every weight) + 12 L T C (attention's
    two products, causal or not, as nanoGPT and PaLM count them)."""
    block, C, L, _ = SIZES[preset]
    n = vocab * C + block * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * n + 12 * L * block * C


def speed(args):
    import torch

    peak = float(os.environ.get("PEAK_TFLOPS", "989")) * 1e12  # H100/H200 SXM dense bf16

    work = tempfile.mkdtemp(prefix="kiln-gpt-speed-")
    data = os.path.join(work, "random.bin")
    with open(data, "wb") as f:
        f.write(os.urandom(4 << 20))
    rows = []
    for name in args.cases.split(","):
        case = CASES[name]
        k = kiln_speed(args, name, case, data)
        eager = torch_speed(case, args.steps, compiled=False)
        comp = torch_speed(case, args.steps, compiled=True) if not args.no_compile else None
        tokens = case["batch"] * SIZES[case["preset"]][0]
        fpt = flops_per_token(case["preset"], case["vocab"])
        for ref, r in (("torch eager autocast bf16", eager), ("torch.compile autocast bf16", comp)):
            if r is None:
                continue
            rows.append({"case": f"{name} batch {case['batch']} bf16 (vocab {case['vocab']}, {tokens} tokens/step)",
                         "kiln_ms": round(k["kiln_ms"], 3), "reference": ref, "reference_ms": round(r[0], 3),
                         "kiln_tokens_per_s": round(k["tokens_per_s"]), "reference_tokens_per_s": round(r[1]),
                         "kiln_peak_bytes": k["peak_bytes"], "reference_peak_bytes": r[2],
                         "kiln_mfu": round(k["tokens_per_s"] * fpt / peak, 4),
                         "reference_mfu": round(r[1] * fpt / peak, 4)})
        print(json.dumps(rows[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "commit": commit,
              "command": "python3 " + " ".join(sys.argv), "torch": torch.__version__, "rows": rows}
    os.makedirs("benches/results", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    md = os.path.splitext(args.out)[0] + ".md"
    with open(md, "w") as f:
        f.write(f"# GPT training step: kiln against PyTorch {torch.__version__}\n\n")
        f.write(f"{result['device']}, {result['date']}, commit {commit}: `{result['command']}`\n\n")
        f.write("| case | kiln ms | reference | reference ms | kiln tokens/s | reference tokens/s | kiln peak MiB | reference peak MiB | kiln MFU | reference MFU |\n")
        f.write("|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            kp = "-" if r["kiln_peak_bytes"] is None else f"{r['kiln_peak_bytes'] / 2**20:.0f}"
            f.write(f"| {r['case']} | {r['kiln_ms']} | {r['reference']} | {r['reference_ms']} | "
                    f"{r['kiln_tokens_per_s']} | {r['reference_tokens_per_s']} | {kp} | "
                    f"{r['reference_peak_bytes'] / 2**20:.0f} | {r['kiln_mfu']:.1%} | {r['reference_mfu']:.1%} |\n")
    print(f"wrote {args.out} and {md}")
    return 0


# ---- check (pure Python, f64) -------------------------------------------------------------


def check(args):
    work = tempfile.mkdtemp(prefix="kiln-gpt-check-")
    init = os.path.join(work, "init.safetensors")
    log = os.path.join(work, "kiln.log")
    extra = []
    for flag, v in (("--block", args.block), ("--width", args.width), ("--layers", args.layers), ("--heads", args.heads)):
        if v:
            extra += [flag, str(v)]
    run_kiln(args, ["--data", args.data, "--tokens", args.tokens, "--preset", args.preset, "--batch", str(args.batch),
                    "--steps", "1", "--device", "cpu", "--dropout", "0", "--seed", str(args.seed), "--save-init", init,
                    "--loss-log", log, "--eval-every", "0", "--checkpoint", os.path.join(work, "c.safetensors")] + extra)
    kiln_loss = float(open(log).read().split()[1])
    tensors, meta = read_safetensors(init)
    cfg = config_of(meta)
    W = {}
    for name, (dt, shape, data) in tensors.items():
        vals = list(struct.unpack(f"<{len(data) // 4}f", data))
        W[name] = (vals, shape)
    C, H = cfg["width"], cfg["heads"]
    D = C // H

    def rows(name):
        v, s = W[name]
        return [v[i * s[1] : (i + 1) * s[1]] for i in range(s[0])]

    def linear(x, name, bias=True):
        w = rows(name + ".weight")
        b = W[name + ".bias"][0] if cfg["bias"] and bias else [0.0] * len(w)
        return [[sum(a * c for a, c in zip(xi, wr)) + bb for wr, bb in zip(w, b)] for xi in x]

    def layer_norm(x, name):
        g, b = W[name + ".weight"][0], W[name + ".bias"][0]
        out = []
        for xi in x:
            m = sum(xi) / len(xi)
            var = sum((a - m) ** 2 for a in xi) / len(xi)
            r = 1.0 / math.sqrt(var + 1e-5)
            out.append([(a - m) * r * gg + bb for a, gg, bb in zip(xi, g, b)])
        return out

    def gelu(v):
        return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))

    train, _, _ = tokenize(args.data, args.tokens)
    xs, ys = windows(train, args.batch, cfg["block"], WindowRng(args.seed))
    wte, wpe = rows("wte.weight"), rows("wpe.weight")
    total, count = 0.0, 0
    for seq, tgt in zip(xs, ys):
        T = len(seq)
        x = [[a + b for a, b in zip(wte[t], wpe[i])] for i, t in enumerate(seq)]
        for l in range(cfg["layers"]):
            p = f"h.{l}"
            qkv = linear(layer_norm(x, p + ".ln_1"), p + ".attn.c_attn")
            y = [[0.0] * C for _ in range(T)]
            for h in range(H):
                q = [r[h * D : (h + 1) * D] for r in qkv]
                k = [r[C + h * D : C + (h + 1) * D] for r in qkv]
                v = [r[2 * C + h * D : 2 * C + (h + 1) * D] for r in qkv]
                for i in range(T):
                    s = [sum(a * b for a, b in zip(q[i], k[j])) / math.sqrt(D) for j in range(i + 1)]
                    mx = max(s)
                    e = [math.exp(a - mx) for a in s]
                    z = sum(e)
                    for d in range(D):
                        y[i][h * D + d] = sum(e[j] * v[j][d] for j in range(i + 1)) / z
            a = linear(y, p + ".attn.c_proj")
            x = [[u + w for u, w in zip(r1, r2)] for r1, r2 in zip(x, a)]
            hdn = [[gelu(v) for v in r] for r in linear(layer_norm(x, p + ".ln_2"), p + ".mlp.c_fc")]
            m = linear(hdn, p + ".mlp.c_proj")
            x = [[u + w for u, w in zip(r1, r2)] for r1, r2 in zip(x, m)]
        x = layer_norm(x, "ln_f")
        head = "wte.weight" if cfg["tie"] else "lm_head.weight"
        hw = rows(head)
        for xi, t in zip(x, tgt):
            logits = [sum(a * b for a, b in zip(xi, wr)) for wr in hw]
            mx = max(logits)
            lse = mx + math.log(sum(math.exp(v - mx) for v in logits))
            total += lse - logits[t]
            count += 1
    ref = total / count
    rel = abs(ref - kiln_loss) / ref
    print(json.dumps({"mode": "check", "kiln_first_loss": kiln_loss, "python_f64_first_loss": ref, "rel": rel,
                      "ok": rel < 1e-4}))
    return 0 if rel < 1e-4 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["parity", "speed", "ddp", "check"])
    ap.add_argument("--gpus", type=int, default=2, help="ddp: processes, one per GPU")
    ap.add_argument("--kiln", help="the kiln binary (default $KILN or target/release/kiln)")
    ap.add_argument("--data", help="text file (parity, check)")
    ap.add_argument("--tokens", default="bytes", choices=["bytes", "chars"])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--block", type=int)
    ap.add_argument("--width", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=None, help="parity: 200; speed: 20 timed steps")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", default="char-mini,gpt2-small")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default="benches/results/gpt.json")
    args = ap.parse_args()
    if args.mode == "parity":
        args.steps = args.steps or 200
        sys.exit(parity(args))
    if args.mode == "speed":
        args.steps = args.steps or 20
        sys.exit(speed(args))
    if args.mode == "ddp":
        args.steps = args.steps or 10
        sys.exit(ddp(args))
    args.batch = min(args.batch, 2)
    sys.exit(check(args))


if __name__ == "__main__":
    main()
