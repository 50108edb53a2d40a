#!/usr/bin/env python3
"""Step-level fault tolerance vs today's restart from the checkpoint, on the same job under
periodic SIGKILLs (driven by scripts/bench-ft, which builds bench_ft_worker and tandemrun). The
job (bench/ft/ft_bench_worker): 4 ranks on CPU, an MLP of 6 x Linear(4096, 4096) (100.7 M fp32
parameters), DistributedDataParallel, SGD with momentum 0.9. Two modes, one after the other, each
for --duration seconds from its first committed step:
  step_ft   tandemrun --standalone --nproc-per-node 4 --ft-replace --max-restarts 1000 WORKER
            --set ft.enabled=true --set ft.replacement_wait_s=60   (no checkpoints)
  restart   tandemrun --standalone --nproc-per-node 4 --max-restarts 1000 WORKER --every 50
Every --interval seconds (first one interval after the first committed step) the driver SIGKILLs
one random live worker of launch rank >= 1 (seed printed and recorded), and stops the run at the
end through a stop file the workers agree on (they exit 0).
Per mode: failures, recovery_s (median over kills: kill -> first committed step after the abort /
after the restarted group resumed), steps_lost_per_failure (aborted steps / committed steps rolled
back), committed_fraction (steps committed over the failure window x clean step time / window
length), theory_fraction (1 - recovery_s / interval); step_ft.bytes_healed.
Prints a table and writes bench/results/ft.json (with goals: recovery <= 1 s; committed_fraction
>= 0.99 x theory at a 60 s interval; >= 10x fewer steps lost than restart).
  --quick: width 512, 2 layers, 40 s per mode, a kill every 12 s (marks the JSON "quick": true).
  --log-dir: keep each mode's full tandemrun output there."""
import collections
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402
from harness import loadavg, cpu_model  # noqa: E402

parser = harness.parser(__doc__, rounds=False)
parser.add_argument("--duration", type=float, help="seconds per mode (default 300; --quick: 40)")
parser.add_argument("--interval", type=float, help="seconds between kills (default 60; --quick: 12)")
parser.add_argument("--seed", type=int, help="the seed of the kill choices (default: from the clock)")
parser.add_argument("--width", type=int, help="the Linear layers' width (default 4096; --quick: 512)")
parser.add_argument("--layers", type=int, help="Linear layers (default 6; --quick: 2)")
parser.add_argument("--log-dir", default="", help="keep each mode's full tandemrun output there")
args = parser.parse_args()
quick, logdir = args.quick, args.log_dir
command = args.command or "scripts/bench-ft" + (" --quick" if quick else "")
duration = args.duration or (40 if quick else 300)
interval = args.interval or (12 if quick else 60)
width = args.width or (512 if quick else 4096)
layers = args.layers or (2 if quick else 6)
seed = args.seed if args.seed is not None else int(time.time()) % 1000000
if logdir:
    os.makedirs(logdir, exist_ok=True)
