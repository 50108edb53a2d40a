"""tools/checkpoint_reader.py against a checkpoint written by checkpoint_write_fixture (C++).

    test_checkpoint_reader.py DIR    (run by ctest with /usr/bin/python3: standard library + numpy)
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tools"))
import checkpoint_reader as cr  # noqa: E402

root = sys.argv[1]
assert cr.committed_steps(root) == [7], cr.committed_steps(root)
s = cr.load_step(root)
t = s["tensors"]
assert s["step"] == 7 and s["world_size"] == 1
assert s["metadata"] == {"purpose": "python reader fixture"}, s["metadata"]
assert s["values"] == {"user/step": 7, "user/lr": 0.25, "user/name": "fixture \u2713", "user/done": False}, s["values"]
np.testing.assert_array_equal(t["t/f32"], np.arange(12, dtype=np.float32).reshape(3, 4))
assert t["t/f32"].dtype == np.float32
np.testing.assert_array_equal(t["t/f64"], np.arange(5) / 4)
np.testing.assert_array_equal(t["t/f16"], np.arange(6, dtype=np.float16) - 2)
np.testing.assert_array_equal(t["t/bf16"], np.arange(4, dtype=np.float32) * 3)
np.testing.assert_array_equal(t["t/i64"], np.arange(-3, 3, dtype=np.int64) * 1000000000000)
np.testing.assert_array_equal(t["t/i32"], np.arange(7, dtype=np.int32))
np.testing.assert_array_equal(t["t/i16"], np.arange(3, dtype=np.int16))
np.testing.assert_array_equal(t["t/i8"], np.arange(-2, 2, dtype=np.int8))
np.testing.assert_array_equal(t["t/u8"], np.arange(250, 256).astype(np.uint8))
np.testing.assert_array_equal(t["t/bool"], np.array([True, False, True, False]))
assert t["t/empty"].shape == (0, 3)
assert t["t/scalar"].shape == () and t["t/scalar"] == 2.5

# A shard read alone, and the command line.
shard = os.path.join(root, "step_0000000007", "rank_00000.safetensors")
tensors, info = cr.read_shard(shard, names={"t/i32"})
assert list(tensors) == ["t/i32"] and info["rank"] == 0 and info["values"]["user/step"] == 7
out = subprocess.run([sys.executable, os.path.join(here, "..", "..", "tools", "checkpoint_reader.py"), root],
                     stdout=subprocess.PIPE, text=True, check=True).stdout
assert "t/f32" in out and "value user/step = 7" in out, out

# Damaged files are rejected with a CheckpointError naming the file, never a crash.
tmp = tempfile.mkdtemp()
try:
    data = open(shard, "rb").read()
    cases = {
        "truncated": data[:-3],
        "extended": data + b"\0",
        "huge_header_length": (1 << 60).to_bytes(8, "little") + data[8:],
        "bad_json": data[:8] + b"[" + data[9:],
        "short": data[:5],
    }
    for name, blob in cases.items():
        p = os.path.join(tmp, name + ".safetensors")
        open(p, "wb").write(blob)
        try:
            cr.read_shard(p)
        except cr.CheckpointError as e:
            assert p in str(e), (name, e)
        else:
            raise AssertionError("accepted a %s shard" % name)
finally:
    shutil.rmtree(tmp)
print("checkpoint_reader: all checks passed")
