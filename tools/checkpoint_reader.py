#!/usr/bin/env python3
"""Reads tandem training-state checkpoints (docs/checkpoints.md) with the standard library and numpy.

A shard is a safetensors-compatible file: an 8-byte little-endian header length N, N bytes of JSON
header, then raw little-endian tensor bytes. This reader never executes anything from a
checkpoint (no pickle): it parses JSON strictly (no NaN/Infinity literals, no duplicate keys) and
checks every offset against the file size before slicing.

Checksums are XXH3-64. The standard library has no XXH3, so they are verified only when the
optional `xxhash` module is importable (pass --verify to require it); the C++ loader always
verifies them.

Library use:
    from checkpoint_reader import load_step, read_shard, read_manifest, committed_steps
    tensors, meta = read_shard("ckpt/step_0000000030/rank_00000.safetensors")
    state = load_step("ckpt")            # newest committed step, rank 0's file

Command line:
    checkpoint_reader.py ckpt/                       # newest committed step: states, files, values
    checkpoint_reader.py ckpt/step_0000000030        # that step
    checkpoint_reader.py ckpt/step_0000000030/rank_00001.safetensors --tensor rng/state
"""
import argparse
import json
import os
import re
import struct
import sys

import numpy as np

FORMAT = "tandem-checkpoint"
VERSION = 1
MAX_HEADER = 100 << 20
MANIFEST = "manifest.json"
MANIFEST_PREFIX = b'{\n  "manifest_xxh3": "'
STEP_RE = re.compile(r"^step_(\d{10,19})$")

DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # no numpy bfloat16: read as bits, widened to float32 below
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}


class CheckpointError(Exception):
    """The file is not a valid tandem checkpoint (message says which file and why)."""


