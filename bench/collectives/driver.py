#!/usr/bin/env python3
"""Allreduce (sum) bus bandwidth, float32, 2 ranks, 4 KiB .. 256 MiB: tandem's communicator
(shared memory and TCP) vs torch.distributed's gloo backend from Python (driven by scripts/bench
collectives, which builds bench_collectives and tandemrun). Two programs, each started on 2 ranks,
alternately in rounds (C++, Python, C++, Python, ...):
  bench_collectives (C++, by tandemrun)   tandem (defaults: shared memory) and tandem_tcp
  pytorch_allreduce.py (by torchrun)       pytorch_gloo: torch.distributed's gloo backend
Each measures every size with its own repetitions (same protocol: bench_collectives.cpp's
header); the JSON's figures are medians over rounds of each round's median. Writes
bench/results/collectives.json, one key per line. Full: 3 rounds x 5 repetitions; --quick: 1
round, sizes up to 16 MiB, 3 short repetitions; --rounds N."""
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

args, bench, tandemrun = harness.setup(harness.parser(__doc__), ["bench_collectives", "tandemrun"],
                                       needs="torch.distributed")
if args.rounds is not None and args.rounds < 1:
    harness.fail("--rounds needs a positive number")
python = sys.executable  # the venv's (scripts/env.sh): the torch wheel tandem builds against
torchrun = os.path.join(os.path.dirname(python), "torchrun")
if not os.access(torchrun, os.X_OK):
    harness.fail("%s is missing (run scripts/install-deps)" % torchrun)
peer = os.path.join(harness.REPO, "bench", "collectives", "pytorch_allreduce.py")
# Repetitions per size inside each process; quick runs keep the programs' --quick defaults (3).
quick = args.quick
default_rounds, reps_args = (1, ["--quick"]) if quick else (3, ["--repetitions", "5"])
rounds = args.rounds or default_rounds
command = args.command or "scripts/bench collectives" + (" --quick" if quick else "") + (
    " --rounds %d" % rounds if rounds != default_rounds else "")
peer_command = "torchrun --standalone --nproc-per-node 2 bench/collectives/pytorch_allreduce.py " + " ".join(reps_args)
out = os.path.join(harness.RESULTS, "collectives.json")
revision = harness.source()
describe = harness.describe()
os.environ["OMP_NUM_THREADS"] = "1"  # what tandemrun and torchrun would set; set so neither says so
load = harness.Load()


def launch(label, argv, result):
    """One launch, rank 0's lines without tandemrun's "[rank 0]: " prefix (its table reads as a
    plain table); stops the driver unless it wrote RESULT."""
    print("== collectives %s: %s" % (label, " ".join(argv)), flush=True)
    return load.watch(harness.run_json, label, argv, result, echo=True, strip="[rank 0]: ")


start = time.time()
work = tempfile.mkdtemp(prefix="bench-collectives.", dir=args.build_dir)
try:
    cpp, py = [], []
    for r in range(1, rounds + 1):
        result = os.path.join(work, "cpp-%d.json" % r)
        cpp.append(launch("round %d/%d, C++" % (r, rounds),
                          [tandemrun, "--standalone", "--nproc-per-node", "2", bench, "--out", result,
                           "--command", command, "--revision", describe] + reps_args, result))
        result = os.path.join(work, "py-%d.json" % r)
        py.append(launch("round %d/%d, Python" % (r, rounds),
                         [torchrun, "--standalone", "--nproc-per-node", "2", peer, "--out", result] + reps_args,
                         result))
finally:
    shutil.rmtree(work, ignore_errors=True)
load.end()

# Merge: C++ keys kept (tandem_*, tandem_tcp_*), the peer as pytorch_gloo_*, medians over rounds.
sizes = cpp[0]["sizes_bytes"]
for j in cpp + py:
    if j["sizes_bytes"] != sizes or j["world_size"] != cpp[0]["world_size"]:
        harness.fail("the rounds measured different sizes or world sizes; %s left as it was" % out)
world = cpp[0]["world_size"]
cpp_impls = cpp[0]["implementations"]
impls = cpp_impls + ["pytorch_gloo"]
rounds_of = {k: cpp for k in cpp_impls}
rounds_of["pytorch_gloo"] = py
peer = "pytorch_gloo"


