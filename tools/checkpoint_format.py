"""The tandem checkpoint format in Python: strict JSON, shard headers and manifests from bytes.

A port of the C++ parsers (base/json.cpp, checkpoint/format.cpp) that accepts and rejects
exactly what they do, with the same checks in the same order; tools/checkpoint_reader.py builds
files and step directories on it. Every defect raises CheckpointError naming `where` (the file) and
the reason; no other exception escapes for any input bytes (tests/checkpoint/
test_checkpoint_reader_mutations.py holds the two readers to the same verdicts). Standard library
and numpy only; checksums are computed by the caller (XXH3-64, the xxhash module).
"""
import collections
import json
import math
import re
import struct

import numpy as np

FORMAT = "tandem-checkpoint"
VERSION = 1
MAX_HEADER = 100 << 20       # kMaxShardHeaderBytes
MAX_MANIFEST = 256 << 20     # kMaxManifestBytes
MAX_STRING = 64 << 20        # JsonLimits::max_string_bytes
MAX_DIMS = 16                # kMaxTensorRank
MAX_WORLD = 1 << 24
INT64_MIN, INT64_MAX, UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
MANIFEST_PREFIX = b'{\n  "manifest_xxh3": "'

DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # no numpy bfloat16: read as bits (the reader widens them)
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}

# One tensor of a shard header or manifest file entry (offsets relative to the data section).
Tensor = collections.namedtuple("Tensor", "name dtype shape begin end xxh3")


class CheckpointError(Exception):
    """The input is not a valid tandem checkpoint (the message names the file and the reason)."""


class Reject(Exception):
    """A reason without the file; fail() adds it."""


def fail(where, why):
    raise CheckpointError("'%s': %s" % (where, why))


# --- strict JSON, as base/json.cpp reads it --------------------------------------------------------

def _number(text, integer):
    if len(text) > 400:
        raise Reject("number literal too long")
    if integer:
        v = int(text)
        if INT64_MIN <= v <= INT64_MAX:
            return v  # other integers are doubles there, which every integer field rejects
    v = float(text)
    if not math.isfinite(v):
        raise Reject("number out of range")
    return v


def _no_constant(name):
    raise Reject("unexpected '%s', expected a value" % name)


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise Reject('duplicate key "%s"' % k[:64])
        out[k] = v
    return out


def _check_tree(v, depth, max_depth):
    if depth > max_depth:
        raise Reject("nesting deeper than %d" % max_depth)
    if isinstance(v, str):
        try:
            n = len(v.encode("utf-8"))
        except UnicodeEncodeError:
            raise Reject("unpaired surrogate in a string") from None
        if n > MAX_STRING:
            raise Reject("string longer than %d bytes" % MAX_STRING)
    elif isinstance(v, dict):
        for k, x in v.items():
            _check_tree(k, depth, max_depth)
            _check_tree(x, depth + 1, max_depth)
    elif isinstance(v, list):
        for x in v:
            _check_tree(x, depth + 1, max_depth)


def _strict_json(data, where, max_depth):
    """RFC 8259 and nothing else: no NaN/Infinity, duplicate keys, invalid UTF-8, unpaired
    surrogates, numbers beyond double, nesting beyond max_depth."""
    try:
        value = json.loads(data.decode("utf-8"), parse_int=lambda s: _number(s, True),
                           parse_float=lambda s: _number(s, False), parse_constant=_no_constant,
                           object_pairs_hook=_no_duplicates)
        _check_tree(value, 0, max_depth)
        return value
    except UnicodeDecodeError as e:
        fail(where, "malformed JSON: invalid UTF-8 at byte %d" % e.start)
    except RecursionError:
        fail(where, "malformed JSON: nesting deeper than %d" % max_depth)
    except (Reject, ValueError) as e:
        fail(where, "malformed JSON: %s" % e)


def _kind(v):
    for t, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                    (list, "array"), (dict, "object")):
        if isinstance(v, t):
            return name
    return "null"


def _as(v, kind, what):
    if _kind(v) != kind:
        raise Reject("%s must be a JSON %s, got %s" % (what, kind, _kind(v)))
    return v


def _at(obj, key, what):
    if key not in _as(obj, "object", what):
        raise Reject('%s has no "%s" member' % (what, key))
    return obj[key]


# --- field codecs (format.cpp) ----------------------------------------------------------------------

def _strict_int(s, what):
    if len(s) > 20 or not re.fullmatch(r"-?[0-9]+", s):
        raise Reject('%s is not an integer: "%s"' % (what, s[:32]))
    if re.fullmatch(r"-?0[0-9]+", s):
        raise Reject('%s has a leading zero: "%s"' % (what, s))
    v = int(s)
    if not INT64_MIN <= v <= INT64_MAX:
        raise Reject("%s overflows int64" % what)
    return v


