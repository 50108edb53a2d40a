"""What every benchmark driver (bench/*/driver.py) needs, in one place: the drivers differ in what
they measure, not in how they record the tree, check the machine, run programs and write JSON.
Standard library only: a driver runs on whichever python its script chose (the venv's or the
system's), before or without torch.

A figure is only as good as its record: the commit it came from (and whether the tree was clean:
only a committed tree's figure is quotable), the command that made it, the machine and how busy
other work kept it. `provenance()` gathers the first three into the block every driver adds to
its JSON; `Load` watches the last."""
import argparse
import fcntl
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")
# The CPU flags that decide which kernels run (casts, bf16 math): recorded, not the whole list.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "f16c", "fma")
# A run that starts above this 1-minute load average is noisy (the data-parallel and sharded scripts'
# threshold); the benchmark's own ranks are not running yet.
QUIET_LOAD = 0.5
# Cores other processes may keep busy beside a timed run before it counts as disturbed (the
# activation-checkpointing benchmark's threshold).
QUIET_CORES = 0.3

program = os.path.basename(os.path.dirname(os.path.abspath(sys.argv[0])))  # bench/<name>/driver.py


def say(message):
    """A warning or a note on stderr, named after the benchmark (stdout holds its table)."""
    sys.stderr.write("bench %s: %s\n" % (program, message))
    sys.stderr.flush()


def fail(message):
    """Stops the driver with a message that names the benchmark; the result JSON stays as it was."""
    sys.exit("bench %s: %s" % (program, message))


def parser(doc, rounds=True):
    """The arguments every driver takes from its script (--build-dir, --command, --quick, and
    --rounds where it runs rounds); the driver adds its own."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.environ.get("TANDEM_BUILD_DIR", os.path.join(REPO, "build")),
                   help="the build directory whose bin/ holds the benchmark's programs")
    p.add_argument("--command", help="the command recorded in the JSON (default: this driver's)")
    p.add_argument("--quick", action="store_true", help="a short smoke run, marked \"quick\": true")
    if rounds:
        p.add_argument("--rounds", type=int, help="rounds of every mode (default: the benchmark's)")
    return p


def setup(parser, programs=(), needs=None):
    """Parses the arguments, finds PROGRAMS in the build directory (find_exe) and checks that this
    python can import NEEDS (require): (args, path of each program...)."""
    args = parser.parse_args()
    paths = [find_exe(args.build_dir, p) for p in programs]
    if needs:
        require(needs)
    return (args, *paths)


def find_exe(build, name, needs=None):
    """BUILD/bin/NAME (every executable lands there: CMAKE_RUNTIME_OUTPUT_DIRECTORY), or fails
    saying how to build it (NEEDS: what the build needs for it, where that is not everything)."""
    path = os.path.join(build, "bin", name)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        fail("%s is not built; build it with: TANDEM_BUILD_DIR=%s scripts/build --target %s%s" % (
            path, build, name, " (it needs %s)" % needs if needs else ""))
    return path


def require(module):
    """Fails unless this python can import MODULE (the venv's torch: scripts/install-deps fills it)."""
    import importlib.util
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:
        found = False
    if not found:
        fail("%s cannot import %s (run scripts/install-deps)" % (sys.executable, module))


def git(*args):
    """git's output in the repository (empty when git is missing or fails)."""
    try:
        return subprocess.run(["git", "-C", REPO] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True).stdout.strip()
    except OSError:
        return ""


def source():
    """The commit measured and whether tracked files differ from it; read before the run writes
    anything (the result JSON is tracked too)."""
    return {"commit": git("rev-parse", "HEAD"),
            "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no"))}


def describe():
    """`git describe --always --dirty`: the short revision some JSONs have always recorded."""
    return git("describe", "--always", "--dirty") or "unknown"


def cpuinfo(field):
    """The first value of FIELD in /proc/cpuinfo, or None."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model():
    return cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_flags(wanted=CPU_FLAGS):
    """The flags of WANTED this CPU has, sorted."""
    return sorted(set((cpuinfo("flags") or "").split()) & set(wanted))


def package_version(name):
    """An installed package's version (torch: without importing it), or None."""
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:
        return None


def machine():
    """The facts a reader needs to compare two runs' figures."""
    return {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
            "cores_usable": len(os.sched_getaffinity(0)), "kernel": platform.release(),
            "python": platform.python_version(), "torch": package_version("torch")}


