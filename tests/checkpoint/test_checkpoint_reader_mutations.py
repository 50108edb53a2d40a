"""tools/checkpoint_reader.py on damaged and tampered checkpoints, held to the C++ reader's verdicts.

    test_checkpoint_reader_mutations.py FIXTURE_DIR CHECKPOINT_VERDICT_BINARY FUZZ_CORPUS_DIR

Run by ctest with the venv's python (numpy and xxhash). Every input must be either
accepted or rejected with CheckpointError naming the file (any other exception is a failure), and
the verdict must be the C++ reader's (checkpoint_verdict: the loader's checks on a step directory,
read_shard_header on a shard, parse_manifest on a manifest):
  1. a value tampered in a shard header (with and without the manifest's file checksum made to
     match) and in the manifest (with and without its own checksum made right), also through the
     command line, whose --verify says how to install xxhash when the module is missing;
  2. every file of the fuzz corpus, as a shard and as a manifest (also with its checksum made right);
  3. deterministic mutations of the fixture step: bit flips, truncations and edited numbers in the
     shard and the manifest, each also with the manifest updated so the deeper checks are reached.
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
reader_py = os.path.join(here, "..", "..", "tools", "checkpoint_reader.py")
sys.path.insert(0, os.path.dirname(reader_py))
import checkpoint_reader as cr  # noqa: E402

try:
    import xxhash
except ImportError:
    sys.exit("test_checkpoint_reader_mutations: needs the xxhash module (run scripts/install-deps)")

fixture, verdict_bin, corpus = (os.path.abspath(a) for a in sys.argv[1:4])
STEP = "step_0000000007"
SHARD, MANIFEST = "rank_00000.safetensors", "manifest.json"
shard0 = open(os.path.join(fixture, STEP, SHARD), "rb").read()
manifest0 = open(os.path.join(fixture, STEP, MANIFEST), "rb").read()
PREFIX = b'{\n  "manifest_xxh3": "'
# Thousands of small files rewritten in place: on ext4 each truncation of a written file forces its
# writeback (auto_da_alloc), 10x slower than the readers themselves, so use memory where there is some.
tmp = tempfile.mkdtemp(prefix="ckpt_mutations_", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
SLOTS = 500
failures = []


def fix_checksum(m):
    """The manifest with its embedded XXH3 made right (as the fuzz target does)."""
    at = len(PREFIX)
    if len(m) < at + 16 or not m.startswith(PREFIX):
        return m
    zeroed = m[:at] + b"0" * 16 + m[at + 16:]
    return m[:at] + b"%016x" % xxhash.xxh3_64_intdigest(zeroed) + m[at + 16:]


def match_manifest(shard, m=manifest0):
    """The manifest updated to `shard`'s size, header size and file XXH3, checksum made right: only
    the header-against-manifest checks and the tensor checksums can then catch the change."""
    n = struct.unpack("<Q", shard[:8])[0] if len(shard) >= 8 else 0
    m = m.replace(b'"bytes": %d,' % len(shard0), b'"bytes": %d,' % len(shard), 1)
    m = m.replace(b'"header_bytes": %d,' % (8 + struct.unpack("<Q", shard0[:8])[0]),
                  b'"header_bytes": %d,' % (8 + n), 1)
    old, new = (b'"%016x"' % xxhash.xxh3_64_intdigest(s) for s in (shard0, shard))
    m = m.replace(old, new, 1)
    return fix_checksum(m)


def reframe(header):
    """A shard with this header JSON (length prefix and padding recomputed) and the fixture's data."""
    n0 = struct.unpack("<Q", shard0[:8])[0]
    header = header.rstrip(b" ")
    header += b" " * ((8 - (8 + len(header)) % 8) % 8)
    return struct.pack("<Q", len(header)) + header + shard0[8 + n0:]


def python_verdict(path, fn):
    """'ok' or 'reject'; anything but a CheckpointError naming `path` is recorded as a failure."""
    try:
        fn()
        return "ok"
    except cr.CheckpointError as e:
        if path not in str(e):
            failures.append("%s: the error does not name the file: %s" % (path, e))
        return "reject"
    except Exception as e:  # noqa: BLE001 -- exactly what this test exists to catch
        failures.append("%s: raised %s: %s" % (path, type(e).__name__, e))
        return "crash"