def _hex64(s):
    if len(s) != 16 or not re.fullmatch(r"[0-9a-f]{16}", s):
        raise Reject('checksum "%s" is not 16 lowercase hex digits' % s[:32])
    return int(s, 16)


def _bits_float(bits):
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def _value_from_string(s, what):
    if s.startswith("int:"):
        return _strict_int(s[4:], what)
    if s.startswith("float:"):
        return _bits_float(_hex64(s[6:]))
    if s in ("bool:true", "bool:false"):
        return s == "bool:true"
    if s.startswith("str:"):
        return s[4:]
    raise Reject('%s has an unknown value encoding: "%s"' % (what, s[:32]))


def _value_from_json(j, what):
    kind = _as(_at(j, "type", what), "string", what + ".type")
    if kind == "int":
        return _as(_at(j, "value", what), "integer", what + ".value")
    if kind == "float":
        return _bits_float(_hex64(_as(_at(j, "bits", what), "string", what + ".bits")))
    if kind == "bool":
        return _as(_at(j, "value", what), "boolean", what + ".value")
    if kind == "string":
        return _as(_at(j, "value", what), "string", what + ".value")
    raise Reject('%s.type is "%s"; expected int, float, bool or string' % (what, kind))


def identical_values(a, b):
    """Same names, types and bits (NaN payloads and -0.0 included), as format.cpp's identical()."""
    return a.keys() == b.keys() and all(
        type(a[k]) is type(b[k]) and (struct.pack("<d", a[k]) == struct.pack("<d", b[k])
                                      if isinstance(a[k], float) else a[k] == b[k]) for k in a)


def _check_name(name, what):
    if not name:
        raise Reject("%s is empty" % what)
    if len(name.encode("utf-8")) > 4096:
        raise Reject("%s is %d bytes long; at most 4096 are allowed" % (what, len(name.encode("utf-8"))))
    if "\0" in name:
        raise Reject('%s "%s" must be UTF-8 text without NUL bytes' % (what, name.replace("\0", "\\0")))
    if name == "__metadata__":
        raise Reject('%s may not be "__metadata__"' % what)


def _tensor_fields(j, name, what, manifest):
    """{"dtype","shape","data_offsets"} (+ "xxh3" in the manifest) -> Tensor (xxh3 None in a shard)."""
    f = {}
    for key, v in _as(j, "object", what).items():
        if key == "dtype":
            f[key] = _as(v, "string", what + ".dtype")
            if f[key] not in DTYPES:
                raise Reject('unknown dtype "%s"; tandem reads %s' % (f[key][:32], ", ".join(DTYPES)))
        elif key == "shape":
            dims = _as(v, "array", what + ".shape")
            if len(dims) > MAX_DIMS:
                raise Reject("%s.shape has more than %d dimensions" % (what, MAX_DIMS))
            f[key] = tuple(_as(d, "integer", "%s.shape[%d]" % (what, i)) for i, d in enumerate(dims))
            if any(d < 0 for d in f[key]):
                raise Reject("%s.shape has a negative dimension" % what)
        elif key == "data_offsets":
            off = _as(v, "array", what + ".data_offsets")
            if len(off) != 2:
                raise Reject("%s.data_offsets must have 2 elements" % what)
            b, e = (_as(off[i], "integer", "%s.data_offsets[%d]" % (what, i)) for i in (0, 1))
            if b < 0 or e < b:
                raise Reject("%s.data_offsets [%d, %d] is not a valid range" % (what, b, e))
            f[key] = (b, e)
        elif manifest and key == "xxh3":
            f[key] = _hex64(_as(v, "string", what + ".xxh3"))
        else:
            raise Reject('%s has an unknown member "%s"' % (what, key[:64]))
    if any(k not in f for k in ("dtype", "shape", "data_offsets") + (("xxh3",) if manifest else ())):
        raise Reject("%s lacks one of dtype, shape, data_offsets%s" % (what, ", xxh3" if manifest else ""))
    n = DTYPES[f["dtype"]].itemsize
    for d in f["shape"]:
        if n != 0 and d > UINT64_MAX // n:
            raise Reject("%s: size overflows" % what)
        n *= d
    b, e = f["data_offsets"]
    if n != e - b:
        raise Reject("%s spans %d bytes but its shape and dtype need %d" % (what, e - b, n))
    return Tensor(name, f["dtype"], f["shape"], b, e, f.get("xxh3"))


def _tiling(tensors, what):
    """Tensors tile [0, data bytes) in order, without holes; returns the data bytes."""
    pos, names = 0, set()
    for t in tensors:
        if t.name in names:
            raise Reject('%s lists tensor "%s" twice' % (what, t.name))
        names.add(t.name)
        if t.begin != pos:
            raise Reject('%s: tensor "%s" starts at byte %d, expected %d (the data must be contiguous, '
                          "in order)" % (what, t.name, t.begin, pos))
        pos = t.end
    return pos


