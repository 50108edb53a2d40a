#!/usr/bin/env python3
"""PyTorch peer of bench_data_parallel: the same model, batch and step, in Python.

Run on the venv's interpreter (scripts/env.sh), one process per rank,
started by tandemrun (it sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT for env:// init):

  tandemrun --standalone --nproc-per-node 2 python3 bench/data_parallel/pytorch_ddp.py \
      --mode {local|ddp} --batch B --steps N [--warmup W] --out FILE

  local  each rank trains its own replica, no communication (both processes still run)
  ddp    torch.nn.parallel.DistributedDataParallel over gloo, default options (bucket_cap_mb 25)

Model: Linear(1024,2048), ReLU, 3 x (Linear(2048,2048), ReLU), Linear(2048,1024); MSE loss; SGD
lr 0.01 without momentum; fp32; torch.set_num_threads(1). Inputs/targets random, seeded per rank,
made once. Step = zero_grad, forward, loss, backward, optimizer step. A rank's figure is the median
of its timed steps; the reported step time is the larger of the ranks' medians (as in the C++
program). Rank 0 writes one JSON object.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def make_model():
    layers = [nn.Linear(1024, 2048), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(2048, 2048), nn.ReLU()]
    layers.append(nn.Linear(2048, 1024))
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["local", "ddp"], default="ddp")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = make_model()
    torch.manual_seed(1000 + rank)
    x = torch.randn(args.batch, 1024)
    y = torch.randn(args.batch, 1024)
    net = nn.parallel.DistributedDataParallel(model) if args.mode == "ddp" else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()

    steps, fwd, bwd, opt_ms = [], [], [], []
    loss = None
    dist.barrier()
    for it in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        t1 = time.perf_counter()
        loss.backward()  # DDP: waits for every bucket's all-reduce at the end of backward
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if it >= args.warmup:
            steps.append((t3 - t0) * 1e3)
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
            opt_ms.append((t3 - t2) * 1e3)

    mine = torch.tensor([statistics.median(steps), statistics.mean(steps), min(steps),
                         statistics.median(fwd), statistics.median(bwd),
                         statistics.median(opt_ms), float(loss.item())], dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(gathered, mine)
    per_rank = [g.tolist() for g in gathered]
    if rank == 0:
        def avg(i):
            return sum(r[i] for r in per_rank) / size
        result = {
            "mode": "pytorch_" + args.mode, "ranks": size, "batch": args.batch,
            "steps": args.steps, "warmup": args.warmup, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": sys.version.split()[0],
            "step_ms": round(max(r[0] for r in per_rank), 4),
            "step_mean_ms": round(max(r[1] for r in per_rank), 4),
            "step_min_ms": round(max(r[2] for r in per_rank), 4),
            "rank_step_ms": [round(r[0], 4) for r in per_rank],
            "forward_ms": round(avg(3), 4), "backward_ms": round(avg(4), 4),
            "optimizer_ms": round(avg(5), 4), "final_loss": round(per_rank[0][6], 4),
        }
        text = json.dumps(result)
        print(text, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
