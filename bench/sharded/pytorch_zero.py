#!/usr/bin/python3
"""PyTorch peer of bench_sharded: the same model, batch and AdamW step, in Python.

Run on Debian's interpreter (/usr/bin/python3 with python3-torch 1.13), one process per rank,
started by tandemrun (it sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT for env:// init):

  tandemrun --standalone --nproc-per-node 2 /usr/bin/python3 bench/sharded/pytorch_zero.py \
      --mode {ddp|zero|fsdp} --batch B --steps N [--warmup W] --out FILE

  ddp   torch.nn.parallel.DistributedDataParallel over gloo + torch.optim.AdamW
  zero  the same DDP + torch.distributed.optim.ZeroRedundancyOptimizer(optimizer_class=AdamW),
        default options (the optimizer state sharded; after the step each rank broadcasts the
        parameters it owns)
  fsdp  torch.distributed.fsdp.FullyShardedDataParallel, each Linear wrapped: if 1.13 cannot run
        it here, prints the error on one line starting with "FSDP unavailable:" and exits 3

Model: Linear(1024,2048), ReLU, 3 x (Linear(2048,2048), ReLU), Linear(2048,1024); MSE loss;
AdamW lr 1e-3, weight decay 0.01; fp32; torch.set_num_threads(1). Inputs/targets random, seeded
per rank, made once. Step = zero_grad, forward, loss, backward, optimizer step. A rank's figure is
the median of its timed steps; the reported step time is the larger of the ranks' medians (as in
the C++ program). state_bytes: parameters + gradients + optimizer state tensors this rank holds
after the last step. Rank 0 writes one JSON object.
"""
import argparse
import json
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


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["ddp", "zero", "fsdp"], default="zero")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
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
    if args.mode == "fsdp":
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            net = nn.Sequential(*[FSDP(m) if isinstance(m, nn.Linear) else m for m in model])
            net = FSDP(net)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
            opt.zero_grad()
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()
        except Exception as e:  # noqa: BLE001 - whatever 1.13 raises, reported as is
            print("FSDP unavailable: %s: %s" % (type(e).__name__, " ".join(str(e).split())), flush=True)
            return 3
        params = net.parameters()
    else:
        net = nn.parallel.DistributedDataParallel(model)
        params = model.parameters()
        if args.mode == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-3,
                                          weight_decay=0.01)
        else:
            opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
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
        opt.step()  # ZeroRedundancyOptimizer: steps its shard, then broadcasts the parameters
        t3 = time.perf_counter()
        if it >= args.warmup:
            steps.append((t3 - t0) * 1e3)
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
            opt_ms.append((t3 - t2) * 1e3)

    local_opt = opt.optim if args.mode == "zero" else opt
    state = [t for s in local_opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    trained = list(net.parameters())
    state_bytes = tensor_bytes(trained) + tensor_bytes(p.grad for p in trained) + tensor_bytes(state)
    mine = torch.tensor([statistics.median(steps), statistics.median(fwd), statistics.median(bwd),
                         statistics.median(opt_ms), float(loss.item()), float(state_bytes),
                         float(tensor_bytes(state))], dtype=torch.float64)
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
            "rank_step_ms": [round(r[0], 4) for r in per_rank],
            "forward_ms": round(avg(1), 4), "backward_ms": round(avg(2), 4),
            "optimizer_ms": round(avg(3), 4), "final_loss": round(per_rank[0][4], 6),
            "state_bytes": int(max(r[5] for r in per_rank)),
            "optimizer_state_bytes": int(max(r[6] for r in per_rank)),
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
