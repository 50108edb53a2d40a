#!/usr/bin/env python3
"""Activation checkpointing: peak activation memory and step time per checkpoint policy, tandem vs
torch.utils.checkpoint; prints a table and writes bench/results/activation_checkpointing.json
(driven by scripts/bench-activation-checkpointing, which builds bench_activation_checkpointing).
  Model: 16 identical blocks y = x + fc2(silu(fc1(layer_norm(x)))), width 128 (hidden 512),
  batch 4096 rows, MSE, SGD; 1 compute thread. Policies: none, every (each block checkpointed),
  sqrt (4 segments of 4 blocks); the last segment/block stays unchecked, as in PyTorch.
  tandem: bench_activation_checkpointing with tandem's caching allocator installed as the CPU
    allocator: peak = allocated peak during the step - allocated before it; step time median.
  PyTorch: bench/activation_checkpointing/pytorch_checkpoint.py (the torch wheel of scripts/env.sh,
    checkpoint_sequential): step time; peak resident size during the step with every large block
    mmapped (MALLOC_MMAP_THRESHOLD_=65536), and the C++ program measured the same way as a check.
Runs are interleaved in rounds (policy order rotated). Others share the cores: each round waits
(up to 3 min) until other processes use < 0.3 cores, and a timing run they disturbed (>= 0.3
cores beside it) is repeated up to twice. Full: 3 rounds x 8 timed steps (~6 min without
waiting); --quick: 1 round x 2 timed steps (~1 min), marked "quick": true."""
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

args, bench = harness.setup(harness.parser(__doc__), ["bench_activation_checkpointing"], needs="torch")
python = sys.executable  # the venv's (scripts/env.sh): the torch wheel tandem builds against
quick = args.quick
command = args.command or "scripts/bench activation_checkpointing" + (" --quick" if quick else "")
peer = os.path.join(harness.REPO, "bench", "activation_checkpointing", "pytorch_checkpoint.py")
policies = ["none", "every", "sqrt"]
model = {"blocks": 16, "batch": 4096, "dim": 128}
warmup, steps, rounds = (1, 2, 1) if quick else (2, 8, 3)
rounds = args.rounds or rounds
# What runs for each policy in a round: (kind, argv builder, extra environment).
kinds = ["tandem", "pytorch", "pytorch_rss", "cpp_rss"]
mmap_env = {"MALLOC_MMAP_THRESHOLD_": "65536"}
os.environ["OMP_NUM_THREADS"] = "1"


def argv_of(kind, policy, out):
    common = ["--policy", policy, "--blocks", str(model["blocks"]), "--batch", str(model["batch"]),
              "--dim", str(model["dim"]), "--out", out]
    if kind == "tandem":
        return [bench, "--memory", "tandem", "--steps", str(steps), "--warmup", str(warmup)] + common
    if kind == "cpp_rss":
        return [bench, "--memory", "rss", "--steps", "2", "--warmup", "1"] + common
    if kind == "pytorch":
        return [python, peer, "--steps", str(steps), "--warmup", str(warmup)] + common
    return [python, peer, "--memory", "rss", "--steps", "2", "--warmup", "1"] + common


retries = [0]


def run(kind, policy, out):
    """A timing run that other processes disturbed (> 0.3 cores busy beside it) is repeated, at
    most twice, after waiting for quiet; the last attempt counts."""
    env = dict(os.environ, **(mmap_env if kind.endswith("_rss") else {}))
    for attempt in range(3):
        res, other = load.timed(harness.run_json, "%s %s" % (policy, kind), argv_of(kind, policy, out), out, env=env)
        if kind not in ("tandem", "pytorch"):
            return res
        if other < harness.QUIET_CORES or attempt == 2:
            load.foreign.append(other)
            res["other_processes_cpu_cores"] = round(other, 3)
            return res
        retries[0] += 1
        print("  (%s %s disturbed: other processes used %.2f cores; again)" % (policy, kind, other), flush=True)
        harness.wait_for_quiet(limit_s=60)


revision = harness.source()
revision = {"commit": revision["commit"], "describe": harness.describe(),
            "uncommitted_changes": revision["uncommitted_changes"]}
