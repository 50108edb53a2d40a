#!/usr/bin/env python3
"""Mixed precision on the W1 model, 2 ranks x 1 compute thread: step time and peak memory per rank
(driven by scripts/bench-precision, which builds bench_sharded and tandemrun). Runs the W1 model under DistributedDataParallel (and ShardedDataParallel stage 2) in fp32, under bf16 autocast and
with bf16 parameters (fp32 masters), and its PyTorch peer (torch.nn.parallel.DistributedDataParallel
over gloo, fp32 and torch.autocast("cpu", dtype=torch.bfloat16)), all modes interleaved in rounds,
takes medians, prints a table and writes bench/results/precision.json (the peer under "pytorch",
with the ratios tandem / PyTorch of the same mode). The workers are bench_sharded (--param-dtype,
--autocast) and bench/precision/pytorch_amp.py (run by this driver's python, the venv's), both
started by tandemrun with 2 ranks. Full runs: 5 rounds x 20 timed steps; --quick: 2 rounds x 6
steps, marked "quick": true."""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

args, bench, tandemrun = harness.setup(harness.parser(__doc__, rounds=False), ["bench_sharded", "tandemrun"],
                                       needs="torch.distributed")
python = sys.executable  # the venv's (scripts/env.sh)
quick = args.quick
command = args.command or "scripts/bench precision" + (" --quick" if quick else "")
peer = os.path.join(harness.REPO, "bench", "precision", "pytorch_amp.py")
warmup, steps, rounds = (2, 6, 2) if quick else (3, 20, 5)
MODES = {  # name: (bench_sharded --mode, --param-dtype, --autocast)
    "fp32": ("ddp", "fp32", "off"),
    "bf16_autocast": ("ddp", "fp32", "bf16"),
    "bf16_params": ("ddp", "bf16", "off"),
    "bf16_params_autocast": ("ddp", "bf16", "bf16"),
    "zero2_fp32": ("zero2", "fp32", "off"),
    "zero2_bf16_params": ("zero2", "bf16", "off"),
}
PYTORCH_MODES = {  # name: pytorch_amp.py --autocast; compared with tandem's mode of the same name
    "fp32": "off",
    "bf16_autocast": "bf16",
}


def run(name, out):
    argv = [tandemrun, "--standalone", "--nproc-per-node", "2"]
    if name.startswith("pytorch_"):
        argv += [python, peer, "--autocast", PYTORCH_MODES[name[len("pytorch_"):]]]
    else:
        mode, dtype, autocast = MODES[name]
        argv += [bench, "--mode", mode, "--param-dtype", dtype, "--autocast", autocast]
    argv += ["--batch", "32", "--warmup", str(warmup), "--steps", str(steps), "--out", out]
    return harness.run_json(name, argv, out, env=dict(os.environ, OMP_NUM_THREADS="1"))


def show(r, name, result):
    print(f"round {r + 1}/{rounds}  {name:22s} {result['step_ms']:8.2f} ms", flush=True)


