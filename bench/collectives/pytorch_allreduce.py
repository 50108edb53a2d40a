#!/usr/bin/env python3
"""PyTorch peer of bench_collectives: allreduce bus bandwidth of torch.distributed's gloo backend.

Run on the venv's interpreter (scripts/env.sh), one process per rank, started by torchrun or
tandemrun (both set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT for env:// init):

  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 \
      bench/collectives/pytorch_allreduce.py --out FILE [--quick] [--sizes B ...] [--repetitions R]

What a user writes: dist.init_process_group("gloo") with its defaults, CPU float32 tensors,
torch.set_num_threads(1), synchronous dist.all_reduce(t) (sum, in place). The measurement mirrors
bench/collectives/bench_collectives.cpp: for each size (float32, 4 KiB .. 256 MiB; 16 MiB in
--quick) one correctness check (rank r holds (i % 251) * (r + 1); every element must be the exact
sum, and every rank must have run the same size), a warm-up (max(3, min(50, 4 MiB / bytes)) ops),
then `repetitions` timed blocks, each a barrier followed by `iterations` all_reduce back to back.
`iterations` is sized from the warm-up (slowest rank) so a block takes about 0.25 s (0.04 s in
--quick), clamped to [3, 2000] ([2, 200]). Timed blocks reduce zeros. A block's time is the
slowest rank's; the figure is the median over the blocks. busbw = bytes / time * 2(n-1)/n in GB/s
(1e9 B/s). Rank 0 prints one line per size and writes one JSON object (scripts/bench collectives
merges it with the C++ program's).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

KiB = 1024
MiB = 1024 * KiB


def settings_for(quick):
    largest = 16 * MiB if quick else 256 * MiB
    sizes = []
    b = 4 * KiB
    while b <= largest:
        sizes.append(b)
        b *= 4
    if quick:
        return dict(sizes=sizes, repetitions=3, target_rep_s=0.04, min_iters=2, max_iters=200)
    return dict(sizes=sizes, repetitions=6, target_rep_s=0.25, min_iters=3, max_iters=2000)


def warmup_for(nbytes):
    return max(3, min(50, 4 * MiB // nbytes))


def format_size(nbytes):
    if nbytes >= MiB and nbytes % MiB == 0:
        return "%d MiB" % (nbytes // MiB)
    if nbytes >= KiB and nbytes % KiB == 0:
        return "%d KiB" % (nbytes // KiB)
    return "%d B" % nbytes


def busbw_gbps(nbytes, ms, world):
    return nbytes / (ms * 1e-3) / 1e9 * 2.0 * (world - 1) / world


def loadavg():
    with open("/proc/loadavg") as f:
        return f.readline().strip()


def pattern_row(scale):
    return torch.arange(251, dtype=torch.float32) * scale


def fill_pattern(t, rank):
    # (i % 251) * (rank + 1): integers below 2^24, so float32 sums are exact in any order. Filled by
    # doubling copies of the first period: no temporary as large as the tensor.
    n = t.numel()
    row = pattern_row(rank + 1)
    k = min(n, 251)
    t[:k].copy_(row[:k])
    while k < n:
        m = min(k, n - k)
        t[k:k + m].copy_(t[:m])
        k += m


def check_pattern(t, world, nbytes):
    n = t.numel()
    row = pattern_row(world * (world + 1) // 2)
    m = n // 251
    bad = []
    if m:
        rows = torch.nonzero((t[:m * 251].view(m, 251) != row).any(dim=1))
        if rows.numel():
            r = int(rows[0, 0])
            bad.append(r * 251 + int(torch.nonzero(t[r * 251:(r + 1) * 251] != row)[0, 0]))
    if not bad and n > m * 251:
        tail = torch.nonzero(t[m * 251:] != row[:n - m * 251])
        if tail.numel():
            bad.append(m * 251 + int(tail[0, 0]))
    if bad:
        i = bad[0]
        raise RuntimeError("pytorch_allreduce: gloo allreduce of %s is wrong: element %d is %s, "
                           "expected %s"
                           % (format_size(nbytes), i, float(t[i]), float(row[i % 251])))


def allreduce(t):
    dist.all_reduce(t)  # synchronous, sum, in place: as a user writes it
    return t.numel() * t.element_size()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file rank 0 writes")
    ap.add_argument("--quick", action="store_true", help="sizes up to 16 MiB, fewer iterations")
    ap.add_argument("--sizes", type=int, nargs="+", default=None,
                    help="measure only these sizes in bytes (multiples of 4)")
    ap.add_argument("--repetitions", type=int, default=0, help="override the repetitions per size")
    args = ap.parse_args()

    started = time.perf_counter()
    load_start = loadavg()
    torch.set_num_threads(1)
    s = settings_for(args.quick)
    if args.sizes:
        for b in args.sizes:
            if b <= 0 or b % 4 != 0:
                sys.exit("pytorch_allreduce: --sizes %d is not a positive multiple of 4 bytes." % b)
        s["sizes"] = args.sizes
    if args.repetitions:
        if not 1 <= args.repetitions <= 1000:
            sys.exit("pytorch_allreduce: --repetitions must be in [1, 1000]")
        s["repetitions"] = args.repetitions

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        sys.exit("pytorch_allreduce: needs at least 2 ranks (got %d); start it with "
                 "torchrun --nproc-per-node 2." % world)
    threads = None
    try:  # the worker threads of the default ProcessGroupGloo (one runs each op)
        threads = dist.group.WORLD._get_backend(torch.device("cpu")).options._threads
    except Exception:  # private API; only for the label
        pass

    results = []
    for nbytes in s["sizes"]:
        t = torch.empty(nbytes // 4, dtype=torch.float32)

        # Correctness, once per size; every rank must have run the same size.
        fill_pattern(t, rank)
        seen = allreduce(t)
        check_pattern(t, world, nbytes)
        all_seen = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(all_seen, torch.tensor([seen], dtype=torch.int64))
        for r, got in enumerate(all_seen):
            if int(got) != nbytes:
                raise RuntimeError("pytorch_allreduce: size mismatch at %s: rank %d ran gloo on %d "
                                   "bytes" % (format_size(nbytes), r, int(got)))
        t.zero_()  # timed runs reduce zeros: values stay finite however many iterations run

        warmup = warmup_for(nbytes)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(warmup):
            allreduce(t)
        warm_ms = torch.tensor([(time.perf_counter() - t0) * 1e3 / warmup], dtype=torch.float64)
        dist.all_reduce(warm_ms, op=dist.ReduceOp.MAX)
        iterations = int(min(max(math.ceil(s["target_rep_s"] * 1e3 / float(warm_ms)),
                                 s["min_iters"]), s["max_iters"]))

        mine = []
        for _ in range(s["repetitions"]):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iterations):
                allreduce(t)
            mine.append((time.perf_counter() - t0) * 1e3 / iterations)
        # A repetition takes as long as its slowest rank.
        times = torch.tensor(mine, dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        per_rep = times.tolist()
        med = statistics.median(per_rep)
        if rank == 0:
            sys.stderr.write("pytorch_allreduce: %s done (ms per op: pytorch_gloo %.4f)\n"
                             % (format_size(nbytes), med))
            sys.stderr.flush()
        results.append(dict(bytes=nbytes, iterations=iterations, warmup=warmup, ms_per_rep=per_rep,
                            median_ms=med))

    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return 0

    version = torch.__version__
    transport = ("torch.distributed gloo (torch %s): dist.init_process_group(\"gloo\") defaults "
                 "(ProcessGroupGloo%s), synchronous dist.all_reduce; libgloo's allreduce over TCP "
                 "on this host" % (version, ", %d worker threads, one runs each op" % threads
                                   if threads else ""))
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        transport += " (GLOO_SOCKET_IFNAME=%s)" % os.environ["GLOO_SOCKET_IFNAME"]
    out = {
        "implementation": "pytorch_gloo",
        "pytorch_gloo_transport": transport,
        "torch_version": version,
        "world_size": world,
        "torch_num_threads": torch.get_num_threads(),
        "gloo_worker_threads": threads,
        "repetitions": s["repetitions"],
        "target_rep_s": s["target_rep_s"],
        "sizes_bytes": [r["bytes"] for r in results],
        "iterations": [r["iterations"] for r in results],
        "warmup_iterations": [r["warmup"] for r in results],
        "pytorch_gloo_ms": [round(r["median_ms"], 4) for r in results],
        "pytorch_gloo_busbw_gbps": [round(busbw_gbps(r["bytes"], r["median_ms"], world), 3)
                                    for r in results],
        "pytorch_gloo_ms_per_rep": [[round(v, 4) for v in r["ms_per_rep"]] for r in results],
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "total_s": round(time.perf_counter() - started, 1),
    }
    print("pytorch_gloo: %s" % transport)
    print("%8s %6s %12s" % ("size", "iters", "pytorch_gloo"))
    for r in results:
        print("%8s %6d %12.3f" % (format_size(r["bytes"]), r["iterations"],
                                  busbw_gbps(r["bytes"], r["median_ms"], world)))
    print("busbw in GB/s (1e9 B/s) = bytes/time * 2(n-1)/n, median of %d reps" % s["repetitions"])
    sys.stdout.flush()
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
