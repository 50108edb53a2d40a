"""Peak bytes held by libtorch's CPU allocator, per step phase, for the Python benchmark peers.

What: the bytes c10's default CPU allocator holds (every CPU tensor's storage, from any thread,
Gloo's included; the sizes requested, not Gloo's or Python's own buffers), at its highest in each
phase of a step (forward, backward, optimizer) and after the last event.

How: AllocatorLog() sets c10's FLAGS_caffe2_report_cpu_memory_usage through ctypes on
libc10.so; construct it right after `import torch`, before any tensor exists, so that c10's
ProfiledCPUMemoryReporter tracks every block and the running total. start() redirects stderr
(fd 2) to a temporary file and lowers FLAGS_caffe2_log_level to INFO, so that c10 logs one line
per allocation and free, "C10 alloc|deleted N bytes, total alloc T bytes"; mark(phase) writes a
marker line at each phase boundary; stop() restores the log level and stderr, turns tracking off,
parses the log and returns ({phase: peak bytes}, total after the last event). torch.profiler's
memory events are not used: they miss the frees done on Gloo's threads (their total drifts up
by about 16.8 MB a step).

Cost: tracking takes a mutex and a hash-map update per allocation and free (about 2 us each),
the log one line each; so the caller runs dedicated memory steps between start() and stop() and
keeps the flag off for the timed steps (stop() turns it off; without memory steps,
AllocatorLog._report.value = False).

Depends on c10 internals: the two flag symbols in libc10.so and the log line's format. Where a
symbol is missing, .error says "c10's allocator report flag not found: ..."; where the log has
no parsable line or misses a phase, stop() returns (None, None) and .error says "c10's allocator
wrote no usable log lines (N parsed)". The callers then report no peak (null, or the keys
absent) and the error as peak_error.
"""
import ctypes
import os
import re
import sys
import tempfile

import torch


class AllocatorLog:
    """The bytes c10's CPU allocator holds, after each allocation and free, from every thread."""

    LINE = re.compile(r"C10 (alloc|deleted) (\d+) bytes, total alloc (\d+) bytes")
    INFO = re.compile(r"\[I\d{4} \d\d:\d\d:\d\d")  # c10's INFO lines, shown only because of start()
    PHASES = ("forward", "backward", "optimizer")

    def __init__(self):
        self.error = None
        try:
            lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
            self._report = ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage")
            self._log_level = ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level")
        except (OSError, ValueError) as e:
            self.error = "c10's allocator report flag not found: %s" % e
            return
        self._report.value = True  # before any tensor exists: the total counts them all

    def start(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._stderr = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        self._old_level = self._log_level.value
        self._log_level.value = 0  # INFO: one line per allocation and free

    def mark(self, phase):
        os.write(2, ("SHB-PHASE %s\n" % phase).encode())

    def stop(self):
        """Stops tracking; returns {phase: peak bytes} and the total after the last event."""
        self._log_level.value = self._old_level
        self._report.value = False
        sys.stderr.flush()
        os.dup2(self._stderr, 2)
        os.close(self._stderr)
        self._file.seek(0)
        peaks, level, phase, events, other = {}, None, None, 0, []
        for raw in self._file:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith("SHB-PHASE "):
                phase = line.split()[1]
                if phase in self.PHASES and level is not None:
                    peaks[phase] = max(peaks.get(phase, 0), level)
                continue
            m = self.LINE.search(line)
            if not m:
                if not self.INFO.search(line):
                    other.append(line)
                continue
            kind, size, total = m.group(1), int(m.group(2)), int(m.group(3))
            if level is None and phase in self.PHASES:  # what the phase started with
                peaks[phase] = max(peaks.get(phase, 0), total - size if kind == "alloc" else total + size)
            level = total
            events += 1
            if phase in self.PHASES:
                peaks[phase] = max(peaks.get(phase, 0), total)
        self._file.close()
        for line in other:  # what else went to stderr meanwhile (warnings)
            if line.strip():
                print(line, file=sys.stderr)
        if events == 0 or len(peaks) != len(self.PHASES):
            self.error = "c10's allocator wrote no usable log lines (%d parsed)" % events
            return None, None
        return peaks, level