# --- shard header and manifest (format.cpp) ----------------------------------------------------------

def header_length(prefix, file_size):
    """The 8-byte length prefix, checked against the limit and the file size (raises Reject)."""
    (n,) = struct.unpack("<Q", prefix)
    if n > MAX_HEADER:
        raise Reject("shard header length %d exceeds the limit of %d bytes" % (n, MAX_HEADER))
    if file_size < 8 or n > file_size - 8:
        raise Reject("shard header length %d runs past the end of the %d-byte file (truncated)" % (
            n, file_size))
    return n


def parse_shard_header(data, file_size, where):
    """Parses the header JSON of a `file_size`-byte shard: dict with step, rank, world_size, values,
    tensors (Tensor list in offset order, xxh3 from the metadata), header_bytes, data_bytes."""
    h = {"values": {}, "tensors": [], "header_bytes": 8 + len(data)}
    try:
        root = _strict_json(data, where, 8)
        hashes, seen_meta = {}, False
        for key, val in _as(root, "object", "shard header").items():
            if key != "__metadata__":
                _check_name(key, "tensor name")
                h["tensors"].append(_tensor_fields(val, key, 'tensor "%s"' % key, False))
                continue
            seen_meta = True
            for mk, mv in _as(val, "object", "shard header __metadata__").items():
                what = 'shard header __metadata__["%s"]' % mk
                s = _as(mv, "string", what)
                if mk == "format":
                    if s != FORMAT:
                        raise Reject('%s is "%s", not a tandem checkpoint' % (what, s[:64]))
                elif mk == "version":
                    if _strict_int(s, what) != VERSION:
                        raise Reject("format version %s is not supported (this reader reads version %d)" % (
                            s, VERSION))
                elif mk == "step":
                    if _strict_int(s, what) < 0:
                        raise Reject("%s is negative" % what)
                elif mk == "rank":
                    if not 0 <= _strict_int(s, what) <= MAX_WORLD:
                        raise Reject("%s is out of range" % what)
                elif mk == "world_size":
                    if not 1 <= _strict_int(s, what) <= MAX_WORLD:
                        raise Reject("%s is out of range" % what)
                elif mk.startswith("xxh3."):
                    hashes[mk[5:]] = _hex64(s)
                elif mk.startswith("value."):
                    _check_name(mk[6:], "value name")
                    h["values"][mk[6:]] = _value_from_string(s, what)
                # Other metadata keys are ignored (forward compatible, as safetensors readers do).
            meta = val
            if any(k not in meta for k in ("format", "version", "step", "rank", "world_size")):
                raise Reject("shard header __metadata__ lacks one of format, version, step, rank, world_size")
            h.update(step=int(meta["step"]), rank=int(meta["rank"]), world_size=int(meta["world_size"]))
            if h["rank"] >= h["world_size"]:
                raise Reject("shard header rank is not below its world size")
        if not seen_meta:
            raise Reject("shard header has no __metadata__ (not a tandem checkpoint)")
        tensors = sorted(h["tensors"], key=lambda t: t.begin)
        for t in tensors:
            if t.name not in hashes:
                raise Reject('shard header has no checksum for tensor "%s"' % t.name)
        if len(hashes) != len(tensors):
            raise Reject("shard header has checksums for unknown tensors")
        h["tensors"] = [t._replace(xxh3=hashes[t.name]) for t in tensors]
        h["data_bytes"] = _tiling(h["tensors"], "shard header")
        if file_size != h["header_bytes"] + h["data_bytes"]:
            raise Reject("shard of %d bytes should be %d (header %d + data %d): truncated or extended" % (
                file_size, h["header_bytes"] + h["data_bytes"], h["header_bytes"], h["data_bytes"]))
    except Reject as e:
        fail(where, str(e))
    return h


