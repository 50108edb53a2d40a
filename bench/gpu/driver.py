#!/usr/bin/env python3
"""tandem on one GPU next to PyTorch on the same card: step time and peak GPU memory of a
134 M-parameter MLP with AdamW, world 1 over NCCL, and how long an async checkpoint save blocks
training next to a sync save (driven by scripts/bench-gpu, which builds bench_gpu). Runs bench_gpu
(tandem's modes plain, ddp, zero1, zero2, zero3, bf16_masters, fp16_scaler, and the checkpoint
measurement) and bench/gpu/pytorch_gpu.py (PyTorch's modes) one after the
other in rounds on the one GPU, takes medians over rounds, evaluates the goals of issue 26, prints a
table and writes bench/results/gpu.json (atomically; nothing when a run fails).

Keys: device, torch, parameters; tandem and pytorch, each mode -> {step_ms, peak_bytes} (medians
over rounds; per-round figures in *_per_round); checkpoint (sync save vs how long an async save
blocks training); goals (each: met, the figures compared, the ratio and its limit); then how it was
made (command, source: commit and uncommitted_changes, setup notes, seconds).
Full runs: 2 rounds x 20 timed steps per mode (about 2 minutes on an H100); --quick: 1 round x 8,
marked "quick": true.
--device cpu (with --out elsewhere) rehearses the whole run on the CPU where no GPU is: both
programs' --device cpu, over Gloo; it checks the pipeline, none of its figures means anything."""
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

parser = harness.parser(__doc__)
parser.add_argument("--device", default="cuda", help="cuda, or cpu: the rehearsal")
parser.add_argument("--out", default=os.path.join(harness.RESULTS, "gpu.json"), help="the result JSON")
args = parser.parse_args()
bench = harness.find_exe(args.build_dir, "bench_gpu", needs="tandem's CUDA part (the CUDA toolkit and NCCL at "
                         "configure time) and a CUDA libtorch (libc10_cuda)")
python = sys.executable  # the venv's: the torch wheel tandem builds against
quick = args.quick
command = args.command or "scripts/bench gpu" + (" --quick" if quick else "")
out_path = args.out
rounds = args.rounds or (1 if quick else 2)
warmup, steps, batch = (3, 8, 64) if quick else (5, 20, 64)
peer = os.path.join(harness.REPO, "bench", "gpu", "pytorch_gpu.py")
TANDEM_MODES = ["plain", "ddp", "zero1", "zero2", "zero3", "bf16_masters", "fp16_scaler"]
PYTORCH_MODES = ["plain", "ddp", "fsdp2", "amp_scaler"]


def run(label, argv, out):
    print("== gpu %s: %s" % (label, " ".join(argv)), flush=True)
    return harness.run_json(label, argv, out, echo=True)


def median_of(runs, mode, key):
    return statistics.median(r["modes"][mode][key] for r in runs)


start = time.time()
source = harness.source()
load = harness.Load(warn_above=None)
common = ["--steps", str(steps), "--warmup", str(warmup), "--batch", str(batch)]
if args.device != "cuda":  # the rehearsal: one step of each
    warmup, steps, batch = 1, 1, 4
    common = ["--steps", "1", "--warmup", "1", "--batch", "4", "--device", args.device]
cpp, py = [], []
with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
    for r in range(1, rounds + 1):
        out = os.path.join(tmp, "tandem-%d.json" % r)
        cpp.append(run("round %d/%d, tandem" % (r, rounds),
                       [bench, "--out", out, "--checkpoint-dir", os.path.join(tmp, "ckpt-%d" % r),
                        "--checkpoint-repeats", "1" if quick else "2"] + common, out))
        out = os.path.join(tmp, "pytorch-%d.json" % r)
        py.append(run("round %d/%d, PyTorch" % (r, rounds), [python, peer, "--out", out] + common, out))

parameters = cpp[0]["modes"]["plain"]["parameters"]
if py[0]["modes"]["plain"]["parameters"] != parameters:
    harness.fail("tandem's model has %d parameters, PyTorch's %d; %s not written"
                 % (parameters, py[0]["modes"]["plain"]["parameters"], out_path))


def side(runs, modes):
    return {m: {"step_ms": round(median_of(runs, m, "step_ms"), 3),
                "peak_bytes": int(median_of(runs, m, "peak_bytes")),
                "step_ms_per_round": [round(x["modes"][m]["step_ms"], 3) for x in runs],
                "peak_bytes_per_round": [x["modes"][m]["peak_bytes"] for x in runs]}
            for m in modes}


tandem, pytorch = side(cpp, TANDEM_MODES), side(py, PYTORCH_MODES)
ck = {k: statistics.median(r["checkpoint"][k] for r in cpp)
      for k in ("step_ms", "sync_save_ms", "async_call_ms", "async_blocking_ms")}
checkpoint = {k: round(v, 3) for k, v in ck.items()}
checkpoint["bytes"] = cpp[0]["checkpoint"]["bytes"]
checkpoint["repeats_per_round"] = cpp[0]["checkpoint"]["repeats"]
checkpoint["async_blocking_to_sync"] = round(ck["async_blocking_ms"] / ck["sync_save_ms"], 4)


def ms(side_, mode):
    return side_[mode]["step_ms"]


