#!/usr/bin/env python3
"""Data-parallel step time, 2 ranks x 1 compute thread on this machine; prints a table and writes
bench/results/data_parallel.json (driven by scripts/bench-data-parallel, which builds
bench_data_parallel and tandemrun).
  W1: MLP 1024 -> 4x2048 ReLU -> 1024, MSE, SGD, fp32, batch 32 per rank
  W2: the same model, batch 4 per rank
For each: local step (no communication, still 2 processes), tandem::DistributedDataParallel
(defaults), the naive per-parameter allreduce loop, PyTorch DDP over gloo
(bench/data_parallel/pytorch_ddp.py on the venv's torch, scripts/env.sh), and the local PyTorch
step for reference; tandem_no_flight is tandem with the flight recorder off (what it costs, issue
19). Modes are interleaved in rounds (order rotated each round); each figure is the median over
rounds of the per-run step time (the larger of the two ranks' median step times). Full runs (5
rounds, ~7 min) add tandem with gradient_as_bucket_view=false (copies) and tandem over TCP, for
analysis; --quick (2 rounds, fewer steps, ~1 min) skips them and marks the JSON "quick": true."""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

args, bench, tandemrun = harness.setup(harness.parser(__doc__), ["bench_data_parallel", "tandemrun"], needs="torch")
python = sys.executable  # the venv's (scripts/env.sh): the torch wheel tandem builds against
quick = args.quick
command = args.command or "scripts/bench-data-parallel" + (" --quick" if quick else "")
peer = os.path.join(harness.REPO, "bench", "data_parallel", "pytorch_ddp.py")

# (batch, warmup, steps) per workload; rounds of every mode.
if quick:
    workloads = {"W1": (32, 2, 6), "W2": (4, 3, 15)}
    rounds = 2
else:
    workloads = {"W1": (32, 3, 20), "W2": (4, 5, 60)}
    rounds = 5
rounds = args.rounds or rounds
modes = ["local", "tandem", "naive", "pytorch_ddp", "pytorch_local", "tandem_no_flight"]
# For the analysis only (full runs): tandem with gradient_as_bucket_view=false, and tandem with every
# op on TCP loopback (GlooOptions::shared_memory = false).
extras = [] if quick else ["tandem_copy_grads", "tandem_tcp"]
modes += extras
os.environ["OMP_NUM_THREADS"] = "1"  # what tandemrun would set; set here so it does not say so every run


def argv_of(mode, batch, warmup, steps, out):
    launch = [tandemrun, "--standalone", "--nproc-per-node", "2"]
    if mode.startswith("pytorch_"):
        argv = launch + [python, peer, "--mode", mode[len("pytorch_"):]]
    elif mode == "tandem_copy_grads":
        argv = launch + [bench, "--mode", "tandem", "--copy-grads"]
    elif mode == "tandem_tcp":
        argv = launch + [bench, "--mode", "tandem", "--transport", "tcp"]
    elif mode == "tandem_no_flight":  # the flight recorder off: what it costs
        argv = launch + [bench, "--mode", "tandem"]
    else:
        argv = launch + [bench, "--mode", mode]
    return argv + ["--batch", str(batch), "--warmup", str(warmup), "--steps", str(steps), "--out", out]


revision = harness.source()
start = time.time()
load = harness.Load()
runs = {w: {m: [] for m in modes} for w in workloads}
with tempfile.TemporaryDirectory() as tmp:
    for r in range(rounds):
        for w, (batch, warmup, steps) in workloads.items():
            for m in harness.rotated(modes, r):
                out = os.path.join(tmp, "%s_%s_%d.json" % (w, m, r))
                env = dict(os.environ, TANDEM_FLIGHT_RECORDER="0" if m == "tandem_no_flight" else "1")
                res = load.watch(harness.run_json, "%s %s" % (w, m), argv_of(m, batch, warmup, steps, out),
                                 out, env=env)
                runs[w][m].append(res)
                print("round %d/%d  %s %-13s %8.2f ms" % (r + 1, rounds, w, m, res["step_ms"]), flush=True)
        load.round_done()