def provenance(command, revision=None, load=None):
    """The block every driver adds to its JSON under "provenance": the tree (commit, describe,
    uncommitted_changes; quotable only when clean), the command, the date, the machine and, with
    LOAD (a Load after end()), how busy other work kept it. REVISION: a source() read before the
    run."""
    rev = dict(revision or source())
    rev["describe"] = describe()
    rev["quotable"] = not rev["uncommitted_changes"]
    out = dict(rev, command=command, argv=sys.argv, date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               machine=machine())
    if load is not None:
        out["load"] = load.record()
    return out


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


def others_busy_cores(window_s=3.0):
    """Cores other processes keep busy now (the driver runs nothing while it samples)."""
    b0, _ = busy_seconds()
    time.sleep(window_s)
    b1, _ = busy_seconds()
    return (b1 - b0) / window_s


def wait_for_quiet(limit_s=180, threshold=QUIET_CORES):
    """Waits (up to limit_s) until other processes use less than THRESHOLD cores; returns
    (seconds waited, cores they used at the end)."""
    start = time.time()
    busy = others_busy_cores()
    while busy >= threshold and time.time() - start < limit_s:
        time.sleep(5)
        busy = others_busy_cores()
    return round(time.time() - start, 1), round(busy, 2)


class Load:
    """How busy other work kept the machine: the load average before and after, and per timed
    call the cores other processes used beside it (busy CPU time not ours / wall time). Warns on
    stderr when the run starts above QUIET_LOAD or others used QUIET_CORES on average."""

    NOTE = ("load averages include this benchmark's own 2 busy ranks; other_processes_cpu_cores = "
            "busy CPU time (/proc/stat) minus the benchmark's own CPU time, per run, divided by its "
            "wall time")

    def __init__(self, warn_above=QUIET_LOAD):
        self.before = loadavg()
        self.after = None
        self.foreign = []  # per timed call: cores other processes used
        self.rounds = []   # the 1-minute load average after each round
        if warn_above is not None and self.before[0] > warn_above:
            say("warning: load average %.2f before the run: other work shares the cores, figures "
                "will be noisy" % self.before[0])

    def timed(self, fn, *args, **kwargs):
        """fn(*args, **kwargs), and the cores other processes used meanwhile: (result, cores)."""
        b0, c0, t0 = *busy_seconds(), time.time()
        result = fn(*args, **kwargs)
        b1, c1, t1 = *busy_seconds(), time.time()
        return result, max(0.0, ((b1 - b0) - (c1 - c0)) / max(t1 - t0, 1e-9))

    def watch(self, fn, *args, **kwargs):
        """fn(*args, **kwargs), recording the cores other processes used meanwhile."""
        result, cores = self.timed(fn, *args, **kwargs)
        self.foreign.append(cores)
        return result

    def round_done(self):
        self.rounds.append(loadavg()[0])

    def end(self):
        """Reads the load after the run; warns when others kept the cores busy."""
        self.after = loadavg()
        if self.foreign and statistics.mean(self.foreign) >= QUIET_CORES:
            say("warning: other processes used %.2f cores on average beside the timed runs (max %.2f): "
                "the machine was not quiet" % (statistics.mean(self.foreign), max(self.foreign)))
        return self.after

    def record(self):
        """What provenance() records of the load."""
        out = {"load_average_before": self.before, "load_average_after": self.after}
        if self.foreign:
            out["other_processes_cpu_cores_mean"] = round(statistics.mean(self.foreign), 3)
            out["other_processes_cpu_cores_max"] = round(max(self.foreign), 3)
        return out

    def machine(self, **extra):
        """The "machine" block of the data-parallel and sharded JSONs (call end() first)."""
        return dict({
            "cores": os.cpu_count(),
            "cpu": cpu_model(),
            "load_average_before": self.before,
            "load_average_after": self.after,
            "load_average_1min_after_each_round": self.rounds,
            "other_processes_cpu_cores_mean": round(statistics.mean(self.foreign), 3),
            "other_processes_cpu_cores_max": round(max(self.foreign), 3),
            "load_note": self.NOTE,
        }, **extra)

    def summary(self):
        """One line for the end of the table."""
        return ("load average before %s, after %s (1-min after each round: %s); other processes used "
                "%.2f cores on average during the runs (max %.2f)" % (
                    self.before, self.after, self.rounds, statistics.mean(self.foreign), max(self.foreign)))


