"""torch.distributed all_reduce (NCCL, float32 sum, in place) timed like `kiln allreduce`.

    python3 benches/torch_allreduce.py --bytes 1073741824 --gpus 2 [--reps 20 --warmup 5] [--json PATH]

One process per GPU (mp.spawn); rank 0 prints the mean time per call, algbw = bytes / time and
busbw = algbw * 2 (n-1) / n in GB/s (10^9), the figures nccl-tests reports. NVLink multicast stays
off (NCCL_NVLS_ENABLE=0 unless set). `--json PATH`: rank 0 also writes {"bytes", "gpus", "ms",
"algbw_gbs", "busbw_gbs"} there (what benches/multi_gpu_report.py reads).
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, args):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=args.gpus, device_id=torch.device("cuda", rank))
    buf = torch.zeros(args.bytes // 4, dtype=torch.float32, device="cuda")
    for _ in range(args.warmup):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.reps):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / args.reps
    if rank == 0:
        algbw = args.bytes / sec / 1e9
        busbw = algbw * 2 * (args.gpus - 1) / args.gpus
        print(
            f"torch all_reduce f32 sum: {args.bytes} bytes on {args.gpus} GPUs: {sec * 1e3:.3f} ms  "
            f"algbw {algbw:.1f} GB/s  busbw {busbw:.1f} GB/s"
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"bytes": args.bytes, "gpus": args.gpus, "ms": sec * 1e3, "algbw_gbs": algbw, "busbw_gbs": busbw},
                    f,
                )
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", type=int, default=1 << 30)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--json", default=None, help="also write the result as JSON here (rank 0)")
    args = p.parse_args()
    assert args.bytes > 0 and args.bytes % 4 == 0, "--bytes: a positive multiple of 4"
    assert args.gpus <= torch.cuda.device_count(), f"--gpus {args.gpus}: {torch.cuda.device_count()} present"
    mp.spawn(worker, args=(args,), nprocs=args.gpus)


if __name__ == "__main__":
    main()
