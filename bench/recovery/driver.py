#!/usr/bin/env python3
"""Recovery after a worker dies (driven by scripts/bench-recovery, which builds
bench_recovery_worker and tandemrun): the same training program (bench/recovery/recovery_worker:
tandem DistributedDataParallel + CheckpointManager every 5 steps, 2 workers) under tandemrun
--max-restarts 1 with its default flags and under torchrun --max_restarts 1 --monitor_interval 0.1
(the torch wheel's, from the venv of scripts/env.sh; c10d rendezvous on a free port, so that no
other torchrun on the machine joins it), rank 1 SIGKILLs itself at step 12. Recovery time = the
first step rank 0 completes after the restart minus the moment of the kill, both CLOCK_REALTIME
stamps printed by the workers. Median over N trials, launchers interleaved (the order rotates per
trial). Also tandemrun --standby (forced) and --no-standby (the default before standby workers
became the default: every restart starts fresh processes).
Prints a table and writes bench/results/recovery.json (tandemrun_recovery_s, torchrun_recovery_s,
trials, ratio = torchrun / tandemrun with default flags, per-trial lists, the command).
--quick: 1 trial (marks the JSON "quick": true). Default: 5 trials.
Goal (issues #9, #20): tandemrun with its default flags recovers at least 3x faster than torchrun."""
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402
from harness import loadavg  # noqa: E402

parser = harness.parser(__doc__, rounds=False)
parser.add_argument("--trials", type=int, help="trials per launcher (default 5; --quick: 1)")
args = parser.parse_args()
quick = args.quick
trials = args.trials or (1 if quick else 5)
command = args.command or "scripts/bench-recovery" + (" --quick" if quick else "")
torchrun = shutil.which("torchrun")  # the venv's (scripts/env.sh puts its bin/ first on PATH)
KILL_STEP, EVERY, STEPS = 12, 5, 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_cmd(launcher, ckpt):
    program = [worker, "--ckpt", ckpt, "--steps", str(STEPS), "--every", str(EVERY),
               "--kill-rank", "1", "--kill-step", str(KILL_STEP)]
    if launcher.startswith("tandemrun"):
        standby = {"tandemrun": [], "tandemrun_standby": ["--standby"],
                   "tandemrun_no_standby": ["--no-standby"]}[launcher]
        return [tandemrun, "--nproc-per-node", "2", "--standalone", "--max-restarts", "1",
                "--monitor-interval", "0.1"] + standby + program
    # c10d on a free port of our own: no other torchrun on the machine joins this rendezvous.
    return [torchrun, "--nnodes", "1", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", "127.0.0.1:%d" % free_port(), "--max_restarts", "1",
            "--monitor_interval", "0.1", "--no_python"] + program


