#!/usr/bin/env python3
"""Reads and verifies tandem training-state checkpoints (docs/checkpoints.md) with numpy and xxhash.

A shard is a safetensors-compatible file: an 8-byte little-endian header length N, N bytes of JSON
header, then raw little-endian tensor bytes. A committed step is a directory step_N holding the
shards and manifest.json. This reader never executes anything from a checkpoint (no pickle) and
checks what the C++ loader checks, in the same order (checkpoint/format.cpp, step_directory.cpp):
strict JSON (base/json.cpp), every header and manifest field, every offset against the file
size, the shard header against the manifest's record of it (tensors and values), and, when
verifying, the manifest's XXH3-64, every tensor's and the whole file's. Every defect raises
CheckpointError naming the file and the reason; nothing else escapes.

Checksums need the `xxhash` module (`pip install xxhash`, or Debian's python3-xxhash;
scripts/install-deps puts it in tandem's venv).
verify=None (the default) verifies when it is importable; verify=True requires it.

Library use:
    from checkpoint_reader import load_step, verify_step, read_shard, read_manifest, committed_steps
    state = load_step("ckpt")                  # newest committed step, rank 0's file, verified
    verify_step("ckpt/step_0000000030")        # every file of that step, as the C++ loader would
    tensors, info = read_shard("ckpt/step_0000000030/rank_00000.safetensors")  # the file alone

Command line:
    checkpoint_reader.py ckpt/                       # newest committed step: states, files, values
    checkpoint_reader.py ckpt/step_0000000030 --verify    # and check every file of it
    checkpoint_reader.py ckpt/step_0000000030/rank_00001.safetensors --tensor rng/state
"""
import argparse
import os
import re
import sys


def _venv_python():
    """tandem's venv python (scripts/env.sh: $TANDEM_VENV, default ~/.local/share/tandem/venv)."""
    venv = os.environ.get("TANDEM_VENV") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "tandem", "venv")
    return os.path.join(venv, "bin", "python3")


try:
    import numpy as np
except ModuleNotFoundError:
    # Run as docs/checkpoints.md shows it, from a shell whose python3 lacks numpy: start again on
    # the venv's python, which scripts/install-deps gives numpy and xxhash.
    if __name__ != "__main__":
        raise
    python = _venv_python()
    if not os.access(python, os.X_OK) or os.path.realpath(sys.executable) == os.path.realpath(python):
        raise SystemExit("checkpoint_reader.py: needs numpy, which %s lacks; run scripts/install-deps "
                         "(it puts numpy into %s) or pip install numpy" % (sys.executable, python))
    os.execv(python, [python] + sys.argv)

from checkpoint_format import (DTYPES, INT64_MAX, MAX_MANIFEST, CheckpointError, Reject, Tensor,  # noqa: F401
                               fail, header_length, identical_values, parse_manifest, parse_shard_header,
                               shard_file_name, step_directory_name)

MANIFEST = "manifest.json"
CHUNK = 8 << 20
STEP_RE = re.compile(r"step_([0-9]{10,19})")
XXHASH_HINT = ("install the xxhash module (pip install xxhash, or apt-get install python3-xxhash; "
               "scripts/install-deps puts it in tandem's venv)")


def _xxh3(required):
    """The xxhash module, or None when it is missing and not required."""
    try:
        import xxhash
        return xxhash
    except ImportError:
        if required:
            raise CheckpointError("verifying checksums needs the Python module xxhash: "
                                  + XXHASH_HINT) from None
        return None


def _hasher(verify):
    return None if verify is False else _xxh3(required=verify is True)


def _open(path):
    try:
        return open(path, "rb")
    except FileNotFoundError:
        fail(path, "is missing")
    except OSError as e:
        fail(path, "cannot be read: %s" % e.strerror)


def _read_data(f, path, head, tensors, hasher, names):
    """Reads the data section in order: {name: bytes} of `names` (None: all); with `hasher`, checks
    every tensor's XXH3 and returns the whole file's XXH3 (else None)."""
    whole = hasher.xxh3_64(head) if hasher else None
    out = {}
    for t in tensors:
        part = hasher.xxh3_64() if hasher else None
        keep = [] if names is None or t.name in names else None
        if keep is None and not hasher:
            continue
        f.seek(len(head) + t.begin)
        left = t.end - t.begin
        while left > 0:
            piece = f.read(min(left, CHUNK))
            if not piece:
                fail(path, 'reading tensor "%s": the file ended early (truncated while being read)' % t.name)
            left -= len(piece)
            if hasher:
                part.update(piece)
                whole.update(piece)
            if keep is not None:
                keep.append(piece)
        if hasher and part.intdigest() != t.xxh3:
            fail(path, 'tensor "%s" checksum mismatch (stored %016x, computed %016x): the data is corrupt' % (
                t.name, t.xxh3, part.intdigest()))
        if keep is not None:
            out[t.name] = b"".join(keep)
    return out, whole.intdigest() if hasher else None


