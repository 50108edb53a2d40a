#!/usr/bin/env python3
"""PyTorch peer of bench_sharded --mode ddp for scripts/bench-precision: W1 under torch.amp.

The same model, batch, seeds and AdamW step as bench/sharded/bench_sharded.cpp, written the way a
PyTorch user would: torch.nn.parallel.DistributedDataParallel over gloo (default options, 25 MiB
buckets), torch.optim.AdamW, and for bf16 the forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16) (no GradScaler: bf16 has fp32's range). Run by the
venv's python (scripts/env.sh: $TANDEM_PYTHON, torch 2.11), one process per rank, started by
tandemrun as the driver does, or by torchrun (both set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
for env:// init):

  tandemrun --standalone --nproc-per-node 2 "$TANDEM_PYTHON" bench/precision/pytorch_amp.py \
      --autocast {off|bf16} --batch B --steps N [--warmup W] [--memory-steps M] [--out FILE]
  torchrun --standalone --nproc-per-node 2 bench/precision/pytorch_amp.py --autocast bf16 ...

Model: Linear(1024,2048), ReLU, 3 x (Linear(2048,2048), ReLU), Linear(2048,1024), 16.8 M fp32
parameters, built after torch.manual_seed(0); inputs and targets torch.randn(B, 1024) after
torch.manual_seed(1000 + rank), made once; MSE on the output cast to fp32 (as bench_sharded:
mse_loss(model(x).to(kFloat), y) inside the autocast scope); AdamW lr 1e-3, weight decay 0.01;
torch.set_num_threads(1). Step = zero_grad (set_to_none, PyTorch's default), forward + loss,
backward (DDP waits for the last bucket's all-reduce at its end), optimizer step.

Time (as bench_sharded): a barrier, W untimed warm-up steps, the memory steps (below: untimed, their
effect on the training state undone), then N timed steps; every rank times
each step with time.perf_counter() from before zero_grad to after opt.step() (bench_sharded:
steady_clock over the same span), and the phases: forward (zero_grad + forward + loss), backward,
optimizer. A rank's figure is the median over its timed steps; step_ms and each phase is the
larger of the two ranks' medians. final_loss: rank 0's loss at the last timed step.

Peak memory (the same quantity as bench_sharded's peak_bytes): the largest number of bytes live in
libtorch's CPU allocator at any moment of a steady-state step, on the larger rank. bench_sharded
installs tandem's host allocator as libtorch's CPU allocator before any tensor exists and reads
its peak allocated bytes over the timed steps. PyTorch has no CPU allocator statistics, so here,
as in bench/sharded/pytorch_zero.py, AllocatorLog (bench/pytorch_cpu_memory.py: how, its cost,
the c10 internals it relies on) reads c10's default CPU allocator's running total of live bytes:
  - right after `import torch`, before any tensor of the run exists, c10's
    FLAGS_caffe2_report_cpu_memory_usage is set (ctypes on libc10.so), so the total counts every
    block, allocated and freed on any thread (Gloo's and DDP's included);
  - after the warm-up, M steps (--memory-steps, default 2) run with c10's log level lowered to
    INFO and stderr redirected to a temporary file: c10 logs each allocation and free with the
    total after it, and a marker at each phase boundary splits the log into the phases.
    peak_forward_bytes, peak_backward_bytes, peak_optimizer_bytes: the highest total in each
    phase (at least the total it started with); peak_bytes: the largest of the three;
    allocated_between_steps_bytes: the total after the last memory step. A rank's figure is the
    largest over its memory steps; each reported figure is the larger of the ranks';
  - the memory steps start from a copy of the training state (parameters, AdamW's state) kept in
    numpy (outside the allocator, not counted), copied back afterwards; the flag is then off, so
    the timed steps pay nothing for it and they and final_loss are those of a run without the
    memory steps.
  The total counts every tensor the allocator serves: parameters, gradients, AdamW's moments (and
  its 4-byte step tensors), DDP's buckets (with PyTorch's default gradient_as_bucket_view=False
  they are separate from the gradients), activations, inputs, temporaries of autocast and
  the optimizer. It counts the bytes requested; tandem's allocator counts each block rounded up
  to 512 bytes after a 64-byte header, at most 576 bytes more per live tensor (< 0.1 MiB here).
  With --memory-steps 0 nothing of this runs; where it cannot run or its log cannot be read the
  peak keys are absent and peak_error says why.

parameter_bytes, gradient_bytes, optimizer_state_bytes: the model's parameters, their .grad and
AdamW's exp_avg/exp_avg_sq (tensors of more than 0 dimensions) after the last step, as
bench_sharded reports them under DDP. Rank 0 prints one JSON object and writes it to --out.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from pytorch_cpu_memory import AllocatorLog  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


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
    ap.add_argument("--autocast", choices=["off", "bf16"], default="off")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--memory-steps", type=int, default=2,
                    help="untimed steps after the warm-up that measure the peak (0: no memory figure)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    # Before any tensor of the run exists, so that the allocator's total counts every block.
    alloc_log = AllocatorLog() if args.memory_steps > 0 else None
    memory_error = alloc_log.error if alloc_log else "not measured (--memory-steps 0)"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = make_model()
    parameters = sum(p.numel() for p in model.parameters())
    torch.manual_seed(1000 + rank)
    x = torch.randn(args.batch, 1024)
    y = torch.randn(args.batch, 1024)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    use_autocast = args.autocast == "bf16"

    def step(mark=None):
        t0 = time.perf_counter()
        if mark:
            mark("forward")
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_autocast):
            loss = F.mse_loss(ddp(x).float(), y)
        t1 = time.perf_counter()
        if mark:
            mark("backward")
        loss.backward()
        t2 = time.perf_counter()
        if mark:
            mark("optimizer")
        opt.step()
        t3 = time.perf_counter()
        if mark:
            mark("between")
        return loss, ((t3 - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)

    def training_state():
        state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
        return list(model.parameters()) + state

    dist.barrier()
    for _ in range(args.warmup):
        step()

    peaks, between = None, None
    if memory_error is None:
        with torch.no_grad():
            saved = [t.detach().numpy().copy() for t in training_state()]  # numpy: not counted
        alloc_log.start()
        for _ in range(args.memory_steps):
            step(alloc_log.mark)
        peaks, between = alloc_log.stop()
        memory_error = alloc_log.error
        with torch.no_grad():
            for t, a in zip(training_state(), saved):
                t.copy_(torch.from_numpy(a))
        del saved
        dist.barrier()

    times = []
    for _ in range(args.steps):
        loss, t = step()
        times.append(t)
    final_loss = float(loss.item())

    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    params = list(model.parameters())
    mine = [statistics.median(t[i] for t in times) for i in range(4)]
    mine += [float(tensor_bytes(params)), float(tensor_bytes(p.grad for p in params)),
             float(tensor_bytes(state))]
    mine += [-1.0] * 5 if peaks is None else [float(max(peaks.values()))] + [
        float(peaks[k]) for k in AllocatorLog.PHASES] + [float(between)]
    gathered = [torch.empty(len(mine), dtype=torch.float64) for _ in range(size)]
    dist.all_gather(gathered, torch.tensor(mine, dtype=torch.float64))
    per_rank = [g.tolist() for g in gathered]
    if rank == 0:
        def worst(i):
            return max(r[i] for r in per_rank)
        result = {
            "mode": "pytorch_ddp", "autocast": args.autocast, "param_dtype": "fp32", "ranks": size,
            "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
            "memory_steps": args.memory_steps, "threads": torch.get_num_threads(),
            "parameters": parameters, "torch": torch.__version__, "python": sys.version.split()[0],
            "step_ms": round(worst(0), 4), "forward_ms": round(worst(1), 4),
            "backward_ms": round(worst(2), 4), "optimizer_ms": round(worst(3), 4),
            "rank_step_ms": [round(r[0], 4) for r in per_rank],
            "final_loss": round(final_loss, 6),
            "parameter_bytes": int(worst(4)), "gradient_bytes": int(worst(5)),
            "optimizer_state_bytes": int(worst(6)),
        }
        if memory_error is None and min(r[7] for r in per_rank) >= 0:
            for i, key in enumerate(["peak_bytes"] + ["peak_%s_bytes" % k for k in AllocatorLog.PHASES]
                                    + ["allocated_between_steps_bytes"]):
                result[key] = int(worst(7 + i))
            result["peak_method"] = "c10 CPU allocator's total (FLAGS_caffe2_report_cpu_memory_usage log)"
        else:
            result["peak_error"] = memory_error or "a rank could not measure its peak"
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