def rotated(items, r):
    """ITEMS rotated left by r: round r starts with another mode, so slow drift favours none."""
    items = list(items)
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def in_rounds(rounds, modes, run, after_round=None, show=None):
    """Runs every mode once per round, the order rotated each round: run(mode, r) -> a result.
    Returns {mode: [result per round]}. show(r, mode, result) prints a progress line (default:
    its step_ms); after_round(r) runs after each round."""
    runs = {m: [] for m in modes}
    for r in range(rounds):
        for m in rotated(modes, r):
            res = run(m, r)
            runs[m].append(res)
            if show:
                show(r, m, res)
            else:
                print("round %d/%d  %-13s %8.2f ms" % (r + 1, rounds, m, res["step_ms"]), flush=True)
        if after_round:
            after_round(r)
    return runs


def median(results, key="step_ms"):
    """The median of KEY over a mode's results (one per round); key None: of the values."""
    return statistics.median(results if key is None else (x[key] for x in results))


def run(label, argv, timeout=900, env=None, cwd=None, echo=False, strip=None, out=None):
    """Runs ARGV and returns its output (stdout and stderr together). echo: print it line by
    line as it comes (strip: a prefix taken off each line, as "[rank 0]: "), else keep it. On a
    failure (an exit status, a timeout, or no file OUT afterwards) prints the output's tail and
    stops the driver, naming LABEL and the command."""
    lines = []
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, env=env, cwd=cwd)
    except OSError as e:
        fail("%s: cannot run '%s': %s" % (label, " ".join(argv), e))
    killed = []
    timer = threading.Timer(timeout, lambda: (killed.append(True), proc.kill()))
    timer.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if echo:
                sys.stdout.write(line[len(strip):] if strip and line.startswith(strip) else line)
                sys.stdout.flush()
        status = proc.wait()
    finally:
        timer.cancel()
    text = "".join(lines)
    timed_out = bool(killed)
    if status != 0 or (out is not None and not os.path.exists(out)):
        if not echo:
            sys.stderr.write(text[-8000:])
        why = ("timed out after %d s" % timeout if timed_out else "exit status %d" % status
               if status != 0 else "it wrote no %s" % out)
        fail("%s failed (%s): %s" % (label, why, " ".join(argv)))
    return text


def read_json(path):
    with open(path) as f:
        return json.load(f)


def run_json(label, argv, out, **kwargs):
    """run() a program that writes its result to OUT, and that result."""
    run(label, argv, out=out, **kwargs)
    return read_json(out)


def lines_json(obj):
    """One key per line, each value on one line (as the C++ benchmarks write their JSON)."""
    return "{\n" + ",\n".join("  %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in obj.items()) + "\n}\n"


def write_result(name, result, indent=2, path=None, lines=False):
    """Writes RESULT to bench/results/NAME.json (or PATH) atomically, keys in the order the
    driver put them, indented as that benchmark's JSON always was (lines: lines_json)."""
    path = path or os.path.join(RESULTS, name + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = lines_json(result) if lines else json.dumps(result, indent=indent) + "\n"
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path


def snapshot(build, names, dest):
    """Copies executables NAMES of BUILD, with the libtandem.so they load, its private Gloo and
    tandemrun's store module, to DEST (DEST/bin, DEST/lib/tandem: tandemrun finds its module in
    ../lib/tandem/ beside its own directory), under scripts/build's lock: the build directory may
    be shared and relinked while the benchmark measures. Returns {name: path} and sets
    LD_LIBRARY_PATH for the children."""
    exes = [find_exe(build, n) for n in names]
    os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
    os.makedirs(os.path.join(dest, "lib", "tandem"), exist_ok=True)
    with open(os.path.join(build, ".tandem-build.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for exe in exes:
            shutil.copy2(exe, os.path.join(dest, "bin"))
        for module in glob.glob(os.path.join(build, "lib", "tandem", "*.so")):
            shutil.copy(os.path.realpath(module), os.path.join(dest, "lib", "tandem", os.path.basename(module)))
        ldd = subprocess.run(["ldd", exes[0]], stdout=subprocess.PIPE, text=True).stdout
        lib = next((l.split("=>")[1].split()[0] for l in ldd.splitlines() if "libtandem.so" in l and "=>" in l), None)
        if lib:
            for so in (lib, os.path.join(os.path.dirname(lib), "libtandem_gloo.so")):
                shutil.copy(os.path.realpath(so), os.path.join(dest, "bin", os.path.basename(so)))
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (os.path.join(dest, "bin"), os.environ.get("LD_LIBRARY_PATH")) if p)
    return {n: os.path.join(dest, "bin", n) for n in names}
