#!/usr/bin/env python3
"""Sharded data parallel on 2 ranks x 1 compute thread: memory and step time of
tandem::DistributedDataParallel and ShardedDataParallel stages 1, 2 and 3 against the theory and
PyTorch's DDP, ZeroRedundancyOptimizer and FSDP2 (fully_shard); checks the goals of issue 17,
prints a table and writes bench/results/sharded.json (driven by scripts/bench-sharded, which builds
bench_sharded and tandemrun).
  Model: the data-parallel benchmark's W1 (MLP 1024 -> 4x2048 ReLU -> 1024, 16.8 M fp32
  parameters, batch 32 per rank, MSE) with AdamW; at stage 3 each Linear is a ShardedUnit, under
  FSDP2 each Linear is fully_shard'ed.
Modes (bench/sharded/bench_sharded.cpp; bench/sharded/pytorch_zero.py): ddp, zero1, zero2, zero3,
comm (the collectives alone: DDP's all-reduce vs the stages' reduce-scatter + all-gather, all
through shared memory), pytorch_ddp, pytorch_zero (DDP + ZeroRedundancyOptimizer) and
pytorch_fsdp2. Modes are interleaved in rounds (order rotated each round); each figure is the
median over rounds of the per-run figure (the larger of the two ranks' median step times). Full
runs: 5 rounds x 20 timed steps (about 4 min); --quick: 2 rounds x 6 steps, marked "quick": true.

The PyTorch peers run on the venv's python (this driver's, scripts/env.sh), in the same rounds as
tandem's modes, with the same model, batch, warm-up and timed steps; their results sit under "pytorch" in the JSON (FSDP2: pytorch.fsdp2).
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
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

args, bench, tandemrun = harness.setup(harness.parser(__doc__), ["bench_sharded", "tandemrun"], needs="torch")
python = sys.executable  # the venv's: the torch wheel tandem builds against
quick = args.quick
command = args.command or "scripts/bench sharded" + (" --quick" if quick else "")
peer = os.path.join(harness.REPO, "bench", "sharded", "pytorch_zero.py")
N = 2
batch = 32
warmup, steps, rounds = (2, 6, 2) if quick else (3, 20, 5)
rounds = args.rounds or rounds
STAGES = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
os.environ["OMP_NUM_THREADS"] = "1"  # what tandemrun would set; set here so it does not say so every run


def run(mode, r):
    out = os.path.join(tmp, "%s_%d.json" % (mode, r))
    argv = [tandemrun, "--standalone", "--nproc-per-node", str(N)]
    if mode.startswith("pytorch_"):
        argv += [python, peer, "--mode", mode[len("pytorch_"):], "--memory-steps", str(steps)]
    else:
        argv += [bench, "--mode", mode]
    argv += ["--batch", str(batch), "--warmup", str(warmup), "--steps", str(steps), "--out", out]
    return load.watch(harness.run_json, mode, argv, out)


def show(r, m, res):
    if m == "comm":
        print("round %d/%d  %-13s all-reduce %.2f ms, reduce-scatter %.2f ms, all-gather %.2f ms" % (
            r + 1, rounds, m, res["allreduce_ms"], res["reduce_scatter_ms"], res["allgather_ms"]), flush=True)
    else:
        print("round %d/%d  %-13s %8.2f ms" % (r + 1, rounds, m, res["step_ms"]), flush=True)


revision = harness.source()
start = time.time()
load = harness.Load()
modes = ["ddp", "zero1", "zero2", "zero3", "comm", "pytorch_ddp", "pytorch_zero", "pytorch_fsdp2"]
with tempfile.TemporaryDirectory() as tmp:
    runs = harness.in_rounds(rounds, modes, run, after_round=lambda r: load.round_done(), show=show)
load.end()


def med(m, key="step_ms"):
    return harness.median(runs[m], key)


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
result["machine"] = load.machine()
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
result["source"] = revision
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
print("%s; %.0f s" % (load.summary(), time.time() - start))

result["provenance"] = harness.provenance(command, revision, load)
print("bench-sharded: wrote %s" % harness.write_result("sharded", result))