start = time.time()
load = harness.Load(warn_above=None)  # each round waits for quiet instead
runs = {k: {p: [] for p in policies} for k in kinds}
waits, load_rounds = [], []
with tempfile.TemporaryDirectory() as tmp:
    for r in range(rounds):
        waited, busy = harness.wait_for_quiet()
        waits.append(waited)
        load_rounds.append(harness.loadavg())
        print("round %d/%d (waited %.0f s for quiet: other processes use %.2f cores; load %s)" % (
            r + 1, rounds, waited, busy, load_rounds[-1]), flush=True)
        for pol in harness.rotated(policies, r):
            for kind in kinds:
                res = run(kind, pol, os.path.join(tmp, "%s_%s_%d.json" % (kind, pol, r)))
                runs[kind][pol].append(res)
                mem = res.get("peak_bytes", res.get("peak_rss_bytes"))
                print("  %-6s %-12s %9.1f ms%s" % (pol, kind, res["step_ms"],
                      "  peak %7.1f MiB" % (mem / 2**20) if mem is not None else ""), flush=True)
load.end()


def med(kind, pol, key="step_ms"):
    return harness.median(runs[kind][pol], key)


def peak(kind, pol, key):
    return max(x[key] for x in runs[kind][pol])


result = {
    "command": command,
    "quick": quick,
    "revision": revision,
    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "machine": {
        "cores": os.cpu_count(),
        "cpu": harness.cpu_model(),
        "load_average_before": load.before,
        "load_average_after": load.after,
        "load_average_at_round_start": load_rounds,
        "waited_for_quiet_s": waits,
        "disturbed_runs_repeated": retries[0],
        "other_processes_cpu_cores_mean": round(statistics.mean(load.foreign), 3),
        "other_processes_cpu_cores_max": round(max(load.foreign), 3),
        "load_note": ("other_processes_cpu_cores = busy CPU time (/proc/stat) minus the timed "
                      "run's own CPU time, divided by its wall time, over the tandem and PyTorch "
                      "timing runs (the benchmark itself uses 1 core). Each round starts once "
                      "others use < 0.3 cores (or after 3 min); a timing run during which they "
                      "used >= 0.3 cores is repeated up to twice"),
    },
    "setup": ("16 identical blocks y = x + fc2(silu(fc1(layer_norm(x)))), dim 128, hidden 512, "
              "batch 4096 rows, fp32, MSE loss, SGD lr 1e-3, 1 compute thread "
              "(OMP_NUM_THREADS=1, set_num_threads(1)). Step = forward + loss + backward + "
              "optimizer step + zero_grad. Policies: none; every = each block checkpointed, the "
              "last unchecked (ActivationCheckpointPolicy::every(1) / checkpoint_sequential(model, 16)); "
              "sqrt = 4 segments of 4 blocks, the last unchecked (ActivationCheckpointPolicy::sqrt() / "
              "checkpoint_sequential(model, 4)). PyTorch: 1.13 reentrant torch.utils.checkpoint, "
              "input requires grad under every policy (the reentrant checkpoint needs it)."),
    "method": {
        "peak_bytes": ("tandem's caching allocator installed as libtorch's CPU allocator; per "
                       "timed step: reset peaks, allocated bytes before the step, allocated peak "
                       "during it; peak_bytes = max over steps and rounds of (peak - before). "
                       "Parameter gradients exist from the warm-up on, so this is activations, "
                       "their gradients and temporaries"),
        "peak_requested_bytes": "the same with the bytes requested (before pool rounding; +64 B header per tensor)",
        "step_ms": "median over timed steps per run, then median over rounds",
        "pytorch_peak_rss_bytes": ("PyTorch has no CPU allocator statistics: peak resident set "
                                   "size during a step (VmHWM reset through /proc/self/clear_refs) "
                                   "minus resident size before it, with MALLOC_MMAP_THRESHOLD_=65536 "
                                   "so every large block is mmapped fresh and unmapped on free; "
                                   "page-granular, ignores blocks under 64 KiB. tandem_cpp_peak_rss_bytes "
                                   "is the C++ program (libtorch's default allocator) measured the "
                                   "same way, to check the method against peak_bytes"),
    },
    "model": dict(model, hidden=4 * model["dim"], parameters=model["blocks"] * (
        2 * model["dim"] + 2 * 4 * model["dim"] * model["dim"] + 5 * model["dim"])),
    "rounds": rounds, "warmup_steps": warmup, "timed_steps": steps,
    "seconds": None,
    "policies": {},
}
base_peak = peak("tandem", "none", "peak_bytes")
base_ms = med("tandem", "none")
py_base_ms = med("pytorch", "none")
py_base_rss = peak("pytorch_rss", "none", "peak_rss_bytes")
rows = []
for pol in policies:
    t_ms, p_ms = med("tandem", pol), med("pytorch", pol)
    t_peak = peak("tandem", pol, "peak_bytes")
    p_rss = peak("pytorch_rss", pol, "peak_rss_bytes")
    t_ovh, p_ovh = t_ms / base_ms - 1, p_ms / py_base_ms - 1
    entry = {
        "plan": runs["tandem"][pol][0]["plan"],
        "peak_bytes": t_peak,
        "peak_requested_bytes": peak("tandem", pol, "peak_requested_bytes"),
        "step_ms": round(t_ms, 2),
        "forward_ms": round(med("tandem", pol, "forward_ms"), 2),
        "backward_ms": round(med("tandem", pol, "backward_ms"), 2),
        "runs_step_ms": [round(x["step_ms"], 2) for x in runs["tandem"][pol]],
        "peak_reduction_vs_none": round(base_peak / t_peak, 3),
        "step_overhead_vs_none": round(t_ovh, 4),
        "pytorch": {
            "step_ms": round(p_ms, 2),
            "forward_ms": round(med("pytorch", pol, "forward_ms"), 2),
            "backward_ms": round(med("pytorch", pol, "backward_ms"), 2),
            "runs_step_ms": [round(x["step_ms"], 2) for x in runs["pytorch"][pol]],
            "step_overhead_vs_none": round(p_ovh, 4),
            "peak_rss_bytes": p_rss,
            "peak_rss_reduction_vs_none": round(py_base_rss / p_rss, 3),
        },
        "tandem_cpp_peak_rss_bytes": peak("cpp_rss", pol, "peak_rss_bytes"),
    }
    if pol != "none":
        entry["tandem_overhead_to_pytorch_overhead"] = round(t_ovh / p_ovh, 3) if p_ovh > 0 else None
        entry["tandem_overhead_not_worse_than_pytorch"] = bool(t_ovh <= p_ovh)
    result["policies"][pol] = entry
    rows.append((pol, t_peak, entry["peak_reduction_vs_none"], t_ms, t_ovh, p_ms, p_ovh, p_rss,
                 entry["tandem_cpp_peak_rss_bytes"]))

