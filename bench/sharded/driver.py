#!/usr/bin/env python3
"""Driver of scripts/bench-sharded (which builds the programs and sets SHB_*): runs every mode in
rounds under tandemrun, takes medians, checks the goals of issue 17, prints a table and writes
bench/results/sharded.json. See scripts/bench-sharded for what each mode is.

The PyTorch peers (bench/sharded/pytorch_zero.py: DDP, DDP + ZeroRedundancyOptimizer, FSDP2) run on
$SHB_PYTHON, the venv's python, in the same rounds as tandem's modes, with the same model, batch,
warm-up and timed steps; their results sit under "pytorch" in the JSON (FSDP2: pytorch.fsdp2).
Their collectives run through Gloo (TCP on loopback), the stages' through tandem's shared memory.

peak_bytes, the same quantity on both sides: the bytes libtorch's CPU allocator holds (every CPU
tensor's storage, whichever thread allocates it; not Gloo's or Python's own buffers) at its highest
during a step (zero_grad + forward + loss, backward, optimizer step; peak_by_phase_bytes per phase),
the largest over a run's measured steps, the larger of the two ranks', the median over rounds.
  - tandem's modes (bench_sharded): tandem's host allocator is installed as libtorch's CPU
    allocator before any tensor exists; its allocated-bytes peak (block sizes after tandem's
    rounding) is reset at each phase start and read at its end, over the timed steps.
  - the PyTorch peers: c10's default CPU allocator, which counts the same storages (requested
    sizes): its FLAGS_caffe2_report_cpu_memory_usage is set before any tensor exists, and over
    as many extra steps as there are timed steps (run after the warm-up, from a copy of the training
    state that is then copied back, so the timed steps are unchanged) it logs the bytes it holds
    after every allocation and free; the peer takes each phase's highest. Tracking is off during
    the timed steps.
state_bytes on both sides: parameters + gradients + AdamW's exp_avg and exp_avg_sq held by a rank
between steps (sharded tensors by their local shards)."""
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

repo, bench, tandemrun, python = (os.environ[k] for k in ("SHB_REPO", "SHB_BENCH", "SHB_TANDEMRUN", "SHB_PYTHON"))
quick = os.environ["SHB_QUICK"] == "1"
command = os.environ["SHB_COMMAND"]
peer = os.path.join(repo, "bench", "sharded", "pytorch_zero.py")
N = 2
batch = 32
warmup, steps, rounds = (2, 6, 2) if quick else (3, 20, 5)
if os.environ.get("SHB_ROUNDS"):
    rounds = int(os.environ["SHB_ROUNDS"])
STAGES = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(v) for v in f.read().split()[:3]]