def parse_manifest(text, where, xxh3_64=None):
    """Parses manifest.json bytes: dict with step, world_size, states, files (each with name, rank,
    bytes, xxh3, header_bytes, tensors (Tensor list), values) and metadata. The embedded checksum is
    checked when `xxh3_64` (bytes -> int, XXH3-64) is given."""
    try:
        if len(text) > MAX_MANIFEST:
            raise Reject("manifest larger than %d bytes" % MAX_MANIFEST)
        at = len(MANIFEST_PREFIX)
        if len(text) < at + 16 or not text.startswith(MANIFEST_PREFIX):
            raise Reject("manifest does not start with its checksum member (not a tandem manifest, or "
                         "damaged)")
        try:
            stored = _hex64(text[at:at + 16].decode("ascii"))
        except UnicodeDecodeError:
            raise Reject("manifest checksum is not 16 lowercase hex digits") from None
        if xxh3_64 is not None:
            actual = xxh3_64(text[:at] + b"0" * 16 + text[at + 16:])
            if actual != stored:
                raise Reject("manifest checksum mismatch (stored %016x, computed %016x): the manifest is "
                              "corrupt" % (stored, actual))
        root = _strict_json(text, where, 10)
        if _as(_at(root, "format", "manifest"), "string", "manifest.format") != FORMAT:
            raise Reject('manifest.format is not "%s"' % FORMAT)
        version = _as(_at(root, "version", "manifest"), "integer", "manifest.version")
        if version != VERSION:
            raise Reject("manifest format version %d is not supported (this reader reads version %d)" % (
                version, VERSION))
        m = {"step": _as(_at(root, "step", "manifest"), "integer", "manifest.step")}
        if m["step"] < 0:
            raise Reject("manifest.step is negative")
        m["world_size"] = _as(_at(root, "world_size", "manifest"), "integer", "manifest.world_size")
        if not 1 <= m["world_size"] <= MAX_WORLD:
            raise Reject("manifest.world_size %d is out of range" % m["world_size"])
        m["states"] = []
        for i, js in enumerate(_as(_at(root, "states", "manifest"), "array", "manifest.states")):
            what = "manifest.states[%d]" % i
            s = {"name": _as(_at(js, "name", what), "string", what + ".name")}
            _check_name(s["name"], what + ".name")
            if "/" in s["name"]:
                raise Reject("%s.name contains '/'" % what)
            if any(x["name"] == s["name"] for x in m["states"]):
                raise Reject('manifest lists state "%s" twice' % s["name"])
            s["kind"] = _as(_at(js, "kind", what), "string", what + ".kind")
            s["sharding"] = _as(_at(js, "sharding", what), "string", what + ".sharding")
            if s["sharding"] not in ("replicated", "sharded", "sliced"):
                raise Reject('%s.sharding is "%s"; expected replicated, sharded or sliced' % (
                    what, s["sharding"][:64]))
            m["states"].append(s)
        state_names = {s["name"] for s in m["states"]}
        m["files"] = []
        for i, jf in enumerate(_as(_at(root, "files", "manifest"), "array", "manifest.files")):
            what = "manifest.files[%d]" % i
            f = {"name": _as(_at(jf, "name", what), "string", what + ".name"),
                 "rank": _as(_at(jf, "rank", what), "integer", what + ".rank")}
            if not 0 <= f["rank"] < m["world_size"]:
                raise Reject("%s.rank %d is out of range" % (what, f["rank"]))
            if m["files"] and f["rank"] <= m["files"][-1]["rank"]:
                raise Reject("manifest.files are not in ascending, unique rank order")
            if f["name"] != shard_file_name(f["rank"]):
                raise Reject('%s.name "%s" should be "%s"' % (
                    what, f["name"][:64], shard_file_name(f["rank"])))
            f["bytes"] = _as(_at(jf, "bytes", what), "integer", what + ".bytes")
            f["header_bytes"] = _as(_at(jf, "header_bytes", what), "integer", what + ".header_bytes")
            if f["bytes"] < 0 or f["header_bytes"] < 8 or f["header_bytes"] > f["bytes"]:
                raise Reject("%s has inconsistent sizes" % what)
            f["xxh3"] = _hex64(_as(_at(jf, "xxh3", what), "string", what + ".xxh3"))
            f["tensors"] = []
            for name, jt in _as(_at(jf, "tensors", what), "object", what + ".tensors").items():
                _check_name(name, "tensor name")
                if "/" not in name or name.split("/", 1)[0] not in state_names:
                    raise Reject('%s: tensor "%s" belongs to no listed state' % (what, name))
                f["tensors"].append(_tensor_fields(jt, name, '%s.tensors["%s"]' % (what, name), True))
            data_bytes = _tiling(f["tensors"], what)
            if f["header_bytes"] + data_bytes != f["bytes"]:
                raise Reject("%s: header %d + data %d bytes != file size %d" % (
                    what, f["header_bytes"], data_bytes, f["bytes"]))
            f["values"] = {}
            for name, jv in _as(_at(jf, "values", what), "object", what + ".values").items():
                _check_name(name, "value name")
                f["values"][name] = _value_from_json(jv, '%s.values["%s"]' % (what, name))
            m["files"].append(f)
        meta = _as(_at(root, "metadata", "manifest"), "object", "manifest.metadata")
        m["metadata"] = {k: _as(v, "string", 'manifest.metadata["%s"]' % k) for k, v in meta.items()}
    except Reject as e:
        fail(where, str(e))
    return m


def shard_file_name(rank):
    return "rank_%05d.safetensors" % rank


def step_directory_name(step):
    return "step_%010d" % step