def read_manifest(step_dir, verify=None):
    """<step_dir>/manifest.json, parsed (parse_manifest), with its step checked against the directory
    name when that is step_N."""
    path = os.path.join(step_dir, MANIFEST)
    with _open(path) as f:
        if os.fstat(f.fileno()).st_size > MAX_MANIFEST:
            fail(path, "is larger than the manifest limit")
        text = f.read()
    hasher = _hasher(verify)
    m = parse_manifest(text, path, hasher.xxh3_64_intdigest if hasher else None)
    named = STEP_RE.fullmatch(os.path.basename(os.path.normpath(step_dir)))
    if named and int(named.group(1)) != m["step"]:
        fail(path, "says step %d but lives in %s" % (m["step"], named.group(0)))
    return m


def verify_shard(step_dir, manifest, file, verify=None, names=None):
    """Checks one file of a committed step against `file`, its record in `manifest`, as the C++
    loader does: present, size, header identical to the record (step, rank, world size, tensors
    and values), and when verifying every tensor's XXH3 and, beyond the C++ loader, the file's. Returns (header, {name: bytes} of `names`, None: all)."""
    path = os.path.join(step_dir, file["name"])
    hasher = _hasher(verify)
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size != file["bytes"]:
            fail(path, "is %d bytes, the manifest says %d (%s)" % (
                size, file["bytes"], "truncated" if size < file["bytes"] else "extended"))
        head = f.read(8)
        try:
            n = header_length(head, size)
        except Reject as e:
            fail(path, str(e))
        if 8 + n != file["header_bytes"]:
            fail(path, "header is %d bytes, the manifest says %d" % (8 + n, file["header_bytes"]))
        head += f.read(n)
        h = parse_shard_header(head[8:], size, path)
        step, world = manifest["step"], manifest["world_size"]
        if h["step"] != step or h["rank"] != file["rank"] or h["world_size"] != world:
            fail(path, "header says step %d rank %d of %d, the manifest says step %d rank %d of %d" % (
                h["step"], h["rank"], h["world_size"], step, file["rank"], world))
        if len(h["tensors"]) != len(file["tensors"]):
            fail(path, "header lists %d tensors, the manifest %d" % (len(h["tensors"]), len(file["tensors"])))
        for a, b in zip(h["tensors"], file["tensors"]):
            if a != b:
                fail(path, 'header entry "%s" differs from the manifest\'s record of "%s"' % (a.name, b.name))
        if not identical_values(h["values"], file["values"]):
            fail(path, "header values differ from the manifest's")
        data, whole = _read_data(f, path, head, file["tensors"], hasher, names)
    if hasher and whole != file["xxh3"]:
        fail(path, "file checksum mismatch (stored %016x, computed %016x): the file is corrupt" % (
            file["xxh3"], whole))
    return h, data


def verify_step(step_dir, verify=True):
    """Everything the C++ loader checks before it restores a step, for every file of it: the
    manifest, a file for rank 0, then verify_shard of each file. Returns the manifest."""
    m = read_manifest(step_dir, verify)
    if not any(f["rank"] == 0 for f in m["files"]):
        fail(os.path.join(step_dir, MANIFEST), "lists no file for rank 0")
    for f in m["files"]:
        verify_shard(step_dir, m, f, verify, names=())
    return m


def committed_steps(root):
    """Committed steps under `root` (directories step_N holding manifest.json), newest first."""
    try:
        names = os.listdir(root)
    except OSError as e:
        fail(root, "cannot be listed: %s" % e.strerror)
    steps = []
    for name in names:
        m = STEP_RE.fullmatch(name)
        if m and int(m.group(1)) <= INT64_MAX // 10 and os.path.exists(os.path.join(root, name, MANIFEST)):
            steps.append(int(m.group(1)))
    return sorted(steps, reverse=True)


def _arrays(tensors, data, bf16_as_float32):
    out = {}
    for t in tensors:
        if t.name in data:
            a = np.frombuffer(data[t.name], dtype=DTYPES[t.dtype]).reshape(t.shape)
            if t.dtype == "BF16" and bf16_as_float32:
                a = (a.astype(np.uint32) << 16).view(np.float32)
            out[t.name] = a
    return out