RANKS, EVERY, WAIT_S = 4, 50, 60
KILLS = max(int(duration // interval) - 1, 0)  # each kill has one whole interval after it
START_TIMEOUT_S, STOP_TIMEOUT_S = 600, 300
if KILLS < 1:
    harness.fail("--duration (%g s) must be at least twice --interval (%g s)" % (duration, interval))

PID = re.compile(r"ftb pid (\d+) rank (\d+)")
COMMIT = re.compile(r"ftb committed step (\d+) rank 0 t ([0-9.]+)")
ABORT = re.compile(r"ftb aborted step (\d+) rank 0 t ([0-9.]+)")
RESUMED = re.compile(r"ftb resumed step (\d+) restart (\d+) t ([0-9.]+)")
HEALED = re.compile(r"ftb healed bytes (\d+) rank (\d+) t ([0-9.]+)")


def alive(pid):  # not a zombie: tandemrun reads exit statuses with waitid(WNOWAIT)
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class Events:
    """What the workers printed, parsed as it arrives (launch rank 0 is never killed: its
    commits and aborts are the group's)."""

    def __init__(self, proc, log):
        self.lock = threading.Lock()
        self.pids, self.commits, self.aborts, self.resumes, self.heals = {}, [], [], [], []
        self.tail = collections.deque(maxlen=200)
        self.thread = threading.Thread(target=self.read, args=(proc, log), daemon=True)
        self.thread.start()

    def read(self, proc, log):
        for line in proc.stdout:
            if log:
                log.write(line)
            with self.lock:
                self.tail.append(line)
                if m := PID.search(line):
                    self.pids[int(m.group(2))] = int(m.group(1))
                elif m := COMMIT.search(line):
                    self.commits.append((float(m.group(2)), int(m.group(1))))
                elif m := ABORT.search(line):
                    self.aborts.append((float(m.group(2)), int(m.group(1))))
                elif m := RESUMED.search(line):
                    self.resumes.append((float(m.group(3)), int(m.group(1)), int(m.group(2))))
                elif m := HEALED.search(line):
                    self.heals.append((float(m.group(3)), int(m.group(1))))

    def snapshot(self):
        with self.lock:
            return dict(commits=list(self.commits), aborts=list(self.aborts),
                        resumes=list(self.resumes), heals=list(self.heals))


def first(seq, pred):
    return next((x for x in seq if pred(x)), None)


def recovery(mode, ev, kill_t, until):
    """(recovery end: a committed stamp, the point the lost work restarts from) or None."""
    if mode == "step_ft":
        # The first committed step after the abort the kill caused (a step the dead rank voted
        # for before it died may still commit after the kill: that one is not a recovery).
        ab = first(ev["aborts"], lambda a: kill_t < a[0] < until)
        if ab is None:
            return None
        end = first(ev["commits"], lambda c: c[0] > ab[0])
        return (end, ab[0]) if end else None
    # restart: the first committed step of the group that resumed after the kill.
    res = first(ev["resumes"], lambda r: r[0] > kill_t)
    if res is None:
        return None
    end = first(ev["commits"], lambda c: c[0] > res[0])
    return (end, res[0]) if end else None


def fail(why, ev, proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    harness.fail("%s; the last output:\n%s" % (why, "".join(list(ev.tail)[-60:])))


def run_mode(mode, rng):
    ckpt, stop = os.path.join(snap, mode + "-ckpt"), os.path.join(snap, mode + "-stop")
    program = [worker, "--ckpt", ckpt, "--stop-file", stop, "--width", str(width), "--layers", str(layers)]
    if mode == "step_ft":
        cmd = [tandemrun, "--standalone", "--nproc-per-node", str(RANKS), "--ft-replace",
               "--max-restarts", "1000"] + program + [
               "--set", "ft.enabled=true", "--set", "ft.replacement_wait_s=%d" % WAIT_S]
    else:
        cmd = [tandemrun, "--standalone", "--nproc-per-node", str(RANKS), "--max-restarts", "1000"] + \
              program + ["--every", str(EVERY)]
    log = open(os.path.join(logdir, mode + ".log"), "w") if logdir else None
    print("== %s: %s" % (mode, " ".join(cmd)), flush=True)
    load_before = loadavg()
    # TMPDIR: tandemrun's state and the flight-recorder dumps of each restart go with the snapshot.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env=dict(os.environ, TMPDIR=snap))
    ev = Events(proc, log)
    started = time.time()
    while not ev.snapshot()["commits"]:
        if proc.poll() is not None or time.time() - started > START_TIMEOUT_S:
            fail("%s: no step committed (exit status %s)" % (mode, proc.poll()), ev, proc)
        time.sleep(0.05)
    t0 = ev.snapshot()["commits"][0][0]
    kills = []
    while time.time() < t0 + duration:
        if proc.poll() is not None:
            fail("%s: tandemrun exited early with status %d" % (mode, proc.returncode), ev, proc)
        k = len(kills) + 1
        # Kill k once its time came and the group recovered from kill k-1 (else it waits).
        if k <= KILLS and time.time() >= t0 + k * interval and (
                not kills or recovery(mode, ev.snapshot(), kills[-1]["t"], float("inf"))):
            with ev.lock:
                live = sorted((r, p) for r, p in ev.pids.items() if r >= 1 and alive(p))
            if live:
                rank, pid = rng.choice(live)
                kill_t = time.time()
                os.kill(pid, signal.SIGKILL)
                kills.append({"t": kill_t, "rank": rank, "pid": pid})
                print("  %s: SIGKILL rank %d (pid %d) at +%.2f s" % (mode, rank, pid, kill_t - t0), flush=True)
        time.sleep(0.02)
    open(stop, "w").close()  # every rank sees it within a step; they stop after the same step
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        fail("%s: the workers did not stop within %d s of the stop file" % (mode, STOP_TIMEOUT_S), ev, proc)
    ev.thread.join()
    if log:
        log.close()
    if proc.returncode != 0:
        fail("%s: tandemrun exited with status %d" % (mode, proc.returncode), ev, proc)
    return metrics(mode, ev, t0, kills, cmd, load_before)


def metrics(mode, events, t0, kills, cmd, load_before):
    ev = events.snapshot()
    commits = sorted(ev["commits"])
    before = [c for c in commits if not kills or c[0] < kills[0]["t"]]
    if len(before) < 3:
        harness.fail("%s: %d committed steps before the first kill: lengthen --interval" % (mode, len(before)))
    # Clean step time: the steps before the first kill, less the first (warm-up).
    clean = (before[-1][0] - before[1][0]) / (before[-1][1] - before[1][1])
    # Failure window: from the last commit before the first kill to the last commit at or before
    # one interval after the last scheduled kill; it holds KILLS failures in ~KILLS intervals.
    win_end_t = t0 + (KILLS + 1) * interval if kills else commits[-1][0]
    start, end = before[-1], [c for c in commits if c[0] <= win_end_t][-1]
    fraction = (end[1] - start[1]) * clean / (end[0] - start[0])
    per_kill = []
    for i, k in enumerate(kills):
        until = kills[i + 1]["t"] if i + 1 < len(kills) else float("inf")
        r = recovery(mode, ev, k["t"], until)
        row = {"t_s": round(k["t"] - t0, 3), "rank": k["rank"], "pid": k["pid"],
               "recovery_s": round(r[0][0] - k["t"], 4) if r else None}
        if r:
            # Progress when the work was thrown away (the abort / the restarted group's resume).
            last = [c for c in commits if c[0] < r[1]]
            pre = last[-1][1] if last else 0
            regain = first(commits, lambda c: c[0] > r[1] and c[1] > pre)
            row["regain_step_s"] = round(regain[0] - k["t"], 4) if regain else None
            if mode == "step_ft":
                row["steps_lost"] = sum(1 for a in ev["aborts"] if k["t"] < a[0] < until)
                row["healed_bytes"] = [b for t, b in ev["heals"] if k["t"] < t < until]
            else:
                res = first(ev["resumes"], lambda x: x[0] == r[1])
                row["resumed_step"], row["last_step_before"] = res[1], pre
                row["steps_lost"] = pre - res[1]
        per_kill.append(row)
    done = [row for row in per_kill if row["recovery_s"] is not None]
    # Step time between recoveries (each recovery end to the next kill or the window's end): a
    # check on clean_step_s, which other load on the machine may have shifted.
    seg_t = seg_s = 0.0
    for i, row in enumerate(per_kill):
        if row["recovery_s"] is None:
            continue
        a = kills[i]["t"] + row["recovery_s"]
        b = kills[i + 1]["t"] if i + 1 < len(kills) else end[0]
        seg = [c for c in commits if a <= c[0] <= b]
        if len(seg) >= 2 and seg[-1][1] > seg[0][1]:
            seg_t, seg_s = seg_t + seg[-1][0] - seg[0][0], seg_s + seg[-1][1] - seg[0][1]
    rec = statistics.median([row["recovery_s"] for row in done]) if done else None
    out = {
        "failures": len(kills),
        "recovered": len(done),
        "committed_fraction": round(fraction, 4),
        "theory_fraction": round(1 - rec / interval, 4) if rec is not None else None,
        "recovery_s": round(rec, 4) if rec is not None else None,
        "steps_lost_per_failure": round(statistics.mean([r["steps_lost"] for r in done]), 3) if done else None,
        "regain_step_s": round(statistics.median([r["regain_step_s"] for r in done if r.get("regain_step_s") is not None]), 4)
                         if any(r.get("regain_step_s") is not None for r in done) else None,
        "clean_step_s": round(clean, 5),
        "clean_steps_measured": before[-1][1] - before[1][1],
        "steady_step_s": round(seg_t / seg_s, 5) if seg_s else None,
        "committed_fraction_steady": round((end[1] - start[1]) * seg_t / seg_s / (end[0] - start[0]), 4)
                                     if seg_s else None,
        "window": {"start_s": round(start[0] - t0, 3), "end_s": round(end[0] - t0, 3),
                   "start_step": start[1], "end_step": end[1]},
        "final_step": commits[-1][1],
        "run_s": round(commits[-1][0] - t0, 3),
        "aborted_steps_total": len(ev["aborts"]),
        "group_restarts": max([r[2] for r in ev["resumes"]], default=0),
        "per_kill": per_kill,
        "command": " ".join(os.path.basename(a) if a in (worker, tandemrun) else a.replace(snap, "$TMP")
                            for a in cmd),
        "load_average_before": load_before,
        "load_average_after": loadavg(),
    }
    if mode == "step_ft":
        healed = [b for r in done for b in r.get("healed_bytes", [])]
        out["bytes_healed"] = int(statistics.median(healed)) if healed else None
        out["heals"] = len(ev["heals"])
    return out


revision = harness.source()
# The build directory may be shared (and relinked while we measure): run copies of tandemrun, the
# worker, libtandem and its private Gloo (and tandemrun --ft's store module in ../lib/tandem/).
snap = tempfile.mkdtemp(prefix="bench-ft.")
exes = harness.snapshot(args.build_dir, ["bench_ft_worker", "tandemrun"], snap)
worker, tandemrun = exes["bench_ft_worker"], exes["tandemrun"]
rng = random.Random(seed)
print("bench-ft: seed %d, %d ranks, %d x Linear(%d, %d), %d s per mode, a kill every %g s (%d per mode)"
      % (seed, RANKS, layers, width, width, duration, interval, KILLS), flush=True)
try:
    results = {mode: run_mode(mode, rng) for mode in ("step_ft", "restart")}
finally:
    shutil.rmtree(snap, ignore_errors=True)
ft, rs = results["step_ft"], results["restart"]


def ratio(a, b):
    return round(a / b, 3) if a is not None and b not in (None, 0) else None


goals = {
    "recovery_le_1s": {"measured_s": ft["recovery_s"], "ratio": ratio(ft["recovery_s"], 1.0),
                       "met": ft["recovery_s"] is not None and ft["recovery_s"] <= 1.0},
    "committed_ge_0.99_theory": {"ratio": ratio(ft["committed_fraction"], ft["theory_fraction"]),
                                 "interval_s": interval, "goal_interval_s": 60,
                                 "met": ratio(ft["committed_fraction"], ft["theory_fraction"]) is not None
                                 and ft["committed_fraction"] >= 0.99 * ft["theory_fraction"]},
    "steps_lost_10x_fewer": {"ratio": ratio(rs["steps_lost_per_failure"], ft["steps_lost_per_failure"]),
                             "met": rs["steps_lost_per_failure"] is not None and ft["steps_lost_per_failure"] is not None
                             and rs["steps_lost_per_failure"] >= 10 * ft["steps_lost_per_failure"]
                             and rs["steps_lost_per_failure"] > 0},
}
if interval != 60:
    goals["committed_ge_0.99_theory"]["note"] = "the goal is stated at a 60 s interval; this run used %g s" % interval
if ft["steps_lost_per_failure"] == 0:
    goals["steps_lost_10x_fewer"]["note"] = "step_ft lost no step: no finite ratio"

print()
print("%-8s %8s %10s %8s %11s %10s %9s %11s %12s %13s" % ("mode", "failures", "committed", "theory",
      "recovery_s", "regain_s", "lost/fail", "clean_step", "steady_step", "bytes_healed"))
fmt = lambda v, f: (f % v) if v is not None else "-"
for name, m in results.items():
    print("%-8s %8d %10s %8s %11s %10s %9s %11s %12s %13s" % (
        name, m["failures"], fmt(m["committed_fraction"], "%.4f"), fmt(m["theory_fraction"], "%.4f"),
        fmt(m["recovery_s"], "%.3f"), fmt(m["regain_step_s"], "%.3f"), fmt(m["steps_lost_per_failure"], "%.2f"),
        fmt(m["clean_step_s"], "%.4f"), fmt(m["steady_step_s"], "%.4f"), fmt(m.get("bytes_healed"), "%d")))
print("step_ft's clean step / restart's: %s (the per-step commit vote; restart's includes its saves)"
      % fmt(ratio(ft["clean_step_s"], rs["clean_step_s"]), "%.3f"))
for name, g in goals.items():
    print("goal %-26s ratio %-8s %s%s" % (name, g["ratio"], "met" if g["met"] else "NOT met",
                                          " (%s)" % g["note"] if "note" in g else ""))

result = {
    "benchmark": "step-level fault tolerance (tandemrun --ft-replace) vs restart from the checkpoint "
                 "(every %d steps), one SIGKILL of a random rank >= 1 every %g s" % (EVERY, interval),
    "command": command,
    "quick": quick,
    "seed": seed,
    "setup": {"ranks": RANKS, "device": "cpu", "layers": layers, "width": width,
              "parameters": layers * (width * width + width), "batch_per_rank": 4,
              "optimizer": "SGD lr 1e-3 momentum 0.9", "duration_s": duration, "interval_s": interval,
              "kills_per_mode": KILLS, "restart_every_n_steps": EVERY, "ft_replacement_wait_s": WAIT_S},
    "step_ft": ft,
    "restart": rs,
    "clean_step_ratio_step_ft_over_restart": ratio(ft["clean_step_s"], rs["clean_step_s"]),
    "goals": goals,
    "definitions": {
        "clean_step_s": "rank 0's committed stamps before the first kill, the first step left out: "
                        "(t_last - t_second) / (steps between)",
        "recovery_s": "median over kills of (first committed stamp after the recovery start - kill time); "
                      "recovery start: step_ft, rank 0's first abort after the kill; restart, the restarted "
                      "group's resume line",
        "regain_step_s": "median over kills of (first commit of a step beyond the last one committed before "
                         "the recovery start - kill time); restart: includes redoing the rolled-back steps",
        "steps_lost_per_failure": "mean over kills; step_ft: rank 0's aborted steps between this kill and the "
                                  "next; restart: last step committed before the resume - the step resumed from",
        "committed_fraction": "(steps committed in the window x clean_step_s) / window length; the window runs "
                              "from the last commit before the first kill to the last commit at or before one "
                              "interval after the last scheduled kill (kills_per_mode failures in as many intervals)",
        "theory_fraction": "1 - recovery_s / interval_s",
        "bytes_healed": "median per heal of the source's parameter + momentum bytes (the tensors heal() sends)",
        "steady_step_s": "step time between recoveries (each recovery end to the next kill or the window end); "
                         "a check on clean_step_s under changing load",
        "committed_fraction_steady": "committed_fraction with steady_step_s in place of clean_step_s",
        "clean_step_ratio_step_ft_over_restart": "step_ft clean_step_s / restart clean_step_s: the per-step "
                                                 "cost of the commit vote (restart's includes its saves)",
    },
    "source": revision,
    "machine": {"nproc": len(os.sched_getaffinity(0)), "cores": os.cpu_count(), "cpu_model": cpu_model(),
                "load_average_end": loadavg()},
}
result["provenance"] = harness.provenance(command, revision)
print("wrote " + harness.write_result("ft", result))
