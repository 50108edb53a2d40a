#!/usr/bin/env python3
"""PyTorch peer of bench_sharded: the same model, batch and AdamW step, in Python.

Runs on the torch wheel of the project's virtual environment (scripts/env.sh: $TANDEM_PYTHON),
one process per rank, started by tandemrun or torchrun (they set RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT for env:// init):

  tandemrun --standalone --nproc-per-node 2 "$TANDEM_PYTHON" bench/sharded/pytorch_zero.py \
      --mode {ddp|zero|fsdp2} --batch B --steps N [--warmup W] [--memory-steps M] --out FILE

  ddp    torch.nn.parallel.DistributedDataParallel over gloo + torch.optim.AdamW
  zero   the same DDP + torch.distributed.optim.ZeroRedundancyOptimizer(optimizer_class=AdamW),
         default options (the optimizer state sharded; after the step each rank broadcasts the
         parameters it owns)
  fsdp2  FSDP2: torch.distributed.fsdp.fully_shard on each Linear, then on the root Sequential
         (each Linear one parameter group, as each Linear is a ShardedUnit at tandem's stage 3),
         over a 1-D CPU DeviceMesh of the world (gloo; the mesh is named because fully_shard's
         default mesh is the accelerator's where there is one); default options otherwise:
         reshard_after_forward=None (True for every Linear, False for the root, which holds no
         parameters of its own), no mixed precision, no offload, implicit prefetching. AdamW over
         the sharded parameters (DTensors): it steps this rank's shards only

Model: Linear(1024,2048), ReLU, 3 x (Linear(2048,2048), ReLU), Linear(2048,1024); MSE loss;
AdamW lr 1e-3, weight decay 0.01; fp32; torch.set_num_threads(1). Inputs/targets random, seeded
per rank, made once. Step = zero_grad, forward, loss, backward, optimizer step. A rank's figure is
the median of its timed steps; the reported step time is the larger of the ranks' medians (as in
the C++ program). Phases as bench_sharded's: forward = zero_grad + forward + loss, backward,
optimizer step.

Training state (after the timed steps; a sharded tensor counted by its local shard):
parameter_bytes, gradient_bytes, optimizer_state_bytes (AdamW's exp_avg and exp_avg_sq, not the
scalar step) and their sum state_bytes.

Memory: peak_bytes is the same quantity as bench_sharded's: the bytes held by libtorch's CPU
allocator (every CPU tensor's storage, from any thread: parameters, gradients, optimizer state,
activations, the batch, the collectives' tensors; not Gloo's or Python's own buffers), at its
highest during a step. bench_sharded installs tandem's allocator and reads its allocated-bytes
peak (block sizes after tandem's rounding, slightly above the requested sizes); here c10's default
CPU allocator counts the same storages (requested sizes), read by AllocatorLog
(bench/pytorch_cpu_memory.py, shared with bench/precision/pytorch_amp.py). Its flag
FLAGS_caffe2_report_cpu_memory_usage is set through ctypes right after `import torch`, before any
tensor exists, so that it tracks every allocation and free with the total it holds after each;
during the memory steps the log level is lowered to INFO so that it writes one line per allocation
and free ("C10 alloc|deleted N bytes, total alloc T bytes") to a temporary file that stderr is
redirected to, with a marker line at each phase boundary. peak_<phase>_bytes = the highest total
in the phase (at least the total it started with); peak_bytes = the largest of the three;
allocated_between_steps_bytes = the total after the last memory step. The memory steps (M, default
N) run after the warm-up, from a copy of the training state kept in numpy (outside c10's allocator,
so not counted); the state is then copied back and the timed steps run with the flag off (tracking
costs about 2 us per allocation and free), so the timed steps and the final loss are those of a
run without the memory steps (W warm-up + N timed steps, as bench_sharded's). Where the flag cannot
be set (a torch without these symbols) the peak figures are null and peak_error says why. A rank's
peak is the largest over its memory steps; the reported figure is the larger of the ranks'.
Rank 0 writes one JSON object.
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["ddp", "zero", "fsdp2"], default="zero")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--memory-steps", type=int, default=None,
                    help="steps whose allocator peak is measured (default: --steps; 0: none)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    memory_steps = args.steps if args.memory_steps is None else args.memory_steps

    alloc_log = AllocatorLog()  # first: every tensor below is counted

    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, size = dist.get_rank(), dist.get_world_size()

    def local(t):  # a DTensor's shard on this rank (FSDP2's parameters, gradients, AdamW state)
        return t.to_local() if hasattr(t, "to_local") else t

    def tensor_bytes(tensors):
        return sum(local(t).numel() * local(t).element_size() for t in tensors if torch.is_tensor(t))

    torch.manual_seed(0)
    layers = [nn.Linear(1024, 2048), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(2048, 2048), nn.ReLU()]
    layers.append(nn.Linear(2048, 1024))
    model = nn.Sequential(*layers)
    torch.manual_seed(1000 + rank)
    x = torch.randn(args.batch, 1024)
    y = torch.randn(args.batch, 1024)
    options = ""
    if args.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (size,))
        for m in model:
            if isinstance(m, nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        net = model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        local_opt = opt
        options = ("fully_shard(Linear, mesh=cpu) x 5, then fully_shard(root); reshard_after_forward="
                   "None (True for the Linears)")
    else:
        net = nn.parallel.DistributedDataParallel(model)
        if args.mode == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                          lr=1e-3, weight_decay=0.01)
            local_opt = opt.optim
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
            local_opt = opt
    loss_fn = nn.MSELoss()

    def step(mark=None):
        t0 = time.perf_counter()
        if mark:
            mark("forward")
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        t1 = time.perf_counter()
        if mark:
            mark("backward")
        loss.backward()  # DDP: waits for every bucket's all-reduce; FSDP2: reduce-scatters
        t2 = time.perf_counter()
        if mark:
            mark("optimizer")
        opt.step()  # ZeroRedundancyOptimizer: steps its shard, then broadcasts the parameters
        t3 = time.perf_counter()
        if mark:
            mark("between")
        return loss, t0, t1, t2, t3

    def training_state():
        params = [local(p) for p in model.parameters()]
        state = [local(t) for s in local_opt.state.values() for t in s.values() if torch.is_tensor(t)]
        return params + state

    dist.barrier()
    for _ in range(args.warmup):
        step()

    peaks, between = None, None
    if memory_steps > 0 and alloc_log.error is None:
        with torch.no_grad():
            saved = [t.detach().numpy().copy() for t in training_state()]  # numpy: not counted
        alloc_log.start()
        for _ in range(memory_steps):
            step(alloc_log.mark)
        peaks, between = alloc_log.stop()
        with torch.no_grad():
            for t, a in zip(training_state(), saved):
                t.copy_(torch.from_numpy(a))
        del saved
        dist.barrier()
    elif alloc_log.error is None:
        alloc_log._report.value = False

    steps, fwd, bwd, opt_ms = [], [], [], []
    loss = None
    for _ in range(args.steps):
        loss, t0, t1, t2, t3 = step()
        steps.append((t3 - t0) * 1e3)
        fwd.append((t1 - t0) * 1e3)
        bwd.append((t2 - t1) * 1e3)
        opt_ms.append((t3 - t2) * 1e3)

    state = [t for s in local_opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    trained = list(model.parameters())
    param_bytes = tensor_bytes(trained)
    grad_bytes = tensor_bytes(p.grad for p in trained)
    state_bytes = param_bytes + grad_bytes + tensor_bytes(state)
    peak = [-1.0] * 5 if peaks is None else [float(max(peaks.values()))] + [
        float(peaks[k]) for k in AllocatorLog.PHASES] + [float(between)]
    mine = torch.tensor([statistics.median(steps), statistics.median(fwd), statistics.median(bwd),
                         statistics.median(opt_ms), float(loss.item()), float(state_bytes),
                         float(tensor_bytes(state)), float(param_bytes), float(grad_bytes)] + peak,
                        dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(gathered, mine)
    per_rank = [g.tolist() for g in gathered]
    if rank == 0:
        def avg(i):
            return sum(r[i] for r in per_rank) / size

        def largest(i):
            v = max(r[i] for r in per_rank)
            return None if v < 0 else int(v)

        result = {
            "mode": "pytorch_" + args.mode, "ranks": size, "batch": args.batch,
            "steps": args.steps, "warmup": args.warmup, "memory_steps": memory_steps,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": sys.version.split()[0],
            "step_ms": round(max(r[0] for r in per_rank), 4),
            "rank_step_ms": [round(r[0], 4) for r in per_rank],
            "forward_ms": round(avg(1), 4), "backward_ms": round(avg(2), 4),
            "optimizer_ms": round(avg(3), 4), "final_loss": round(per_rank[0][4], 6),
            "state_bytes": largest(5),
            "optimizer_state_bytes": largest(6),
            "parameter_bytes": largest(7),
            "gradient_bytes": largest(8),
            "peak_bytes": largest(9),
            "peak_forward_bytes": largest(10),
            "peak_backward_bytes": largest(11),
            "peak_optimizer_bytes": largest(12),
            "allocated_between_steps_bytes": largest(13),
            "peak_method": "c10 CPU allocator's total (FLAGS_caffe2_report_cpu_memory_usage log)",
        }
        if alloc_log.error:
            result["peak_error"] = alloc_log.error
        if options:
            result["options"] = options
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
