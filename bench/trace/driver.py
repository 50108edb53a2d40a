#!/usr/bin/env python3
"""The timeline recorder's cost (docs/timeline.md): per event, per training step, and in memory
(driven by scripts/bench-trace, which builds bench_trace, bench_trace_step, train_lm and tandemrun).
 (a) bench_trace: nanoseconds per Span, disabled and enabled, 1 and 2 threads (ns_per_span).
 (b) bench_trace_step under tandemrun: the main job's model and config (train_lm.yaml, 2 workers)
     with the recorder switched off / on / off (control) in interleaved blocks of 10 steps in the
     same processes; median wall and training-thread CPU time per step and mode, overhead =
     on / off - 1, control = the A/A noise floor; overhead_model = events per step x enabled ns
     per span / the training thread's CPU time per untraced step.
 (c) the main job itself (scripts/main's command, 300 steps), traced (--trace-dir) and untraced,
     interleaved in rounds: rank 0's peak RSS after steps 50 and 300 (its progress records).
     --baseline-lib DIR adds a third configuration: traced, with the libtandem.so.0 in DIR (another
     build, e.g. of an earlier commit) loaded instead of this build's.
Goals (issue 20): with tracing on, the peak after step 300 is within 5% of the peak after step
50 (peak_growth); the recorder costs at most 1% of step time.
Writes bench/results/trace_overhead.json (or --out FILE); --quick: 1 round, fewer blocks and 100
steps (the JSON says "quick": true). Default: 3 rounds."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402
from harness import loadavg  # noqa: E402

parser = harness.parser(__doc__)
parser.add_argument("--out", default=os.path.join(harness.RESULTS, "trace_overhead.json"), help="the result JSON")
parser.add_argument("--baseline-lib", default="", help="a directory with another build's libtandem.so.0")
args = parser.parse_args()
bin_dir = os.path.dirname(harness.find_exe(args.build_dir, "tandemrun"))
for name in ("bench_trace", "bench_trace_step", "train_lm"):
    harness.find_exe(args.build_dir, name)
quick = args.quick
rounds = args.rounds or (1 if quick else 3)
baseline = os.path.abspath(args.baseline_lib) if args.baseline_lib else ""
command = args.command or "scripts/bench trace" + (" --quick" if quick else "")
revision = harness.source()
describe = harness.describe()  # "revision", as this JSON has always had it
config = os.path.join(harness.REPO, "examples", "configs", "train_lm.yaml")
steps = 100 if quick else 300
env = dict(os.environ, OMP_NUM_THREADS="1")


def run(args, cwd, run_env=env):
    """ARGS' output; a failure stops the driver, named after the program tandemrun starts."""
    label = next((os.path.basename(a) for a in args[1:] if a.startswith(bin_dir)), os.path.basename(args[0]))
    return harness.run(label, args, timeout=3600, env=run_env, cwd=cwd)


# The library the workers load (LD_LIBRARY_PATH may point at another build, e.g. a baseline).
libtandem = next((l.split("=>")[1].split()[0] for l in subprocess.run(
    ["ldd", os.path.join(bin_dir, "train_lm")], stdout=subprocess.PIPE, text=True).stdout.splitlines()
    if "libtandem" in l and "=>" in l), "unknown")