def busy_seconds():
    """CPU seconds all cores spent busy since boot (/proc/stat), and ours (reaped children)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = sum(v[:8]) - v[3] - v[4]  # user nice system idle iowait irq softirq steal
    t = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), t.children_user + t.children_system


foreign = []  # per run: CPU used by other processes, in cores (busy CPU not ours / wall time)


def launch(mode, out):
    argv = [tandemrun, "--standalone", "--nproc-per-node", str(N)]
    if mode.startswith("pytorch_"):
        argv += [python, peer, "--mode", mode[len("pytorch_"):], "--memory-steps", str(steps)]
    else:
        argv += [bench, "--mode", mode]
    argv += ["--batch", str(batch), "--warmup", str(warmup), "--steps", str(steps), "--out", out]
    b0, c0, t0 = *busy_seconds(), time.time()
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    b1, c1, t1 = *busy_seconds(), time.time()
    foreign.append(max(0.0, ((b1 - b0) - (c1 - c0)) / (t1 - t0)))
    return argv, p


def run(mode, out):
    argv, p = launch(mode, out)
    if p.returncode != 0 or not os.path.exists(out):
        sys.stderr.write(p.stdout)
        sys.exit("bench-sharded: '%s' failed (exit status %d)" % (" ".join(argv), p.returncode))
    with open(out) as f:
        return json.load(f)


def git(*args):
    try:
        return subprocess.run(["git", "-C", repo] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True).stdout.strip()
    except OSError:
        return ""


start = time.time()
load_start = loadavg()
if load_start[0] > 0.5:
    print("bench-sharded: warning: load average %.2f before the run: other work shares the cores, "
          "figures will be noisy" % load_start[0])
modes = ["ddp", "zero1", "zero2", "zero3", "comm", "pytorch_ddp", "pytorch_zero", "pytorch_fsdp2"]
load_rounds = []
with tempfile.TemporaryDirectory() as tmp:
    runs = {m: [] for m in modes}
    for r in range(rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            res = run(m, os.path.join(tmp, "%s_%d.json" % (m, r)))
            runs[m].append(res)
            if m == "comm":
                print("round %d/%d  %-13s all-reduce %.2f ms, reduce-scatter %.2f ms, all-gather %.2f ms" % (
                    r + 1, rounds, m, res["allreduce_ms"], res["reduce_scatter_ms"], res["allgather_ms"]), flush=True)
            else:
                print("round %d/%d  %-13s %8.2f ms" % (r + 1, rounds, m, res["step_ms"]), flush=True)
        load_rounds.append(loadavg()[0])
load_end = loadavg()


def med(m, key="step_ms"):
    return statistics.median(x[key] for x in runs[m])


first = runs["ddp"][0]
P = first["parameters"]
ddp_ms = med("ddp")
theory_per_param = {"ddp": 16.0, "zero1": 4 + 4 + 8.0 / N, "zero2": 4 + 12.0 / N, "zero3": 16.0 / N}
result = {
    "command": command,
    "quick": quick,
    "parameters": P,
    "world_size": N,
}
rows = []
for m, stage in STAGES.items():
    state = med(m, "parameter_bytes") + med(m, "gradient_bytes") + med(m, "optimizer_state_bytes")
    theory = theory_per_param[m] * P
    step = med(m)
    per_round = [a["step_ms"] / b["step_ms"] for a, b in zip(runs[m], runs["ddp"])]
    entry = {
        "stage": stage,
        "state_bytes": int(state),
        "peak_bytes": int(med(m, "peak_bytes")),
        "peak_by_phase_bytes": {k: int(med(m, "peak_%s_bytes" % k)) for k in ("forward", "backward", "optimizer")},
        "step_ms": round(step, 3),
        "parameter_bytes": int(med(m, "parameter_bytes")),
        "gradient_bytes": int(med(m, "gradient_bytes")),
        "optimizer_state_bytes": int(med(m, "optimizer_state_bytes")),
        "theory_bytes_per_parameter": theory_per_param[m],
        "theory_state_bytes": int(theory),
        "state_to_theory": round(state / theory, 4),
        "allocated_between_steps_bytes": int(med(m, "allocated_between_steps_bytes")),
        "step_to_ddp": round(step / ddp_ms, 4),
        "step_to_ddp_median_of_rounds": round(statistics.median(per_round), 4),
        "phases_ms": {k: round(med(m, k + "_ms"), 3) for k in
                      ("forward", "backward", "optimizer", "gather_wait", "reduce_wait", "overlap")},
        "final_loss": runs[m][-1]["final_loss"],
        "runs_step_ms": [x["step_ms"] for x in runs[m]],
    }
    if stage > 0:
        entry["units"] = runs[m][0]["units"]
        entry["largest_unit_bytes"] = runs[m][0]["largest_unit_bytes"]
    result[m] = entry
    rows.append((m, entry))

z3 = result["zero3"]
unit = z3["largest_unit_bytes"]
bound = 16.0 / N * P + 2 * unit + 2 * unit
z3["peak_bound_bytes"] = int(bound)
z3["peak_bound_note"] = ("16/N bytes per parameter + 2 units' full parameters + 2 buckets; at stage 3 "
                         "the reduce-scatter buckets are the units, so a bucket is the largest unit's "
                         "full gradients (%d bytes); the measured peak also holds the model's "
                         "activations and the batch; default options (sharding.backward_prefetch = "
                         "post)" % unit)
PHASES = ("forward", "backward", "optimizer")


def med_or_none(m, key):
    """The median over rounds, or None where a run has no figure (the peer's peak_error says why)."""
    values = [x.get(key) for x in runs[m]]
    return None if any(v is None for v in values) else int(statistics.median(values))


def peer_memory(m):
    """A PyTorch peer's training state and allocator peak (see the docstring), medians over rounds."""
    e = {k: med_or_none(m, k) for k in ("state_bytes", "parameter_bytes", "gradient_bytes",
                                         "optimizer_state_bytes", "peak_bytes")}
    e["peak_by_phase_bytes"] = {k: med_or_none(m, "peak_%s_bytes" % k) for k in PHASES}
    e["allocated_between_steps_bytes"] = med_or_none(m, "allocated_between_steps_bytes")
    e["runs_peak_bytes"] = [x.get("peak_bytes") for x in runs[m]]
    errors = sorted({x["peak_error"] for x in runs[m] if x.get("peak_error")})
    if errors:
        e["peak_error"] = "; ".join(errors)
    return e


zro = med("pytorch_zero")
fs2 = med("pytorch_fsdp2")
result["zero_redundancy_optimizer_ms"] = round(zro, 3)
pzero = {
    "step_ms": round(zro, 3),
    "state_bytes": int(med("pytorch_zero", "state_bytes")),
    "optimizer_state_bytes": int(med("pytorch_zero", "optimizer_state_bytes")),
    "phases_ms": {k: round(med("pytorch_zero", k + "_ms"), 3) for k in PHASES},
    "final_loss": runs["pytorch_zero"][-1]["final_loss"],
}
for k, v in peer_memory("pytorch_zero").items():
    pzero.setdefault(k, v)
fsdp2 = {
    "step_ms": round(fs2, 3),
    "peak_bytes": med_or_none("pytorch_fsdp2", "peak_bytes"),
}
for k, v in peer_memory("pytorch_fsdp2").items():
    fsdp2.setdefault(k, v)
fsdp2.update({
    "phases_ms": {k: round(med("pytorch_fsdp2", k + "_ms"), 3) for k in PHASES},
    "zero3_step_to_fsdp2": round(z3["step_ms"] / fs2, 4),
    "zero3_step_to_fsdp2_median_of_rounds": round(statistics.median(
        a["step_ms"] / b["step_ms"] for a, b in zip(runs["zero3"], runs["pytorch_fsdp2"])), 4),
    "zero3_peak_to_fsdp2": round(z3["peak_bytes"] / fsdp2["peak_bytes"], 4) if fsdp2["peak_bytes"] else None,
    "final_loss": runs["pytorch_fsdp2"][-1]["final_loss"],
    "runs_step_ms": [x["step_ms"] for x in runs["pytorch_fsdp2"]],
    "options": runs["pytorch_fsdp2"][0].get("options", ""),
    "memory_steps": runs["pytorch_fsdp2"][0].get("memory_steps"),
    "torch": runs["pytorch_fsdp2"][0]["torch"],
})
result["pytorch"] = {
    "ddp_ms": round(med("pytorch_ddp"), 3),
    "zero_redundancy_optimizer": pzero,
    "ddp_phases_ms": {k: round(med("pytorch_ddp", k + "_ms"), 3) for k in PHASES},
    "ddp_memory": peer_memory("pytorch_ddp"),
    "fsdp2": fsdp2,
    "torch": runs["pytorch_zero"][0]["torch"],
    "python": runs["pytorch_zero"][0]["python"],
    "peak_note": ("peak_bytes: c10's CPU allocator's bytes held at its highest in a step (its "
                  "FLAGS_caffe2_report_cpu_memory_usage log over %d extra steps after the warm-up, "
                  "the training state restored before the timed steps), the same storages tandem's "
                  "allocator counts for the stages' peak_bytes" % steps),
}
comm = {
    "buckets": runs["comm"][0]["units"],
    "allreduce_ms": round(med("comm", "allreduce_ms"), 3),
    "reduce_scatter_ms": round(med("comm", "reduce_scatter_ms"), 3),
    "allgather_ms": round(med("comm", "allgather_ms"), 3),
    "largest_bucket_bytes": runs["comm"][0]["largest_unit_bytes"],
    "temporary_bytes_on_the_largest_bucket": {
        k: int(med("comm", k + "_temporary_bytes")) for k in ("allreduce", "reduce_scatter", "allgather")},
}
comm["reduce_scatter_plus_allgather_to_allreduce"] = round(
    (comm["reduce_scatter_ms"] + comm["allgather_ms"]) / comm["allreduce_ms"], 3)
comm["note"] = ("one step's worth of the stage-1/2 buckets (%d, %.1f MiB in all), each collective "
                "waited before the next, nothing else running: DDP's all-reduce (world "
                "communicator) vs the reduce-scatter and all-gather the stages issue (a split "
                "communicator); all three through shared memory" % (comm["buckets"], 4 * P / 2**20))
result["collectives"] = comm


def goal(name, ratio, limit, met, measured, reference):
    """ratio: measured / reference; met when ratio is within limit (a string saying how)."""
    return {"goal": name, "ratio": round(ratio, 4), "limit": limit, "met": bool(met),
            "measured": measured, "reference": reference}


goals = []
for m in STAGES:
    e = result[m]
    r = e["state_bytes"] / e["theory_state_bytes"]
    goals.append(goal("%s state bytes within 5%% of the theory (%.1f bytes per parameter)" % (
        m, e["theory_bytes_per_parameter"]), r, "0.95 <= ratio <= 1.05", abs(r - 1) <= 0.05,
        e["state_bytes"], e["theory_state_bytes"]))
goals.append(goal("zero3 peak per rank <= 16/N bytes per parameter + 2 units + 2 buckets",
                  z3["peak_bytes"] / bound, "ratio <= 1", z3["peak_bytes"] <= bound, z3["peak_bytes"], int(bound)))
for m, limit in (("zero1", 1.05), ("zero2", 1.05), ("zero3", 1.3)):
    r = result[m]["step_ms"] / ddp_ms
    goals.append(goal("%s step time <= %.2fx DDP's" % (m, limit), r, "ratio <= %.2f" % limit, r <= limit,
                      result[m]["step_ms"], round(ddp_ms, 3)))
r = result["zero1"]["step_ms"] / zro
goals.append(goal("zero1 step time < ZeroRedundancyOptimizer's", r, "ratio < 1", r < 1,
                  result["zero1"]["step_ms"], round(zro, 3)))
r = z3["step_ms"] / fs2
goals.append(goal("zero3 step time <= PyTorch FSDP2's", r, "ratio <= 1", r <= 1, z3["step_ms"], round(fs2, 3)))
result["goals"] = goals
result["machine"] = {
    "cores": os.cpu_count(),
    "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
                platform.processor()),
    "load_average_before": load_start,
    "load_average_after": load_end,
    "load_average_1min_after_each_round": load_rounds,
    "other_processes_cpu_cores_mean": round(statistics.mean(foreign), 3),
    "other_processes_cpu_cores_max": round(max(foreign), 3),
    "load_note": ("load averages include this benchmark's own 2 busy ranks; other_processes_cpu_cores = "
                  "busy CPU time (/proc/stat) minus the benchmark's own CPU time, per run, divided by "
                  "its wall time"),
}
result["setup"] = (
    "2 ranks (tandemrun --standalone --nproc-per-node 2), 1 compute thread per rank; model "
    "Linear(1024,2048), ReLU, 3 x (Linear(2048,2048), ReLU), Linear(2048,1024) = %d fp32 parameters, "
    "each Linear a ShardedUnit (PyTorch FSDP2: fully_shard on each Linear, then on the root, gloo, "
    "default options); MSE; AdamW lr 1e-3 weight decay 0.01; batch %d per rank; %d warm-up + "
    "%d timed steps per run; step = zero_grad + forward + loss + backward + optimizer step. Memory: "
    "tandem's host allocator installed as libtorch's CPU allocator; peak_bytes = its peak allocated "
    "bytes over the timed steps (reset after the warm-up; the PyTorch peers: c10's CPU allocator's "
    "bytes held, from its allocation log over as many extra steps, see pytorch.peak_note); "
    "state_bytes = parameters + gradients "
    "(ShardedDataParallel::memory_use, or the model's tensors under DDP) + AdamW's exp_avg and "
    "exp_avg_sq, held between steps. Phases: forward includes the stage 1-2 all-gather of the "
    "stepped shards (gather_wait) and stage 3's gathers; backward includes the wait for the last "
    "reductions (reduce_wait); overlap = first reduction issued to end of backward. Each figure is "
    "the median over rounds of a run's figure (step time: the larger of the ranks' medians; memory: "
    "the larger of the ranks')." % (P, batch, warmup, steps))