def trial(launcher):
    with tempfile.TemporaryDirectory(prefix="bench_recovery_") as tmp:
        env = dict(os.environ, TANDEM_TIMEOUT_S="60")
        p = subprocess.run(launch_cmd(launcher, os.path.join(tmp, "ckpt")), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    text = p.stdout
    kill = re.search(r"recovery kill t=([0-9.]+)", text)
    resumed = re.search(r"recovery step (\d+) restart [1-9]\d* t=([0-9.]+)", text)
    started = re.search(r"recovery start restart [1-9]\d* t=([0-9.]+)", text)
    if p.returncode != 0 or not kill or not resumed or not started:
        harness.fail("%s run failed (exit status %d); its output:\n%s" % (launcher, p.returncode, text[-4000:]))
    kill_t = float(kill.group(1))
    return float(resumed.group(2)) - kill_t, float(started.group(1)) - kill_t, int(resumed.group(1))


if torchrun is None:
    harness.fail("no torchrun on PATH: run scripts/install-deps")
launchers = ["tandemrun", "tandemrun_standby", "tandemrun_no_standby", "torchrun"]


def tandemrun_start_seconds(rounds=9):
    """Median wall time of `tandemrun --version` (the launcher's own start-up)."""
    samples = []
    for _ in range(rounds):
        t = time.monotonic()
        subprocess.run([tandemrun, "--version"], stdout=subprocess.DEVNULL, check=True)
        samples.append(time.monotonic() - t)
    return round(statistics.median(samples), 4)


revision = harness.source()
# The build directory may be shared (and relinked while we measure): run copies of tandemrun, the
# worker, libtandem and its private Gloo.
snap = tempfile.mkdtemp(prefix="bench-recovery.")
exes = harness.snapshot(args.build_dir, ["bench_recovery_worker", "tandemrun"], snap)
worker, tandemrun = exes["bench_recovery_worker"], exes["tandemrun"]
version_start = tandemrun_start_seconds()
print("tandemrun --version: %.3f s (median of 9)" % version_start)
load_before = loadavg()
times = {name: [] for name in launchers}
respawn = {name: [] for name in launchers}
resume_step = None
try:
    for t in range(trials):
        for name in harness.rotated(launchers, t):  # rotate per trial
            seconds, restarted, resume_step = trial(name)
            times[name].append(round(seconds, 4))
            respawn[name].append(round(restarted, 4))
            print("trial %d  %-20s  recovery %.3f s (new rank 0 in main after %.3f s; resumed at step %d)"
                  % (t + 1, name, seconds, restarted, resume_step), flush=True)
finally:
    shutil.rmtree(snap, ignore_errors=True)
load_after = loadavg()

med = {name: statistics.median(v) for name, v in times.items()}
ratio = med["torchrun"] / med["tandemrun"] if "torchrun" in med else None
print()
ratio_standby = med["torchrun"] / med["tandemrun_standby"] if "torchrun" in med else None
ratio_no_standby = med["torchrun"] / med["tandemrun_no_standby"] if "torchrun" in med else None
print("%-20s %11s %9s  %s" % ("launcher", "median (s)", "min (s)", "trials (s)"))
for name in launchers:
    print("%-20s %11.3f %9.3f  %s" % (name, med[name], min(times[name]), " ".join("%.3f" % v for v in times[name])))
for name in launchers:
    print("%-20s kill -> restarted rank 0 runs its code: median %.3f s (the launcher's share, incl. loading libtorch)"
          % (name, statistics.median(respawn[name])))
if ratio is not None:
    print("tandemrun (default flags) recovers %.1fx faster than torchrun; --standby %.1fx; --no-standby %.1fx "
          "(goal with default flags: >= 3x: %s)"
          % (ratio, ratio_standby, ratio_no_standby, "met" if ratio >= 3 else "NOT met"))
print("load average before/after: %s / %s (other work on the machine inflates both launchers' times)" % (load_before, load_after))

result = {
    "command": command,
    "quick": quick,
    "trials": trials,
    "tandemrun_recovery_s": round(med["tandemrun"], 4),
    "torchrun_recovery_s": round(med["torchrun"], 4) if "torchrun" in med else None,
    "ratio": round(ratio, 2) if ratio is not None else None,
    "tandemrun_standby_recovery_s": round(med["tandemrun_standby"], 4),
    "ratio_standby": round(ratio_standby, 2) if ratio_standby is not None else None,
    "goal_3x_met": (ratio >= 3) if ratio is not None else None,
    "goal_3x_met_with_standby": (ratio_standby >= 3) if ratio_standby is not None else None,
    "tandemrun_no_standby_recovery_s": round(med["tandemrun_no_standby"], 4),
    "ratio_no_standby": round(ratio_no_standby, 2) if ratio_no_standby is not None else None,
    "tandemrun_no_standby_trials_s": times["tandemrun_no_standby"],
    "tandemrun_no_standby_respawn_s": statistics.median(respawn["tandemrun_no_standby"]),
    "tandemrun_standby_trials_s": times["tandemrun_standby"],
    "tandemrun_standby_respawn_s": statistics.median(respawn["tandemrun_standby"]),
    "tandemrun_min_s": min(times["tandemrun"]),
    "torchrun_min_s": min(times["torchrun"]) if "torchrun" in times else None,
    "tandemrun_trials_s": times["tandemrun"],
    "tandemrun_respawn_s": statistics.median(respawn["tandemrun"]),
    "torchrun_respawn_s": statistics.median(respawn["torchrun"]) if "torchrun" in respawn else None,
    "respawn_note": "kill -> the restarted rank 0 enters main (after its shared libraries loaded): the launcher's share of recovery",
    "torchrun_trials_s": times.get("torchrun"),
    "setup": {"workers": 2, "steps": STEPS, "checkpoint_every": EVERY, "kill_rank": 1, "kill_step": KILL_STEP,
              "resumed_at_step": resume_step,
              "tandemrun": "tandemrun --nproc-per-node 2 --standalone --max-restarts 1 --monitor-interval 0.1 (default flags: standby workers on, as the program calls tandem::run_main)",
              "tandemrun_standby": "the same with --standby (the next attempt's workers started ahead, waiting in tandem::run_main)",
              "tandemrun_no_standby": "the same with --no-standby (every restart starts fresh processes)",
              "torchrun": "torchrun --nnodes 1 --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:<free port> --max_restarts 1 --monitor_interval 0.1 --no_python"},
    "source": revision,
    "machine": {"cores": os.cpu_count(), "load_average_before": load_before, "load_average_after": load_after},
    "tandemrun_version_start_s": version_start,
}
result["provenance"] = harness.provenance(command, revision)
print("wrote " + harness.write_result("recovery", result))