t_ovh = ms(tandem, "ddp") / ms(tandem, "plain") - 1
p_ovh = ms(pytorch, "ddp") / ms(pytorch, "plain") - 1
fp16_to_bf16 = ms(tandem, "fp16_scaler") / ms(tandem, "bf16_masters")
z3_step = ms(tandem, "zero3") / ms(pytorch, "fsdp2")
z3_peak = tandem["zero3"]["peak_bytes"] / max(1, pytorch["fsdp2"]["peak_bytes"])
goals = {
    "ddp_overhead_le_pytorch": {
        "met": t_ovh <= p_ovh, "tandem_overhead": round(t_ovh, 4), "pytorch_overhead": round(p_ovh, 4),
        "what": "tandem DDP's step / tandem's plain loop - 1 <= PyTorch DDP's / PyTorch's plain loop - 1"},
    "zero3_step_le_fsdp2": {
        "met": z3_step <= 1.0, "ratio": round(z3_step, 4), "limit": 1.0,
        "what": "tandem stage 3's step_ms / FSDP2's"},
    "zero3_peak_le_fsdp2": {
        "met": z3_peak <= 1.0, "ratio": round(z3_peak, 4), "limit": 1.0,
        "what": "tandem stage 3's peak_bytes / FSDP2's"},
    "fp16_scaler_le_1_1x_bf16": {
        "met": fp16_to_bf16 <= 1.1, "ratio": round(fp16_to_bf16, 4), "limit": 1.1,
        "what": "tandem fp16 + GradScaler's step_ms / bf16 masters' step_ms"},
    "async_checkpoint_blocks_le_5pct_of_sync": {
        "met": checkpoint["async_blocking_to_sync"] <= 0.05,
        "ratio": checkpoint["async_blocking_to_sync"], "limit": 0.05,
        "what": "how long an async save of the model and AdamW's state blocks training / a sync save"},
}

result = {
    "device": py[0]["device"],
    "torch": py[0]["torch"],
    "parameters": parameters,
    "tandem": tandem,
    "pytorch": pytorch,
    "checkpoint": checkpoint,
    "goals": goals,
    "command": command,
    "quick": quick,
    "source": source,
    "cuda": py[0]["cuda"],
    "nccl": py[0]["nccl"],
    "device_memory_bytes": py[0]["device_memory_bytes"],
    "rounds": rounds,
    "setup": ("one GPU, world 1 over NCCL (tandem: tandem::init with comm.backend = nccl; PyTorch: "
              "init_process_group('nccl') over a HashStore), no launcher; the model of "
              "bench/gpu/bench_model.h: 8 x Linear(4096, 4096), ReLU between, %d fp32 parameters, "
              "MSE, batch %d, AdamW lr 1e-3 weight decay 0.01 (tandem: libtorch's C++ AdamW; "
              "PyTorch: torch.optim.AdamW, foreach); %d warm-up then %d timed steps per mode, "
              "each synchronised; step_ms = median step, then the median over rounds (each round: "
              "bench_gpu, then pytorch_gpu.py); peak_bytes = c10's CUDA caching allocator's peak "
              "allocated bytes over the timed steps (torch.cuda.max_memory_allocated)"
              % (parameters, batch, warmup, steps)),
    "modes_note": ("tandem: plain = model + AdamW; ddp = DistributedDataParallel; zero1..zero3 = "
                   "ShardedDataParallel at that stage (stage 3: each Linear a ShardedUnit); "
                   "bf16_masters / fp16_scaler = DistributedDataParallel with bf16 / fp16 "
                   "parameters and fp32 masters (fp16: tandem::GradScaler). PyTorch: plain; ddp = "
                   "DistributedDataParallel; fsdp2 = fully_shard per Linear then the root; "
                   "amp_scaler = fp32 parameters under torch.autocast(float16) with "
                   "torch.amp.GradScaler"),
    "checkpoint_note": ("bench/gpu/checkpoint_blocking.h: the ddp mode's model and AdamW state "
                        "(bytes per save), keep_last 1; sync_save_ms = save() of a synchronous "
                        "CheckpointManager; async_blocking_ms = save() of an asynchronous one plus "
                        "how much longer the next step took than step_ms; medians"),
    "seconds": round(time.time() - start, 1),
}
load.end()
result["provenance"] = harness.provenance(command, source, load)
harness.write_result("gpu", result, indent=1, path=out_path)

MiB = 2.0 ** 20
print()
print("%s, torch %s, %.1f M parameters, AdamW, world 1 over NCCL; median over %d round%s%s" % (
    result["device"], result["torch"], parameters / 1e6, rounds, "" if rounds == 1 else "s",
    "  [quick]" if quick else ""))
print("%-9s %-13s %10s %11s" % ("", "mode", "ms/step", "peak MiB"))
for name, s in (("tandem", tandem), ("pytorch", pytorch)):
    for m, e in s.items():
        print("%-9s %-13s %10.3f %11.1f" % (name, m, e["step_ms"], e["peak_bytes"] / MiB))
print("checkpoint (%.0f MiB): sync save %.1f ms, async save blocks %.1f ms (%.1f%%)" % (
    checkpoint["bytes"] / MiB, checkpoint["sync_save_ms"], checkpoint["async_blocking_ms"],
    100 * checkpoint["async_blocking_to_sync"]))
for name, g in goals.items():
    figure = ("%+.1f%% vs %+.1f%%" % (100 * g["tandem_overhead"], 100 * g["pytorch_overhead"])
              if "ratio" not in g else "%.3f (limit %.2f)" % (g["ratio"], g["limit"]))
    print("goal %-40s %-4s %s" % (name, "met" if g["met"] else "NOT", figure))
print("bench gpu: wrote %s in %.0f s" % (out_path, result["seconds"]))