def busbw(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e9 * 2.0 * (world - 1) / world


def per_size(rows):  # [round][size] -> [size][round]
    return [list(col) for col in zip(*rows)]


m = {}
for k in impls:
    per_round = per_size([j[k + "_ms"] for j in rounds_of[k]])
    m[k] = {"per_round": per_round,
            "ms": [statistics.median(v) for v in per_round],
            "per_rep": [sum(reps, []) for reps in zip(*[j[k + "_ms_per_rep"] for j in rounds_of[k]])]}

r4 = lambda v: round(v, 4)
r3 = lambda v: round(v, 3)
o = {
    "benchmark": "allreduce (sum) bus bandwidth, float32: tandem's Gloo communicator vs "
                 "torch.distributed's gloo backend (PyTorch, from Python)",
    "command": cpp[0]["command"],
    "worker_command": cpp[0]["worker_command"],
    "pytorch_gloo_command": peer_command,
    "revision": cpp[0]["revision"],
    "quick": cpp[0]["quick"],
    "machine": cpp[0]["machine"],
    "loadavg_start": cpp[0]["loadavg_start"],
    "loadavg_end": py[-1]["loadavg_end"],
    "world_size": world,
    "threads_per_rank": 1,
    "threads_note": cpp[0]["threads_note"] + "; pytorch_gloo: torch.set_num_threads(1), "
                    "OMP_NUM_THREADS=1, ProcessGroupGloo's defaults (%s worker threads; a "
                    "synchronous all_reduce runs on one of them) plus libgloo's TCP event-loop "
                    "thread" % py[0].get("gloo_worker_threads"),
    "unit": "busbw in GB/s (1e9 B/s) = bytes / time * 2(n-1)/n; *_ms = median over rounds of each "
            "round's median over repetitions of the slowest rank's mean time per allreduce",
    "rounds": rounds,
    "rounds_note": "each round runs bench_collectives (tandem, tandem_tcp; one process pair, "
                   "interleaved per size) and then pytorch_allreduce.py (pytorch_gloo; another "
                   "process pair); *_ms_per_round is each round's median, *_ms_per_rep every "
                   "repetition of every round in round order",
    "implementations": impls,
}
for k in cpp_impls:
    o[k + "_transport"] = cpp[0][k + "_transport"]
o[peer + "_transport"] = py[0][peer + "_transport"]
o.update({
    "torch_version": py[0]["torch_version"],
    "repetitions": cpp[0]["repetitions"],
    "pytorch_gloo_repetitions": py[0]["repetitions"],
    "sizes_bytes": sizes,
    "iterations": per_size([j["iterations"] for j in cpp]),
    "pytorch_gloo_iterations": per_size([j["iterations"] for j in py]),
    "iterations_note": "[size][round]: allreduce ops per timed repetition, sized per process from "
                       "its warm-up (bench_collectives: the slower of tandem and tandem_tcp)",
    "warmup_iterations": cpp[0]["warmup_iterations"],
})
for k in impls:
    o[k + "_ms"] = [r4(v) for v in m[k]["ms"]]
    o[k + "_busbw_gbps"] = [r3(busbw(b, v)) for b, v in zip(sizes, m[k]["ms"])]
for k in cpp_impls:  # busbw ratio = inverse time ratio; > 1: tandem faster
    o[k + "_over_pytorch_gloo"] = [r3(p / t) for p, t in zip(m[peer]["ms"], m[k]["ms"])]
    o[k + "_over_pytorch_gloo_per_round"] = [
        [r3(p / t) for p, t in zip(pr, tr)] for pr, tr in zip(m[peer]["per_round"], m[k]["per_round"])]
for k in impls:
    o[k + "_ms_per_round"] = [[r4(v) for v in row] for row in m[k]["per_round"]]
for k in impls:
    o[k + "_ms_per_rep"] = m[k]["per_rep"]
o["memcpy_gbps"] = r3(statistics.median(j["memcpy_gbps"] for j in cpp))
o["memcpy_gbps_per_round"] = [j["memcpy_gbps"] for j in cpp]
o["memcpy_note"] = cpp[0]["memcpy_note"] + " (median over rounds)"
o["total_s"] = round(time.time() - start, 1)
o["provenance"] = harness.provenance(command, revision, load)
# One key per line, values on one line (as the C++ program writes it).
harness.write_result("collectives", o, lines=True)


def fmt(b):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return "%d %s" % (b // n, unit)
    return "%d B" % b


print()
reps = "%d" % o["repetitions"]
if o["pytorch_gloo_repetitions"] != o["repetitions"]:
    reps += " (pytorch_gloo: %d)" % o["pytorch_gloo_repetitions"]
print("allreduce sum, float32, %d ranks on one host; busbw in GB/s, median over %d round%s "
      "(each the median of %s reps)%s" % (world, rounds, "" if rounds == 1 else "s", reps,
                                          "  [quick]" if o["quick"] else ""))
for k in impls:
    print("  %-12s %s" % (k, o[k + "_transport"]))
ratio_cols = [k + "/" + peer for k in cpp_impls]
print("%8s" % "size" + "".join(" %12s" % k for k in impls) + "".join(" %24s" % c for c in ratio_cols))
for i, b in enumerate(sizes):
    print("%8s" % fmt(b) + "".join(" %12.3f" % o[k + "_busbw_gbps"][i] for k in impls)
          + "".join(" %24.2f" % o[k + "_over_pytorch_gloo"][i] for k in cpp_impls))
print("busbw = bytes/time * 2(n-1)/n, GB/s = 1e9 B/s; ratios are busbw ratios (> 1: tandem faster)")
print("memcpy, one core, 256 MiB (bytes copied / time): %.3f GB/s" % o["memcpy_gbps"])
print("bench collectives: wrote %s in %d s" % (out, time.time() - start))
