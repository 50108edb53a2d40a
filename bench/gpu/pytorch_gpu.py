#!/usr/bin/env python3
"""PyTorch's side of scripts/bench-gpu: the model of bench/gpu/bench_model.h on one GPU, world 1
over NCCL, step time and peak memory per mode; writes one JSON object (--out).

Model: 8 x Linear(4096, 4096) with ReLU between them (134,250,496 fp32 parameters), MSE against a
fixed random target, batch rows as given (default 64), torch.optim.AdamW(lr=1e-3, weight_decay=0.01)
with its defaults (foreach on CUDA). Modes:
  plain       the model and AdamW, nothing else
  ddp         torch.nn.parallel.DistributedDataParallel (defaults)
  fsdp2       torch.distributed.fsdp.fully_shard on each Linear, then on the root (FSDP2, defaults)
  amp_scaler  the plain model in fp32 under torch.autocast("cuda", dtype=torch.float16), with
              torch.amp.GradScaler("cuda") (scale, step, update)
The process group: init_process_group("nccl") over a HashStore, rank 0 of 1 (no launcher).
Time and memory as bench_gpu measures them: W warm-up steps, then N steps, each from a
synchronised GPU to a synchronised GPU; step_ms is their median. peak_bytes is
torch.cuda.max_memory_allocated() (c10's CUDA caching allocator's peak of allocated bytes), reset
after the warm-up and read after the timed steps. Each mode builds its own model; it is freed, with
the allocator's cache, before the next.
  python3 bench/gpu/pytorch_gpu.py --out FILE [--modes plain,ddp,fsdp2,amp_scaler] [--steps N]
          [--warmup W] [--batch B]
--device cpu rehearses the script where no GPU is (Gloo, CPU autocast; no figure of it means
anything)."""
import argparse
import gc
import json
import statistics
import sys
import time

import torch

WIDTH, LAYERS = 4096, 8
MODES = ["plain", "ddp", "fsdp2", "amp_scaler"]
DEVICE = "cuda"  # --device


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def build_model():
    layers = []
    for i in range(LAYERS):
        layers.append(torch.nn.Linear(WIDTH, WIDTH, device=DEVICE))
        if i + 1 < LAYERS:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def run_mode(mode, batch, warmup, steps):
    import torch.distributed as dist  # noqa: F401 (initialised in main)

    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    torch.manual_seed(0)
    model = build_model()
    parameters = sum(p.numel() for p in model.parameters())
    x = torch.randn(batch, WIDTH, device=DEVICE)
    y = torch.randn(batch, WIDTH, device=DEVICE)
    net = model
    scaler = None
    if mode == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0] if DEVICE == "cuda" else None)
    elif mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(DEVICE, (1,))
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif mode == "amp_scaler":
        scaler = torch.amp.GradScaler(DEVICE)
    elif mode != "plain":
        raise SystemExit("pytorch_gpu: unknown mode '%s'" % mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    def step():
        opt.zero_grad()
        if scaler is not None:
            with torch.autocast(DEVICE, dtype=torch.float16):
                out = net(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
        return loss

    for _ in range(warmup):
        step()
    synchronize()
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ms = []
    loss = None
    for _ in range(steps):
        synchronize()
        t0 = time.perf_counter()
        loss = step()
        synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0
    result = {"step_ms": statistics.median(ms), "peak_bytes": peak, "steps_ms": ms,
              "final_loss": loss.item(), "parameters": parameters}
    print("pytorch %-13s %9.3f ms/step  peak %8.1f MiB" % (mode, result["step_ms"], peak / 2**20),
          flush=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    import torch.distributed as dist
    if DEVICE == "cuda":
        if not torch.cuda.is_available():
            sys.exit("pytorch_gpu: no CUDA device (torch.cuda.is_available() is False)")
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    modes = {}
    for mode in [m for m in args.modes.split(",") if m]:
        modes[mode] = run_mode(mode, args.batch, args.warmup, args.steps)
    cuda = DEVICE == "cuda"
    result = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (rehearsal)",
        "device_memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()) if cuda else None,
        "backend": dist.get_backend(),
        "steps": args.steps, "warmup": args.warmup, "batch": args.batch,
        "modes": modes,
    }
    dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