sq = result["policies"]["sqrt"]
not_worse = {p: result["policies"][p]["tandem_overhead_not_worse_than_pytorch"] for p in ("every", "sqrt")}
goal = {
    "sqrt_peak_reduction_at_least_3x": sq["peak_reduction_vs_none"] >= 3.0,
    "sqrt_step_overhead_at_most_40_percent": sq["step_overhead_vs_none"] <= 0.40,
    "tandem_overhead_not_worse_than_pytorch": not_worse,
}
goal["met"] = bool(goal["sqrt_peak_reduction_at_least_3x"] and goal["sqrt_step_overhead_at_most_40_percent"]
                   and all(not_worse.values()))
result["goal"] = goal
result["seconds"] = round(time.time() - start, 1)

print()
print("16 blocks, batch 4096, dim 128, 1 thread; medians over %d round(s)%s" % (rounds, "  [quick]" if quick else ""))
print("%-6s %11s %8s %10s %9s | %11s %9s %12s | %12s" % (
    "policy", "peak MiB", "reduce", "step ms", "overhead", "pytorch ms", "overhead", "py rss MiB", "c++ rss MiB"))
for pol, t_peak, red, t_ms, t_ovh, p_ms, p_ovh, p_rss, c_rss in rows:
    print("%-6s %11.1f %7.2fx %10.1f %8.1f%% | %11.1f %8.1f%% %12.1f | %12.1f" % (
        pol, t_peak / 2**20, red, t_ms, 100 * t_ovh, p_ms, 100 * p_ovh, p_rss / 2**20, c_rss / 2**20))
print("goal: sqrt peak reduction >= 3x: %s; sqrt overhead <= 40%%: %s; tandem overhead <= PyTorch's: every %s, "
      "sqrt %s => %s" % (goal["sqrt_peak_reduction_at_least_3x"], goal["sqrt_step_overhead_at_most_40_percent"],
                         not_worse["every"], not_worse["sqrt"], "MET" if goal["met"] else "NOT met"))
print("load average before %s, after %s; other processes used %.2f cores on average during timed runs "
      "(max %.2f); %.0f s" % (load.before, load.after, statistics.mean(load.foreign), max(load.foreign),
                              time.time() - start))
result["provenance"] = harness.provenance(command, revision, load)
print("bench-activation-checkpointing: wrote %s" % harness.write_result("activation_checkpointing", result))