load.end()


def med(w, m, key="step_ms"):
    return harness.median(runs[w][m], key)


result = {
    "command": command,
    "quick": quick,
    "machine": load.machine(),
    "setup": ("2 ranks (tandemrun --standalone --nproc-per-node 2), 1 compute thread per rank "
              "(at::set_num_threads(1) / torch.set_num_threads(1)); model Linear(1024,2048), ReLU, "
              "3 x (Linear(2048,2048), ReLU), Linear(2048,1024) = 16.8 M fp32 parameters; MSE; "
              "SGD lr 0.01; step = zero_grad + forward + loss + backward + optimizer step; local "
              "modes also run as 2 processes. A run's step time is the larger of the two ranks' "
              "median step times; figures are medians over rounds."),
    "source": revision,
    "rounds": rounds,
    "seconds": round(time.time() - start, 1),
    "workloads": {},
}
OVERLAP_NOTE = (
    "overlap_ms: Reducer::last_overlap_seconds() (first bucket launch to end of backward), wait_ms: "
    "last_wait_seconds() (waiting for the buckets after backward); per-run medians over steps, "
    "averaged over ranks, median over rounds. naive_after_backward_comm_ms: the same bytes "
    "all-reduced after backward, per parameter, nothing overlapped. tandem_backward_ms includes "
    "wait_ms (the reducer waits in a callback at the end of backward); its excess over "
    "local_backward_ms is what the communication cost backward.")
rows = []
for w, (batch, warmup, steps) in workloads.items():
    local, tandem, naive = med(w, "local"), med(w, "tandem"), med(w, "naive")
    ddp, plocal = med(w, "pytorch_ddp"), med(w, "pytorch_local")
    t_ovh, d_ovh = tandem / local - 1, ddp / local - 1
    overlap, wait = med(w, "tandem", "overlap_ms"), med(w, "tandem", "wait_ms")
    t0 = runs[w]["tandem"][0]
    analysis = {}
    for suffix, key, scale in (("_ms", "step_ms", None), ("_overhead", "step_ms", local),
                               ("_overlap_ms", "overlap_ms", None), ("_wait_ms", "wait_ms", None)):
        for m in extras:
            analysis[m + suffix] = round(med(w, m, key) / scale - 1, 4) if scale else round(med(w, m, key), 3)
    result["workloads"][w] = {
        "batch_per_rank": batch, "warmup_steps": warmup, "timed_steps": steps,
        "local_ms": round(local, 3),
        "tandem_ms": round(tandem, 3),
        "naive_ms": round(naive, 3),
        "pytorch_ddp_ms": round(ddp, 3),
        "tandem_overhead": round(t_ovh, 4),
        "pytorch_ddp_overhead": round(d_ovh, 4),
        "naive_overhead": round(naive / local - 1, 4),
        "tandem_to_pytorch_ddp_overhead_ratio": round(t_ovh / d_ovh, 4) if d_ovh > 0 else None,
        "goal_tandem_overhead_at_most_a_third_of_ddp": bool(d_ovh > 0 and t_ovh <= d_ovh / 3),
        "goal_tandem_at_most_naive": bool(tandem <= naive),
        "tandem_no_flight_recorder_ms": round(med(w, "tandem_no_flight"), 3),
        "flight_recorder_overhead": round(tandem / med(w, "tandem_no_flight") - 1, 4),
        "pytorch_local_ms": round(plocal, 3),
        "pytorch_ddp_overhead_vs_pytorch_local": round(ddp / plocal - 1, 4),
        "overlap": {
            "buckets": t0["buckets"],
            "bucket_bytes": t0.get("bucket_bytes"),
            "allreduced_bytes_per_step": t0["allreduced_bytes_per_step"],
            "overlap_ms": round(overlap, 3),
            "wait_ms": round(wait, 3),
            "overlap_share": round(overlap / (overlap + wait), 4) if overlap + wait > 0 else None,
            "naive_after_backward_comm_ms": round(med(w, "naive", "after_backward_comm_ms"), 3),
            "local_backward_ms": round(med(w, "local", "backward_ms"), 3),
            "tandem_backward_ms": round(med(w, "tandem", "backward_ms"), 3),
            "note": OVERLAP_NOTE,
        },
        "analysis_only": analysis,
        "phases_ms": {m: {k: round(med(w, m, k), 3) for k in ("forward_ms", "backward_ms", "optimizer_ms")}
                      for m in modes},
        "runs_step_ms": {m: [x["step_ms"] for x in runs[w][m]] for m in modes},
    }
    rows.append((w, batch, local, tandem, naive, ddp, plocal, t_ovh, d_ovh, overlap, wait))