def _strict_json(data, what):
    def no_constants(name):
        raise CheckpointError("%s: JSON constant %s is not allowed" % (what, name))

    def no_duplicates(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise CheckpointError("%s: duplicate JSON key %r" % (what, k))
            out[k] = v
        return out

    try:
        text = data.decode("utf-8")
        return json.loads(text, parse_constant=no_constants, object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError("%s: malformed JSON header: %s" % (what, e)) from None


def _xxh3():
    try:
        import xxhash  # optional, not part of the standard library
        return xxhash.xxh3_64_intdigest
    except ImportError:
        return None


def _decode_value(s, what):
    if s.startswith("int:"):
        return int(s[4:])
    if s.startswith("float:"):
        return struct.unpack(">d", bytes.fromhex(s[6:]))[0]
    if s == "bool:true":
        return True
    if s == "bool:false":
        return False
    if s.startswith("str:"):
        return s[4:]
    raise CheckpointError("%s: unknown value encoding %r" % (what, s[:32]))


def read_shard_header(path):
    """Returns (header dict, data offset, file size) after bounds-checking the header."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError("%s: %d bytes, too short for a header (truncated)" % (path, size))
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER or n > size - 8:
            raise CheckpointError("%s: header length %d does not fit the %d-byte file" % (path, n, size))
        header = _strict_json(f.read(n), path)
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        raise CheckpointError("%s: no __metadata__ (not a tandem checkpoint)" % path)
    meta = header["__metadata__"]
    if meta.get("format") != FORMAT or meta.get("version") != str(VERSION):
        raise CheckpointError("%s: format %r version %r is not %s version %d" % (
            path, meta.get("format"), meta.get("version"), FORMAT, VERSION))
    # Every entry well-formed, then the tensors must tile the data section exactly, in offset order.
    entries = []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise CheckpointError("%s: tensor %r has a malformed entry" % (path, name))
        off, shape = e["data_offsets"], e["shape"]
        if (not isinstance(off, list) or len(off) != 2 or not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in off + shape)):
            raise CheckpointError("%s: tensor %r has bad offsets %r or shape %r" % (path, name, off, shape))
        if e["dtype"] not in DTYPES:
            raise CheckpointError("%s: tensor %r has unknown dtype %r" % (path, name, e["dtype"]))
        entries.append((off[0], name, e))
    pos = 0
    for b, name, e in sorted(entries, key=lambda t: t[0]):
        end = e["data_offsets"][1]
        nbytes = DTYPES[e["dtype"]].itemsize * int(np.prod(e["shape"], dtype=object))
        if b != pos or end - b != nbytes:
            raise CheckpointError("%s: tensor %r spans [%d, %d), expected [%d, %d)" % (
                path, name, b, end, pos, pos + nbytes))
        pos = end
    if 8 + n + pos != size:
        raise CheckpointError("%s: %d bytes, header and tensors need %d (truncated or extended)" % (
            path, size, 8 + n + pos))
    return header, 8 + n, size


def read_shard(path, names=None, verify=False, bf16_as_float32=True):
    """Reads one shard file: ({name: numpy array}, metadata dict with decoded 'values').

    `names`: only these tensors (default all). `verify`: check every tensor's XXH3-64 (needs the
    optional xxhash module; raises CheckpointError without it)."""
    header, data_start, _ = read_shard_header(path)
    meta = header["__metadata__"]
    h = _xxh3() if verify else None
    if verify and h is None:
        raise CheckpointError("--verify needs the 'xxhash' Python module (pip install xxhash)")
    tensors = {}
    with open(path, "rb") as f:
        for name, e in header.items():
            if name == "__metadata__" or (names is not None and name not in names):
                continue
            b, end = e["data_offsets"]
            f.seek(data_start + b)
            raw = f.read(end - b)
            if len(raw) != end - b:
                raise CheckpointError("%s: tensor %r is cut off (truncated)" % (path, name))
            if h is not None:
                want = int(meta.get("xxh3." + name, "x"), 16)
                if h(raw) != want:
                    raise CheckpointError("%s: tensor %r checksum mismatch" % (path, name))
            a = np.frombuffer(raw, dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
            if e["dtype"] == "BF16" and bf16_as_float32:
                a = (a.astype(np.uint32) << 16).view(np.float32)
            tensors[name] = a
    values = {k[len("value."):]: _decode_value(v, path) for k, v in meta.items() if k.startswith("value.")}
    info = {"step": int(meta["step"]), "rank": int(meta["rank"]), "world_size": int(meta["world_size"]),
            "values": values}
    return tensors, info


def read_manifest(step_dir, verify=False):
    """Parses <step_dir>/manifest.json; with `verify`, checks its embedded XXH3-64."""
    path = os.path.join(step_dir, MANIFEST)
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(MANIFEST_PREFIX) or len(data) < len(MANIFEST_PREFIX) + 16:
        raise CheckpointError("%s: does not start with its checksum member" % path)
    if verify:
        h = _xxh3()
        if h is None:
            raise CheckpointError("--verify needs the 'xxhash' Python module (pip install xxhash)")
        at = len(MANIFEST_PREFIX)
        stored = int(data[at:at + 16], 16)
        if h(data[:at] + b"0" * 16 + data[at + 16:]) != stored:
            raise CheckpointError("%s: manifest checksum mismatch" % path)
    m = _strict_json(data, path)
    if m.get("format") != FORMAT or m.get("version") != VERSION:
        raise CheckpointError("%s: not a %s version %d manifest" % (path, FORMAT, VERSION))
    return m


def committed_steps(root):
    """Committed steps under `root` (directories step_N holding manifest.json), newest first."""
    steps = []
    for name in os.listdir(root):
        m = STEP_RE.match(name)
        if m and os.path.isfile(os.path.join(root, name, MANIFEST)):
            steps.append(int(m.group(1)))
    return sorted(steps, reverse=True)


def load_step(root, step=None, rank=0, verify=False):
    """Tensors and values of one rank's file of a committed step (default: the newest).

    Returns {"step", "world_size", "tensors", "values", "metadata"}."""
    if step is None:
        steps = committed_steps(root)
        if not steps:
            raise CheckpointError("%s: no committed checkpoint" % root)
        step = steps[0]
    step_dir = os.path.join(root, "step_%010d" % step)
    m = read_manifest(step_dir, verify=verify)
    files = [f for f in m["files"] if f["rank"] == rank]
    if not files:
        raise CheckpointError("%s: rank %d wrote no file" % (step_dir, rank))
    f = files[0]
    path = os.path.join(step_dir, f["name"])
    if os.path.getsize(path) != f["bytes"]:
        raise CheckpointError("%s: size differs from the manifest's %d bytes" % (path, f["bytes"]))
    tensors, info = read_shard(path, verify=verify)
    return {"step": m["step"], "world_size": m["world_size"], "tensors": tensors,
            "values": info["values"], "metadata": m.get("metadata", {})}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", help="checkpoint root, step directory, or shard file")
    p.add_argument("--rank", type=int, default=0, help="whose file to read (default 0)")
    p.add_argument("--tensor", action="append", help="print this tensor's values")
    p.add_argument("--verify", action="store_true", help="check XXH3 checksums (needs xxhash)")
    a = p.parse_args(argv)
    try:
        if os.path.isfile(a.path):
            tensors, info = read_shard(a.path, verify=a.verify)
            print("%s: step %d, rank %d of %d" % (a.path, info["step"], info["rank"], info["world_size"]))
            values = info["values"]
        else:
            root, step = a.path, None
            m = STEP_RE.match(os.path.basename(os.path.normpath(a.path)))
            if m:
                root, step = os.path.dirname(os.path.normpath(a.path)), int(m.group(1))
            s = load_step(root, step, a.rank, verify=a.verify)
            print("step %d, world size %d, rank %d's file" % (s["step"], s["world_size"], a.rank))
            tensors, values = s["tensors"], s["values"]
        for name, t in tensors.items():
            print("  %-50s %-8s %s" % (name, t.dtype, list(t.shape)))
        for k, v in sorted(values.items()):
            print("  value %s = %r" % (k, v))
        for name in a.tensor or []:
            print(name, "=", tensors[name])
    except (CheckpointError, OSError, KeyError) as e:
        print("checkpoint_reader: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
