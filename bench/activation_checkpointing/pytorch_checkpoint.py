#!/usr/bin/env python3
"""PyTorch peer of bench_activation_checkpointing: the same model and step with torch.utils.checkpoint.

Run on the venv's interpreter (scripts/env.sh: the torch wheel tandem builds against):

  python3 bench/activation_checkpointing/pytorch_checkpoint.py --policy {none|every|sqrt}
      [--memory {none|rss}] [--blocks 16] [--batch 4096] [--dim 128] [--steps N] [--warmup W]
      [--out FILE]

Model: `blocks` blocks y = x + fc2(silu(fc1(layer_norm(x)))) (fc1: dim -> 4*dim, fc2: 4*dim ->
dim) in an nn.Sequential; MSE loss; SGD lr 1e-3; torch.set_num_threads(1). Step = forward, loss,
backward, optimizer step, zero_grad. Policies: none; every =
torch.utils.checkpoint.checkpoint_sequential(model, blocks, x); sqrt = checkpoint_sequential(model,
round(sqrt(blocks)), x), with use_reentrant=False (what PyTorch 2.x recommends and tandem's
checkpoint does: autograd saved-tensor hooks; the last segment runs unchecked). The input requires
grad under every policy, as it did when the reentrant checkpoint needed it, so the work is
unchanged across policies.

--memory rss: peak resident set size during each step (VmHWM after the step, reset through
/proc/self/clear_refs before it) minus the resident size before it. Meaningful when glibc maps
every large block fresh and unmaps it on free: run with MALLOC_MMAP_THRESHOLD_=65536. PyTorch
has no CPU allocator statistics, so this is the Python figure; the C++ program's --memory rss
measures itself the same way to check the method against tandem's allocator statistics.
Steps are timed in a run without --memory rss (and without that environment variable).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.silu(self.fc1(self.ln(x))))


def status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", choices=["none", "every", "sqrt"], default="none")
    ap.add_argument("--memory", choices=["none", "rss"], default="none")
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(args.dim) for _ in range(args.blocks)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.dim).requires_grad_(True)
    y = torch.randn(args.batch, args.dim)
    segments = {"none": 0, "every": args.blocks, "sqrt": max(1, round(math.sqrt(args.blocks)))}[args.policy]

    def forward():
        if segments == 0:
            return model(x)
        return checkpoint_sequential(model, segments, x, use_reentrant=False)

    step_ms, fwd_ms, bwd_ms, rss = [], [], [], []
    for s in range(args.warmup + args.steps):
        if args.memory == "rss":
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before = status_bytes("VmRSS")
        t0 = time.perf_counter()
        loss = nn.functional.mse_loss(forward(), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        x.grad = None
        t3 = time.perf_counter()
        del loss
        if s < args.warmup:
            continue
        step_ms.append((t3 - t0) * 1e3)
        fwd_ms.append((t1 - t0) * 1e3)
        bwd_ms.append((t2 - t1) * 1e3)
        if args.memory == "rss":
            rss.append(status_bytes("VmHWM") - before)

    result = {
        "policy": args.policy, "segments": segments, "memory": args.memory,
        "blocks": args.blocks, "batch": args.batch, "dim": args.dim,
        "warmup": args.warmup, "steps": args.steps,
        "torch": torch.__version__,
        "step_ms": statistics.median(step_ms), "forward_ms": statistics.median(fwd_ms),
        "backward_ms": statistics.median(bwd_ms), "steps_ms": step_ms,
    }
    if rss:
        result["peak_rss_bytes"] = max(rss)
        result["peaks_rss_bytes"] = rss
    print("%-6s python %-4s step %8.1f ms (fwd %7.1f, bwd %7.1f)%s" % (
        args.policy, args.memory, result["step_ms"], result["forward_ms"], result["backward_ms"],
        "  peak %8.1f MiB" % (max(rss) / 2**20) if rss else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    else:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