print()
print("2 ranks x 1 thread, median over %d rounds (ms per step)%s" % (rounds, "  [quick]" if quick else ""))
print("%-4s %5s %9s %9s %9s %12s %10s %10s %10s %13s" % (
    "", "batch", "local", "tandem", "naive", "pytorch_ddp", "tandem_ovh", "ddp_ovh", "ovh_ratio", "pytorch_local"))
for w, batch, local, tandem, naive, ddp, plocal, t_ovh, d_ovh, overlap, wait in rows:
    ratio = "%.2f" % (t_ovh / d_ovh) if d_ovh > 0 else "n/a"
    print("%-4s %5d %9.2f %9.2f %9.2f %12.2f %9.1f%% %9.1f%% %10s %13.2f" % (
        w, batch, local, tandem, naive, ddp, 100 * t_ovh, 100 * d_ovh, ratio, plocal))
if extras:
    print("analysis only: " + "; ".join(
        "%s %s" % (w, ", ".join("%s %.2f ms (%+.1f%%)" % (m, med(w, m), 100 * (med(w, m) / med(w, "local") - 1))
                                for m in extras)) for w in workloads))
print()
for w, batch, local, tandem, naive, ddp, plocal, t_ovh, d_ovh, overlap, wait in rows:
    o = result["workloads"][w]["overlap"]
    print("%s tandem: %d buckets, %.1f MiB all-reduced per step; communication in flight during backward "
          "%.2f ms, waited after backward %.2f ms (%.0f%% overlapped); backward %.2f ms vs %.2f ms local; "
          "naive loop spends %.2f ms after backward" % (
              w, o["buckets"], o["allreduced_bytes_per_step"] / 2**20, overlap, wait,
              100 * (o["overlap_share"] or 0), o["tandem_backward_ms"], o["local_backward_ms"],
              o["naive_after_backward_comm_ms"]))
    print("%s goal (tandem overhead <= 1/3 of PyTorch DDP's): %s" % (
        w, "met" if result["workloads"][w]["goal_tandem_overhead_at_most_a_third_of_ddp"] else "NOT met"))
# Issue 19: the flight recorder's cost on W2, paired by round (same round, adjacent runs).
pairs = [a["step_ms"] / b["step_ms"] - 1 for a, b in zip(runs["W2"]["tandem"], runs["W2"]["tandem_no_flight"])]
result["flight_recorder_overhead"] = result["workloads"]["W2"]["flight_recorder_overhead"]
result["flight_recorder_overhead_runs"] = [round(x, 4) for x in pairs]
result["goal_flight_recorder_overhead_at_most_1pct"] = bool(result["flight_recorder_overhead"] <= 0.01)
print("flight recorder on W2: %+.2f%% of the step (median of rounds; per round %s); goal <= 1%%: %s" % (
    100 * result["flight_recorder_overhead"], ", ".join("%+.1f%%" % (100 * x) for x in pairs),
    "met" if result["goal_flight_recorder_overhead_at_most_1pct"] else "NOT met"))
for w in workloads:
    print("%s goal (tandem <= naive loop): %s" % (
        w, "met" if result["workloads"][w]["goal_tandem_at_most_naive"] else "NOT met"))
print("%s; %.0f s" % (load.summary(), time.time() - start))
result["provenance"] = harness.provenance(command, revision, load)
print("bench-data-parallel: wrote %s" % harness.write_result("data_parallel", result))