result["source"] = {"commit": git("rev-parse", "HEAD"),
                    "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no"))}
result["rounds"] = rounds
result["seconds"] = round(time.time() - start, 1)

MiB = 2.0**20
print()
print("%d ranks x 1 thread, W1 (%.1f M parameters) with AdamW, median over %d rounds%s" % (
    N, P / 1e6, rounds, "  [quick]" if quick else ""))
print("%-6s %9s %9s %9s %10s %10s %8s %10s %9s %8s %9s %9s %9s %9s" % (
    "", "params", "grads", "optim", "state MiB", "theory", "ratio", "peak MiB", "step ms", "x DDP",
    "forward", "backward", "optim ms", "gath/red"))
for m, e in rows:
    print("%-6s %9.1f %9.1f %9.1f %10.1f %10.1f %8.3f %10.1f %9.2f %8.3f %9.2f %9.2f %9.2f %4.1f/%4.1f" % (
        m, e["parameter_bytes"] / MiB, e["gradient_bytes"] / MiB, e["optimizer_state_bytes"] / MiB,
        e["state_bytes"] / MiB, e["theory_state_bytes"] / MiB, e["state_to_theory"], e["peak_bytes"] / MiB,
        e["step_ms"], e["step_to_ddp"], e["phases_ms"]["forward"], e["phases_ms"]["backward"],
        e["phases_ms"]["optimizer"], e["phases_ms"]["gather_wait"], e["phases_ms"]["reduce_wait"]))


