#!/usr/bin/python3
"""Driver of scripts/bench-precision (which builds the programs and sets PRB_*): runs the W1 model
under DistributedDataParallel (and ShardedDataParallel stage 2) in fp32, under bf16 autocast and
with bf16 parameters (fp32 masters), modes interleaved in rounds, takes medians, prints a table and
writes bench/results/precision.json. The worker is bench_sharded (--param-dtype, --autocast)."""
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

bench, tandemrun, repo = (os.environ[k] for k in ("PRB_BENCH", "PRB_TANDEMRUN", "PRB_REPO"))
quick = os.environ["PRB_QUICK"] == "1"
command = os.environ["PRB_COMMAND"]
warmup, steps, rounds = (2, 6, 2) if quick else (3, 20, 5)
MODES = {  # name: (bench_sharded --mode, --param-dtype, --autocast)
    "fp32": ("ddp", "fp32", "off"),
    "bf16_autocast": ("ddp", "fp32", "bf16"),
    "bf16_params": ("ddp", "bf16", "off"),
    "bf16_params_autocast": ("ddp", "bf16", "bf16"),
    "zero2_fp32": ("zero2", "fp32", "off"),
    "zero2_bf16_params": ("zero2", "bf16", "off"),
}


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def run(name, out):
    mode, dtype, autocast = MODES[name]
    argv = [tandemrun, "--standalone", "--nproc-per-node", "2", bench, "--mode", mode, "--param-dtype", dtype,
            "--autocast", autocast, "--batch", "32", "--warmup", str(warmup), "--steps", str(steps), "--out", out]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0 or not os.path.exists(out):
        sys.stderr.write(p.stdout)
        sys.exit(f"bench-precision: {name} failed (exit {p.returncode})")
    with open(out) as f:
        return json.load(f)


def main():
    start = time.time()
    runs = {name: [] for name in MODES}
    names = list(MODES)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                result = run(name, os.path.join(tmp, f"{name}-{r}.json"))
                runs[name].append(result)
                print(f"round {r + 1}/{rounds}  {name:22s} {result['step_ms']:8.2f} ms", flush=True)
    results = {}
    for name, rs in runs.items():
        med = lambda key: round(statistics.median(x[key] for x in rs), 3)
        results[name] = {
            "mode": MODES[name][0], "param_dtype": MODES[name][1], "autocast": MODES[name][2],
            "step_ms": med("step_ms"), "forward_ms": med("forward_ms"), "backward_ms": med("backward_ms"),
            "optimizer_ms": med("optimizer_ms"), "peak_bytes_per_rank": int(max(x["peak_bytes"] for x in rs)),
            "parameter_bytes": int(rs[0]["parameter_bytes"]), "gradient_bytes": int(rs[0]["gradient_bytes"]),
            "optimizer_state_bytes": int(rs[0]["optimizer_state_bytes"]), "final_loss": rs[0]["final_loss"],
            "runs_step_ms": [round(x["step_ms"], 3) for x in rs],
        }
    base = results["fp32"]["step_ms"]
    for name, r in results.items():
        ref = results["zero2_fp32" if r["mode"] == "zero2" else "fp32"]
        r["step_to_fp32"] = round(r["step_ms"] / ref["step_ms"], 4)
        r["peak_to_fp32"] = round(r["peak_bytes_per_rank"] / ref["peak_bytes_per_rank"], 4)
    flags = cpu_flags()
    bf16_hw = sorted(f for f in ("avx512_bf16", "amx_bf16", "avx512f") if f in flags)
    doc = {
        "command": command, "quick": quick, "rounds": rounds, "warmup_steps": warmup, "timed_steps": steps,
        "setup": "W1 of scripts/bench-data-parallel (MLP 1024 -> 4x2048 ReLU -> 1024, 16.8 M parameters), "
                 "batch 32 per rank, MSE in fp32, AdamW lr 1e-3 on fp32 parameters or fp32 masters, "
                 "2 ranks (tandemrun --standalone --nproc-per-node 2) x 1 compute thread; step = zero_grad + "
                 "forward + loss + backward + optimizer step; peak = tandem's host allocator peak per rank "
                 "over the timed steps; medians over rounds of the larger rank's median step time",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "bf16_instructions": bf16_hw},
        "results": results,
        "seconds": round(time.time() - start, 1),
    }
    print()
    print(f"{'mode':22s} {'step ms':>8s} {'x fp32':>7s} {'fwd':>7s} {'bwd':>7s} {'optim':>7s} {'peak MiB':>9s} {'x fp32':>7s} {'loss':>7s}")
    for name, r in results.items():
        print(f"{name:22s} {r['step_ms']:8.2f} {r['step_to_fp32']:7.3f} {r['forward_ms']:7.2f} {r['backward_ms']:7.2f} "
              f"{r['optimizer_ms']:7.2f} {r['peak_bytes_per_rank'] / 2**20:9.1f} {r['peak_to_fp32']:7.3f} {r['final_loss']:7.4f}")
    print(f"bf16 instructions on this CPU: {', '.join(bf16_hw) or 'none'}; base fp32 step {base} ms")
    out = os.path.join(repo, "bench", "results", "precision.json")
    with open(out + ".tmp", "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(out + ".tmp", out)
    print(f"bench-precision: wrote {out} in {doc['seconds']} s")


main()