def read_shard(path, names=None, verify=None, bf16_as_float32=True):
    """One shard file alone: ({name: numpy array}, {"step", "rank", "world_size", "values"}).

    Checks the header as the C++ reader does and, when verifying, every tensor's XXH3. The file's
    XXH3 and the header's agreement with the manifest need the step: use load_step/verify_step."""
    hasher = _hasher(verify)
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            fail(path, "is %d bytes, too short for a shard header (truncated)" % size)
        head = f.read(8)
        try:
            head += f.read(header_length(head, size))
        except Reject as e:
            fail(path, str(e))
        h = parse_shard_header(head[8:], size, path)
        data, _ = _read_data(f, path, head, h["tensors"], hasher, names)
    info = {k: h[k] for k in ("step", "rank", "world_size", "values")}
    return _arrays(h["tensors"], data, bf16_as_float32), info


def find_step(path, step=None):
    """`path` itself when it holds a manifest.json (and `step` is None), else the directory of `step`
    under the checkpoint root `path` (default: the newest committed step)."""
    if step is None and os.path.exists(os.path.join(path, MANIFEST)):
        return path
    if step is None:
        steps = committed_steps(path)
        if not steps:
            fail(path, "holds no committed checkpoint (no step_N directory with a manifest.json)")
        step = steps[0]
    return os.path.join(path, step_directory_name(step))


def load_step(root, step=None, rank=0, verify=None, names=None, bf16_as_float32=True):
    """Tensors (`names`, None: all) and values of one rank's file of a committed step (find_step),
    checked against the manifest (verify_shard). Returns {"step", "world_size", "states",
    "tensors", "values", "metadata"}."""
    step_dir = find_step(root, step)
    m = read_manifest(step_dir, verify)
    files = [f for f in m["files"] if f["rank"] == rank]
    if not files:
        fail(os.path.join(step_dir, MANIFEST), "lists no file for rank %d" % rank)
    h, data = verify_shard(step_dir, m, files[0], verify, names)
    return {"step": m["step"], "world_size": m["world_size"], "states": m["states"],
            "tensors": _arrays(h["tensors"], data, bf16_as_float32), "values": h["values"],
            "metadata": m["metadata"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", help="checkpoint root, step directory, or shard file")
    p.add_argument("--rank", type=int, default=0, help="whose file to read (default 0)")
    p.add_argument("--tensor", action="append", help="print this tensor's values")
    p.add_argument("--verify", action="store_true",
                   help="require checksums (needs python3-xxhash) and check every file of the step")
    a = p.parse_args(argv)
    verify = True if a.verify else None
    try:
        path, rank = os.path.normpath(a.path), a.rank
        lone = os.path.isfile(path) and not os.path.exists(os.path.join(os.path.dirname(path), MANIFEST))
        if lone:
            tensors, info = read_shard(path, verify=verify)
            print("%s: step %d, rank %d of %d" % (path, info["step"], info["rank"], info["world_size"]))
            values = info["values"]
        else:
            if os.path.isfile(path):  # a file of a committed step: read it through the manifest
                m = re.fullmatch(r"rank_([0-9]{5})\.safetensors", os.path.basename(path))
                if not m:
                    fail(path, "is not named rank_NNNNN.safetensors, so no manifest entry describes it")
                path, rank = os.path.dirname(path), int(m.group(1))
            step_dir = find_step(path)
            if a.verify:
                verify_step(step_dir)
            s = load_step(step_dir, rank=rank, verify=verify)
            print("step %d, world size %d, rank %d's file" % (s["step"], s["world_size"], rank))
            tensors, values = s["tensors"], s["values"]
        for name, t in tensors.items():
            print("  %-50s %-8s %s" % (name, t.dtype, list(t.shape)))
        for k, v in sorted(values.items()):
            print("  value %s = %r" % (k, v))
        for name in a.tensor or []:
            if name not in tensors:
                fail(path, "holds no tensor %r; it holds %s" % (name, ", ".join(tensors)))
            print(name, "=", tensors[name])
        if a.verify:
            print("verified: " + ("every tensor's checksum; no manifest beside the file, so its file "
                                  "checksum and its agreement with a manifest were not checked" if lone else
                                  "the manifest and every file of the step against it (XXH3 of every "
                                  "tensor and file)"))
        elif _xxh3(required=False) is None:
            print("checkpoint_reader: checksums not verified: " + XXHASH_HINT, file=sys.stderr)
    except CheckpointError as e:
        print("checkpoint_reader: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