def mib(v, width):
    return "%*.1f" % (width, v / MiB) if v is not None else "%*s" % (width, "-")


pt = result["pytorch"]
pd = dict(pt["ddp_memory"], step_ms=pt["ddp_ms"], phases_ms=pt["ddp_phases_ms"])
for name, e in (("pt ddp", pd), ("pt zro", pt["zero_redundancy_optimizer"]), ("fsdp2", fsdp2)):
    print("%-6s %s %s %s %s %10s %8s %s %9.2f %8.3f %9.2f %9.2f %9.2f %9s" % (
        name, mib(e["parameter_bytes"], 9), mib(e["gradient_bytes"], 9), mib(e["optimizer_state_bytes"], 9),
        mib(e["state_bytes"], 10), "-", "-", mib(e["peak_bytes"], 10), e["step_ms"], e["step_ms"] / ddp_ms,
        e["phases_ms"]["forward"], e["phases_ms"]["backward"], e["phases_ms"]["optimizer"], "-"))
print("pt ddp / pt zro / fsdp2: PyTorch %s DDP + AdamW, DDP + ZeroRedundancyOptimizer(AdamW), FSDP2 "
      "(fully_shard per Linear) + AdamW, all over gloo; x DDP is against tandem's DDP" % pt["torch"])
print("zero3 against FSDP2: step %.2f / %.2f ms = %.3f (median of the rounds' ratios %.3f); peak %s / %s MiB" % (
    z3["step_ms"], fsdp2["step_ms"], fsdp2["zero3_step_to_fsdp2"], fsdp2["zero3_step_to_fsdp2_median_of_rounds"],
    mib(z3["peak_bytes"], 0), mib(fsdp2["peak_bytes"], 0)))