load_before = loadavg()
with tempfile.TemporaryDirectory() as tmp:
    print("== (a) one Span: bench_trace --rounds 9")
    micro_json = os.path.join(tmp, "micro.json")
    print(run([os.path.join(bin_dir, "bench_trace"), "--rounds", "3" if quick else "9",
               "--events", "50000" if quick else "200000", "--json", micro_json], tmp), end="")
    micro = json.load(open(micro_json))

    blocks = 9 if quick else 60
    print("== (b) the main job's step, recorder off / on / control: bench_trace_step --blocks %d" % blocks)
    step_json = os.path.join(tmp, "step.json")
    text = run([os.path.join(bin_dir, "tandemrun"), "--standalone", "--nproc-per-node", "2",
                os.path.join(bin_dir, "bench_trace_step"), "--config", config, "--blocks", str(blocks),
                "--json", step_json], tmp)
    print("".join(l.replace("[rank 0]: ", "") + "\n" for l in text.splitlines() if l.startswith("[rank 0]")), end="")
    step = json.load(open(step_json))
    # Against the training thread's CPU time, not the (load-inflated) wall time: the larger share.
    step["overhead_model"] = (step["events_per_step"] * micro["ns_per_span"]["span, enabled"]
                              / (step["thread_cpu_ms"]["off"] * 1e6))

    configs = [("traced", True, ""), ("untraced", False, "")]
    if baseline:
        configs.append(("traced_baseline", True, baseline))
    print("== (c) the main job, %d steps, %s, %d round(s)" % (steps, " / ".join(c[0] for c in configs), rounds))
    runs = []
    for r in range(rounds):
        for name, traced, lib in configs[r % len(configs):] + configs[:r % len(configs)]:
            d = os.path.join(tmp, "job%d%s" % (r, name))
            os.makedirs(d)
            args = [os.path.join(bin_dir, "tandemrun"), "--standalone", "--nproc-per-node", "2"]
            if traced:
                args += ["--trace-dir", "trace"]
            run(args + [os.path.join(bin_dir, "train_lm"), "--config", config, "--set", "train.steps=%d" % steps,
                        "--set", "metrics.log_every=50", "--set", "metrics.file=m.jsonl"], d,
                dict(env, LD_LIBRARY_PATH=lib) if lib else env)
            records = {rec["step"]: rec for rec in map(json.loads, open(os.path.join(d, "m.jsonl")))}
            first, last = records[50], records[steps]
            row = {"config": name, "traced": traced, "peak_mib_step_50": round(first["peak_bytes"] / 2**20, 1),
                   "peak_mib_step_%d" % steps: round(last["peak_bytes"] / 2**20, 1),
                   "peak_growth": round(last["peak_bytes"] / first["peak_bytes"] - 1, 4),
                   "step_ms": round((last["elapsed_s"] - first["elapsed_s"]) / (steps - 50) * 1e3, 2)}
            if traced:
                timeline = json.load(open(os.path.join(d, "trace", "timeline.json")))
                row["events"] = sum(1 for e in timeline["traceEvents"] if e.get("ph") != "M")
            runs.append(row)
            print("  %-16s peak after step 50 %7.1f MiB, after step %d %7.1f MiB (%+.1f%%), %.1f ms/step" % (
                name, row["peak_mib_step_50"], steps, row["peak_mib_step_%d" % steps],
                row["peak_growth"] * 100, row["step_ms"]))

growth = {name: max(r["peak_growth"] for r in runs if r["config"] == name) for name, _, _ in configs}
result = dict(micro)  # keeps the documented keys: bench, events_per_round, rounds, ns_per_span
result.update({
    "step": step,
    "main_job": {"steps": steps, "rounds": rounds, "runs": runs, "peak_growth_max": growth,
                 "baseline_lib": baseline or None},
    "goals": {"peak_growth_traced_le_5pct": growth["traced"] <= 0.05,
              "overhead_model_le_1pct": step["overhead_model"] <= 0.01},
    "command": command, "revision": describe, "quick": quick,
    "libtandem": libtandem,
    "loadavg_before": load_before, "loadavg_after": loadavg(),
})
print("peak growth, step 50 -> %d (max over rounds; goal for traced <= 5%%): %s" % (
    steps, ", ".join("%s %+.1f%%" % (name, g * 100) for name, g in growth.items())))
print("recorder cost per step: %.1f events x %.0f ns = %.4f%% of the training thread's %.1f ms of CPU "
      "per step (goal <= 1%%); measured on / off - 1 = wall %+.2f%%, thread cpu %+.2f%%, against an "
      "A/A noise floor of wall %+.2f%%, thread cpu %+.2f%%" % (
          step["events_per_step"], micro["ns_per_span"]["span, enabled"], step["overhead_model"] * 100,
          step["thread_cpu_ms"]["off"], step["overhead"] * 100, step["overhead_cpu"] * 100,
          step["control"] * 100, step["control_cpu"] * 100))
result["provenance"] = harness.provenance(command, revision)
print("bench-trace: wrote %s (load average %s -> %s)" % (
    harness.write_result("trace_overhead", result, indent=1, path=args.out), load_before, result["loadavg_after"]))
