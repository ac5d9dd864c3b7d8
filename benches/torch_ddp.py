"""PyTorch DDP on the large MLP of benches/mlp_step.rs: per GPU a batch of 4096 rows, 8 bias-free
Linear layers of width 1024 (ReLU between), 1024 classes, cross-entropy, f32, SGD lr 0.01.

    python3 benches/torch_ddp.py --gpus 2 [--batch 4096 --width 1024 --layers 8 --steps 50] [--json PATH]

One process per GPU (mp.spawn, NCCL, DDP's default 25 MB buckets overlapping the backward pass);
rank 0 prints the mean ms per step after warm-up and the throughput in rows/s summed over ranks.
`--gpus 1` runs the same model without DDP for the scaling ratio. NCCL_NVLS_ENABLE=0 unless set.
`--json PATH`: rank 0 also writes {"gpus", "batch", "width", "layers", "steps", "ms", "rows_per_s",
"device"} there (what benches/multi_gpu_report.py reads). The model is the one `kiln dist-bench` runs.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def model(width, layers):
    mods = []
    for i in range(layers):
        mods.append(nn.Linear(width, width, bias=False))
        if i + 1 < layers:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def worker(rank, args):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    torch.cuda.set_device(rank)
    torch.backends.cuda.matmul.allow_tf32 = False
    distributed = args.gpus > 1
    if distributed:
        dist.init_process_group("nccl", rank=rank, world_size=args.gpus, device_id=torch.device("cuda", rank))
    torch.manual_seed(0)
    net = model(args.width, args.layers).cuda()
    if distributed:
        net = nn.parallel.DistributedDataParallel(net, device_ids=[rank])
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator(device="cuda").manual_seed(1 + rank)
    x = torch.randn(args.batch, args.width, device="cuda", generator=g)
    y = torch.randint(0, args.width, (args.batch,), device="cuda", generator=g)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    if distributed:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / args.steps * 1e3
    if rank == 0:
        rows = args.batch * args.gpus / (ms / 1e3)
        print(
            f"torch {'DDP' if distributed else 'single GPU'} MLP {args.batch}x{args.width}x{args.layers} per GPU "
            f"on {args.gpus} GPU(s): {ms:.3f} ms/step, {rows:.0f} rows/s"
        )
        if args.json:
            out = {
                "gpus": args.gpus,
                "batch": args.batch,
                "width": args.width,
                "layers": args.layers,
                "steps": args.steps,
                "ms": ms,
                "rows_per_s": rows,
                "device": torch.cuda.get_device_name(rank),
                "ddp": distributed,
            }
            with open(args.json, "w") as f:
                json.dump(out, f)
    if distributed:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--batch", type=int, default=4096, help="rows per GPU")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--port", type=int, default=29512)
    p.add_argument("--json", default=None, help="also write the result as JSON here (rank 0)")
    args = p.parse_args()
    assert args.gpus <= torch.cuda.device_count(), f"--gpus {args.gpus}: {torch.cuda.device_count()} present"
    if args.gpus == 1:
        worker(0, args)
    else:
        mp.spawn(worker, args=(args,), nprocs=args.gpus)


if __name__ == "__main__":
    main()
