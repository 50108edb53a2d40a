#!/usr/bin/env python3
"""Regenerates tests/checkpoint/fuzz/corpus/ from a fixture checkpoint (checkpoint_write_fixture).

    make_corpus.py FIXTURE_STEP_DIR      e.g. build/tests/checkpoint/reader_fixture/step_0000000007

seed-* files are valid inputs to start the fuzzer from; reject-* files are malformed and must be
rejected by every parser (checkpoint_fuzz_corpus_test checks that). Manifest variants keep a stale
checksum: the fuzz target re-computes it, so their structural defects are exercised too.
"""
import os
import struct
import sys

step_dir = sys.argv[1]
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(out, exist_ok=True)
manifest = open(os.path.join(step_dir, "manifest.json"), "rb").read()
shard = open(os.path.join(step_dir, "rank_00000.safetensors"), "rb").read()
(hlen,) = struct.unpack("<Q", shard[:8])
header, data = shard[8:8 + hlen], shard[8 + hlen:]


def put(name, blob):
    with open(os.path.join(out, name), "wb") as f:
        f.write(blob)


def shard_with(h, d=data):
    h = h + b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + d


put("seed-manifest.json", manifest)
put("seed-shard.safetensors", shard)
put("seed-json-nested.json", b'{"a":[1,-2.5e-3,true,false,null,"\\u00e9\\ud83d\\ude00"],"b":{}}')
put("seed-json-empty-array.json", b"[]")

# Manifests.
put("reject-manifest-bad-checksum.json", manifest.replace(b'"step": 7', b'"step": 8'))
put("reject-manifest-truncated.json", manifest[: len(manifest) // 2])
put("reject-manifest-no-prefix.json", manifest[1:])
for name, old, new in [
    ("rank-out-of-range", b'"rank": 0', b'"rank": 5'),
    ("world-zero", b'"world_size": 1', b'"world_size": 0'),
    ("negative-step", b'"step": 7', b'"step": -7'),
    ("bad-dtype", b'"dtype": "F32"', b'"dtype": "C64"'),
    ("bad-sharding", b'"sharding": "replicated"', b'"sharding": "mirrored"'),
    ("huge-bytes", b'"bytes": ', b'"bytes": 99999999999999999999'),
    ("version-2", b'"version": 1', b'"version": 2'),
    ("nan", b'"header_bytes": ', b'"header_bytes": NaN, "x": '),
    ("duplicate-key", b'"format": "tandem-checkpoint",', b'"format": "tandem-checkpoint", "format": "x",'),
]:
    assert old in manifest, name
    put("reject-manifest-%s.json" % name, manifest.replace(old, new, 1))

# Shards.
put("reject-shard-huge-header-length.safetensors", struct.pack("<Q", 1 << 62) + shard[8:])
put("reject-shard-header-past-end.safetensors", struct.pack("<Q", len(shard)) + shard[8:])
put("reject-shard-truncated.safetensors", shard[:-1])
put("reject-shard-extended.safetensors", shard + b"\0")
put("reject-shard-short.safetensors", shard[:7])
put("reject-shard-not-json.safetensors", shard_with(b"\x80\x81\x82"))
put("reject-shard-no-metadata.safetensors",
    shard_with(b'{"t/x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4))
meta = (b'{"__metadata__":{"format":"tandem-checkpoint","version":"1","step":"1","rank":"0",'
        b'"world_size":"1","xxh3.t/x":"0000000000000000"},')
for name, entry, size in [
    ("hole", b'"t/x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8),
    ("overflow", b'"t/x":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,0]}}', 0),
    ("negative-dim", b'"t/x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', 4),
    ("reversed", b'"t/x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}', 4),
    ("size-mismatch", b'"t/x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', 4),
    ("offsets-not-ints", b'"t/x":{"dtype":"F32","shape":[1],"data_offsets":[0.5,4]}}', 4),
    ("deep", b'"t/x":' + b"[" * 200 + b"]" * 200 + b"}", 0),
    ("bad-utf8", b'"t/\xff":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4),
    ("rank-ge-world", None, 4),
]:
    if entry is None:
        h = meta.replace(b'"rank":"0"', b'"rank":"3"') + b'"t/x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    else:
        h = meta + entry
    put("reject-shard-%s.safetensors" % name, shard_with(h, b"\0" * size))
# Plain malformed JSON.
for i, blob in enumerate([b"", b"{", b"[1,]", b"01", b'"\\ud800"', b"{} x", b"1e999", b'{"a":1,"a":2}']):
    put("reject-json-%d.json" % i, blob)
print("wrote %d files to %s" % (len(os.listdir(out)), out))