def cpp_verdicts(mode, paths):
    # One thread: the verdict does not depend on it, and OpenMP's spinning costs 3x on a busy machine.
    out = subprocess.run([verdict_bin, mode] + paths, stdout=subprocess.PIPE, check=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1")).stdout
    lines = out.decode("utf-8", "replace").split("\n")[:-1]  # reasons may quote any byte but \n
    assert len(lines) == len(paths), lines
    return lines


def compare(label, mode, cases, fn):
    """cases: [(name, target, {relative path: bytes})]. Each case's files are written into one of
    SLOTS scratch directories in turn (creating and removing thousands of directories is slow on
    ext4); both readers then judge the slot's `target` (an absolute target is read as it is), the
    Python reader by fn(path). Returns the counts of Python verdicts."""
    counts = {}
    for at in range(0, len(cases), SLOTS):
        chunk, paths = cases[at:at + SLOTS], []
        for i, (name, target, files) in enumerate(chunk):
            slot = os.path.join(tmp, "slot%d" % i)
            for rel, data in files.items():
                os.makedirs(os.path.dirname(os.path.join(slot, rel)), exist_ok=True)
                with open(os.path.join(slot, rel), "wb") as f:
                    f.write(data)
            paths.append(os.path.join(slot, target))
        for (name, _, _), path, c in zip(chunk, paths, cpp_verdicts(mode, paths)):
            py = python_verdict(path, lambda: fn(path))
            counts[py] = counts.get(py, 0) + 1
            if py != c.split(" ", 1)[0]:
                failures.append("%s %s: Python says %s, C++ says %s" % (label, name, py, c))
    print("%s: %d inputs, Python verdicts %s" % (label, len(cases), counts))
    return counts


def step_case(name, shard, manifest):
    return (name, STEP, {os.path.join(STEP, SHARD): shard, os.path.join(STEP, MANIFEST): manifest})


def load_verified(root):
    return cr.load_step(root, 7, rank=0, verify=True)  # the fixture's world is 1: rank 0 is every file


try:
    # 1. The tampered value of issue 20 ("value.<state>/<key>":"int:140" -> "int:149"), the fixture's way.
    assert b'"value.user/step":"int:7"' in shard0 and b'"user/step": {\n' in manifest0
    tampered = shard0.replace(b'"value.user/step":"int:7"', b'"value.user/step":"int:9"')
    manifest_9 = re.sub(rb'("user/step": \{\s*"type": "int",\s*"value": )7', rb"\g<1>9", manifest0)
    assert manifest_9 != manifest0, manifest0
    tamper = {
        "shard value": (tampered, manifest0, "header values differ"),
        "shard value, file checksum matched": (tampered, match_manifest(tampered), "header values differ"),
        "manifest value": (shard0, manifest_9, "manifest checksum mismatch"),
        "manifest value, its checksum matched": (shard0, fix_checksum(manifest_9), "header values differ"),
    }
    for i, (name, (shard, manifest, why)) in enumerate(tamper.items()):
        root = os.path.join(tmp, "tampered%d" % i)
        for rel, data in step_case(name, shard, manifest)[2].items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "wb") as f:
                f.write(data)
        try:
            load_verified(root)
            failures.append("tamper %s: accepted" % name)
        except cr.CheckpointError as e:
            if why not in str(e) or root not in str(e):
                failures.append("tamper %s: %r does not say %r and name the file" % (name, str(e), why))
        for target in (os.path.join(root, STEP), os.path.join(root, STEP, SHARD)):
            r = subprocess.run([sys.executable, reader_py, target, "--verify"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
            if r.returncode != 1 or why not in r.stderr:
                failures.append("tamper %s: `checkpoint_reader.py %s --verify` exited %d: %s" % (
                    name, target, r.returncode, r.stderr.strip()))
    counts = compare("tampered values", "--step", [step_case(k, *v[:2]) for k, v in tamper.items()],
                     lambda d: load_verified(os.path.dirname(d)))
    if counts != {"reject": len(tamper)}:
        failures.append("tampered values: Python verdicts %s, expected every one rejected" % counts)

    # --verify without the xxhash module says how to install it.
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['xxhash'] = None; "
                        "sys.path.insert(0, %r); import checkpoint_reader; "
                        "sys.exit(checkpoint_reader.main(sys.argv[1:]))" % os.path.dirname(reader_py),
                        os.path.join(fixture, STEP), "--verify"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 1 or "pip install xxhash" not in r.stderr:
        failures.append("--verify without xxhash exited %d: %s" % (r.returncode, r.stderr.strip()))

    # 2. The fuzz corpus, as a shard and as a manifest (also with its checksum made right).
    names = sorted(os.listdir(corpus))
    assert len(names) >= 30, names
    shards, manifests, fixed = [], [], []
    for name in names:
        blob = open(os.path.join(corpus, name), "rb").read()
        shards.append((name, os.path.join(corpus, name), {}))
        manifests.append((name, MANIFEST, {MANIFEST: blob}))
        fixed.append((name, MANIFEST, {MANIFEST: fix_checksum(blob)}))
    shard_counts = compare("corpus as shards", "--shard", shards, lambda p: cr.read_shard(p, verify=False))
    manifest_counts = compare("corpus as manifests", "--manifest", manifests,
                              lambda p: cr.read_manifest(os.path.dirname(p), verify=True))
    compare("corpus as manifests, checksum made right", "--manifest", fixed,
            lambda p: cr.read_manifest(os.path.dirname(p), verify=True))
    assert shard_counts.get("ok") and manifest_counts.get("ok"), "the corpus seeds must be read"

    # 3. Mutations of the fixture step.
    mutations = []  # (name, shard, manifest)
    n0 = struct.unpack("<Q", shard0[:8])[0]
    header0 = shard0[8:8 + n0]

    def both(name, shard):
        mutations.append((name, shard, manifest0))
        mutations.append((name + " +manifest matched", shard, match_manifest(shard)))

    for pos in range(0, len(shard0), max(1, len(shard0) // 100)):
        both("shard bit %d.%d" % (pos, pos % 8),
             shard0[:pos] + bytes([shard0[pos] ^ (1 << (pos % 8))]) + shard0[pos + 1:])
    for key in (b'"xxh3.t/f32"', b'"value.user/lr"', b'"int:7"', b'"format"', b'"data_offsets"', b'"F16"'):
        at = shard0.index(key)
        for pos in range(at, at + len(key)):
            for bit in (0, 5):
                both("shard %s bit %d.%d" % (key.decode(), pos, bit),
                     shard0[:pos] + bytes([shard0[pos] ^ (1 << bit)]) + shard0[pos + 1:])
    for n in sorted({0, 1, 7, 8, 9, n0 // 2, n0 + 7, n0 + 8, n0 + 9, len(shard0) - 1}
                    | set(range(0, len(shard0), max(1, len(shard0) // 30)))):
        both("shard truncated to %d" % n, shard0[:n])
    both("shard extended", shard0 + b"\0" * 8)
    edits = [lambda v: str(v + 1), lambda v: str(v - 1), lambda v: "0", lambda v: "-1", lambda v: "1.5",
             lambda v: "01", lambda v: "1e3", lambda v: "99999999999999999999", lambda v: str(v) + ".0"]
    for k, m in enumerate(re.finditer(rb"[0-9]+", header0)):
        if m.start() > 0 and header0[m.start() - 1:m.start()] in b"0123456789abcdef" and k % 7:
            continue  # most digit runs inside hex checksums: a seventh of them is enough
        for e in edits:  # the header's size changes: only with the manifest matched is it read further
            new = e(int(m.group())).encode()
            shard = reframe(header0[:m.start()] + new + header0[m.end():])
            mutations.append(("shard number %d:%s -> %s" % (m.start(), m.group().decode(), new.decode()),
                              shard, match_manifest(shard)))
    for pos in range(0, len(manifest0), max(1, len(manifest0) // 150)):
        flipped = manifest0[:pos] + bytes([manifest0[pos] ^ (1 << (pos % 8))]) + manifest0[pos + 1:]
        mutations.append(("manifest bit %d" % pos, shard0, fix_checksum(flipped)))
        if pos % 5 == 0:
            mutations.append(("manifest bit %d, stale checksum" % pos, shard0, flipped))
    for n in range(0, len(manifest0), max(1, len(manifest0) // 25)):
        mutations.append(("manifest truncated to %d" % n, shard0, fix_checksum(manifest0[:n])))
    for m in re.finditer(rb"(?<=: )-?[0-9]+|(?<=, )[0-9]+|(?<=\[)[0-9]+", manifest0):
        for e in edits[:7]:
            new = e(int(m.group())).encode()
            mutations.append(("manifest number %d:%s -> %s" % (m.start(), m.group().decode(), new.decode()),
                              shard0, fix_checksum(manifest0[:m.start()] + new + manifest0[m.end():])))
    counts = compare("mutations of the fixture step", "--step", [step_case(*m) for m in mutations],
                     lambda d: load_verified(os.path.dirname(d)))
    assert len(mutations) >= 500 and counts.get("ok") and counts.get("reject"), counts
finally:
    shutil.rmtree(tmp)

if failures:
    print("\n".join(failures[:60]))
    sys.exit("checkpoint_reader mutations: %d failures" % len(failures))
print("checkpoint_reader mutations: all checks passed")