if any("peak_error" in e for e in (pd, pt["zero_redundancy_optimizer"], fsdp2)):
    print("PyTorch peaks unavailable: %s" % "; ".join(
        e["peak_error"] for e in (pd, pt["zero_redundancy_optimizer"], fsdp2) if "peak_error" in e))
print("collectives alone, one step's buckets (%d, %.0f MiB, shared memory): all-reduce %.2f ms; "
      "reduce-scatter %.2f ms + all-gather %.2f ms = %.2fx" % (
          comm["buckets"], 4 * P / MiB, comm["allreduce_ms"], comm["reduce_scatter_ms"], comm["allgather_ms"],
          comm["reduce_scatter_plus_allgather_to_allreduce"]))
print("peak by phase (forward / backward / optimizer, MiB): " + "; ".join(
    "%s %s / %s / %s" % ((m,) + tuple(mib(e["peak_by_phase_bytes"][k], 0) for k in PHASES))
    for m, e in rows + [("fsdp2", fsdp2)]))
tb = comm["temporary_bytes_on_the_largest_bucket"]
print("memory a collective allocates for itself on the largest bucket (%.1f MiB): all-reduce %.1f MiB, "
      "reduce-scatter %.1f MiB, all-gather %.1f MiB" % (
          comm["largest_bucket_bytes"] / MiB, tb["allreduce"] / MiB, tb["reduce_scatter"] / MiB, tb["allgather"] / MiB))
print("zero3 peak %.1f MiB vs bound %.1f MiB (16/N per parameter + 4 x the largest unit, %.1f MiB)" % (
    z3["peak_bytes"] / MiB, bound / MiB, unit / MiB))
for g in goals:
    print("goal %-72s %-6s ratio %.3f (%s)" % (g["goal"], "met" if g["met"] else "MISSED", g["ratio"], g["limit"]))
print("load average before %s, after %s (1-min after each round: %s); other processes used %.2f cores "
      "on average during the runs (max %.2f); %.0f s" % (
          load_start, load_end, load_rounds, statistics.mean(foreign), max(foreign), time.time() - start))

out = os.path.join(repo, "bench", "results", "sharded.json")
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out + ".tmp", "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
os.replace(out + ".tmp", out)
print("bench-sharded: wrote %s" % out)