def main():
    start = time.time()
    source = harness.source()
    load = harness.Load()
    names = list(MODES) + ["pytorch_" + m for m in PYTORCH_MODES]
    with tempfile.TemporaryDirectory() as tmp:
        runs = harness.in_rounds(rounds, names, lambda name, r: load.watch(
            run, name, os.path.join(tmp, f"{name}-{r}.json")), show=show)
    load.end()
    results = {}
    for name in MODES:
        rs = runs[name]
        med = lambda key: round(harness.median(rs, key), 3)
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
    pytorch = {"torch": runs["pytorch_fp32"][0]["torch"], "python": runs["pytorch_fp32"][0]["python"]}
    for mode, autocast in PYTORCH_MODES.items():
        rs, ours = runs["pytorch_" + mode], runs[mode]
        med = lambda key: round(harness.median(rs, key), 3)
        peaks = [x.get("peak_bytes") for x in rs]
        peak = int(max(peaks)) if None not in peaks else None
        t = results[mode]
        per_round = [a["step_ms"] / b["step_ms"] for a, b in zip(ours, rs)]
        pytorch[mode] = {
            "autocast": autocast, "step_ms": med("step_ms"), "forward_ms": med("forward_ms"),
            "backward_ms": med("backward_ms"), "optimizer_ms": med("optimizer_ms"), "peak_bytes_per_rank": peak,
            "parameter_bytes": int(rs[0]["parameter_bytes"]), "gradient_bytes": int(rs[0]["gradient_bytes"]),
            "optimizer_state_bytes": int(rs[0]["optimizer_state_bytes"]), "final_loss": rs[0]["final_loss"],
            "runs_step_ms": [round(x["step_ms"], 3) for x in rs],
            "tandem_to_pytorch": {
                "step_ms": round(t["step_ms"] / med("step_ms"), 4),
                "step_ms_median_of_rounds": round(harness.median(per_round, None), 4),
                "forward_ms": round(t["forward_ms"] / med("forward_ms"), 4),
                "backward_ms": round(t["backward_ms"] / med("backward_ms"), 4),
                "optimizer_ms": round(t["optimizer_ms"] / med("optimizer_ms"), 4),
                "peak_bytes_per_rank": round(t["peak_bytes_per_rank"] / peak, 4) if peak else None,
            },
        }
        if peak is None:
            pytorch[mode]["peak_error"] = next(x.get("peak_error") for x in rs if "peak_bytes" not in x)
    for mode in PYTORCH_MODES:
        ref = pytorch["fp32"]
        r = pytorch[mode]
        r["step_to_fp32"] = round(r["step_ms"] / ref["step_ms"], 4)
        r["peak_to_fp32"] = (round(r["peak_bytes_per_rank"] / ref["peak_bytes_per_rank"], 4)
                             if r["peak_bytes_per_rank"] and ref["peak_bytes_per_rank"] else None)
    pytorch["setup"] = (
        "bench/precision/pytorch_amp.py run by the venv's python (scripts/env.sh), started by the same "
        "tandemrun command: the same model, seeds (model torch.manual_seed(0), inputs 1000 + rank), batch, "
        "threads (torch.set_num_threads(1)), warm-up and timed steps as bench_sharded --mode ddp; "
        "torch.nn.parallel.DistributedDataParallel over gloo with default options (25 MiB buckets, "
        "gradient_as_bucket_view=False), torch.optim.AdamW(lr 1e-3, weight decay 0.01) with its defaults, "
        "zero_grad(set_to_none=True); bf16_autocast: forward and loss under torch.autocast('cpu', "
        "dtype=torch.bfloat16), no GradScaler (bf16), output cast to fp32 before the MSE as in bench_sharded. "
        "Step and phase times: perf_counter over the same span as bench_sharded's steady_clock, the larger "
        "of the ranks' medians, median over rounds. peak_bytes_per_rank: the largest number of bytes live "
        "in libtorch's CPU allocator during a steady-state step (c10's allocation log over 2 untimed "
        "memory steps after the warm-up, from every thread: bench/pytorch_cpu_memory.py), the "
        "larger rank, max over rounds: the same quantity as tandem's figure, which counts each block "
        "rounded to 512 bytes with a 64-byte header (< 0.1 MiB more here). tandem_to_pytorch: tandem's "
        "figure of the same mode / PyTorch's (below 1: tandem is faster or smaller); "
        "step_ms_median_of_rounds: the median over rounds of the per-round ratio.")
    bf16_hw = harness.cpu_flags(("avx512_bf16", "amx_bf16", "avx512f"))
    doc = {
        "command": command, "source": source, "quick": quick, "rounds": rounds, "warmup_steps": warmup, "timed_steps": steps,
        "setup": "W1 of scripts/bench-data-parallel (MLP 1024 -> 4x2048 ReLU -> 1024, 16.8 M parameters), "
                 "batch 32 per rank, MSE in fp32, AdamW lr 1e-3 on fp32 parameters or fp32 masters, "
                 "2 ranks (tandemrun --standalone --nproc-per-node 2) x 1 compute thread; step = zero_grad + "
                 "forward + loss + backward + optimizer step; peak = tandem's host allocator peak per rank "
                 "over the timed steps; medians over rounds of the larger rank's median step time",
        "machine": {"cpu": harness.cpu_model(), "cores": os.cpu_count(),
                    "bf16_instructions": bf16_hw},
        "results": results,
        "pytorch": pytorch,
        "seconds": round(time.time() - start, 1),
    }
    print()
    print(f"{'mode':22s} {'step ms':>8s} {'x fp32':>7s} {'fwd':>7s} {'bwd':>7s} {'optim':>7s} {'peak MiB':>9s} {'x fp32':>7s} {'loss':>7s}")
    for name, r in results.items():
        print(f"{name:22s} {r['step_ms']:8.2f} {r['step_to_fp32']:7.3f} {r['forward_ms']:7.2f} {r['backward_ms']:7.2f} "
              f"{r['optimizer_ms']:7.2f} {r['peak_bytes_per_rank'] / 2**20:9.1f} {r['peak_to_fp32']:7.3f} {r['final_loss']:7.4f}")
    for mode in PYTORCH_MODES:
        r = pytorch[mode]
        peak = r["peak_bytes_per_rank"]
        print(f"{'pytorch_' + mode:22s} {r['step_ms']:8.2f} {r['step_to_fp32']:7.3f} {r['forward_ms']:7.2f} "
              f"{r['backward_ms']:7.2f} {r['optimizer_ms']:7.2f} "
              f"{peak / 2**20 if peak else float('nan'):9.1f} {r['peak_to_fp32'] or float('nan'):7.3f} {r['final_loss']:7.4f}")
    print(f"tandem / PyTorch ({pytorch['torch']}) DistributedDataParallel, same mode:")
    for mode in PYTORCH_MODES:
        q = pytorch[mode]["tandem_to_pytorch"]
        print(f"  {mode:20s} step {q['step_ms']:.3f} (median of rounds {q['step_ms_median_of_rounds']:.3f}), "
              f"forward {q['forward_ms']:.3f}, backward {q['backward_ms']:.3f}, optimizer {q['optimizer_ms']:.3f}, "
              f"peak " + (f"{q['peak_bytes_per_rank']:.3f}" if q["peak_bytes_per_rank"] else
                          f"not measured ({pytorch[mode].get('peak_error')})"))
    print(f"bf16 instructions on this CPU: {', '.join(bf16_hw) or 'none'}; base fp32 step {base} ms")
    doc["provenance"] = harness.provenance(command, source, load)
    out = harness.write_result("precision", doc)
    print(f"bench-precision: wrote {out} in {doc['seconds']} s")


main()
