"""One process, two Gloos: libtorch's (torch.distributed, backend "gloo") and tandem's private one
(libtandem_gloo.so, loaded through the helper library with ctypes), each used in turn by 2 ranks
on loopback, and every result checked exactly. Then the dynamic linker's own record
(LD_DEBUG=bindings) of rank 0 shows that no Gloo symbol was bound across the copies: every
reference to a Gloo symbol from libtandem_gloo.so or libgloo.so binds inside those two, and every
one from torch's libraries (libtorch_cpu.so, libtorch_cuda.so, ...) binds inside torch's.
    test_gloo_side_by_side.py HELPER_LIBRARY
"""
import ctypes
import os
import re
import socket
import subprocess
import sys
import tempfile


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(helper):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://")

    def torch_allreduce(step):
        t = torch.arange(1000, dtype=torch.float32) * (rank + 1) + step
        dist.all_reduce(t)
        expect = torch.arange(1000, dtype=torch.float32) * (world * (world + 1) // 2) + step * world
        assert torch.equal(t, expect), "torch.distributed all_reduce gave a wrong sum"

    torch_allreduce(1)                      # libtorch's Gloo
    lib = ctypes.CDLL(helper)               # loads libtandem.so, which loads libtandem_gloo.so
    err = ctypes.create_string_buffer(4096)
    if lib.tandem_side_by_side(rank, world, os.environ["MASTER_ADDR"].encode(),
                               int(os.environ["MASTER_PORT"]), err, len(err)) != 0:
        sys.exit("rank %d: tandem's Gloo: %s" % (rank, err.value.decode()))
    torch_allreduce(2)                      # libtorch's Gloo again, after tandem's ran
    dist.barrier()
    dist.destroy_process_group()
    print("rank %d: ok" % rank)


GLOO = re.compile(r"4gloo")  # every symbol of namespace gloo has it in its mangled name
BINDING = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `([^']+)'")


def check_bindings(log_files):
    """Every Gloo symbol binds within its own copy; returns the bindings seen per (from, to)."""
    tandem_side = ("libtandem_gloo.so", "libgloo.so")
    seen, crossed = {}, []
    for path in log_files:
        with open(path, errors="replace") as f:
            for line in f:
                m = BINDING.search(line)
                if not m or not GLOO.search(m.group(3)):
                    continue
                src, dst, sym = (os.path.basename(m.group(1)), os.path.basename(m.group(2)),
                                 m.group(3))
                key = (src, dst)
                seen[key] = seen.get(key, 0) + 1
                src_tandem = any(src.startswith(t) for t in tandem_side)
                dst_tandem = any(dst.startswith(t) for t in tandem_side)
                if src_tandem != dst_tandem:
                    crossed.append("%s -> %s: %s" % (src, dst, sym))
    return seen, crossed


def main():
    helper = os.path.abspath(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "--rank":
        return rank_main(helper)
    world = 2
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            if rank == 0:
                env.update(LD_DEBUG="bindings", LD_DEBUG_OUTPUT=os.path.join(tmp, "ld"))
            procs.append(subprocess.Popen([sys.executable, __file__, helper, "--rank"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        failed = False
        for rank, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                out += "\n(timed out)"
            print("--- rank %d (exit %d)\n%s" % (rank, p.returncode, out.strip()))
            failed |= p.returncode != 0
        if failed:
            sys.exit("test_gloo_side_by_side: a rank failed")
        logs = [os.path.join(tmp, f) for f in os.listdir(tmp) if f.startswith("ld")]
        seen, crossed = check_bindings(logs)
    for (src, dst), count in sorted(seen.items()):
        print("Gloo symbols bound from %s to %s: %d" % (src, dst, count))
    if crossed:
        sys.exit("test_gloo_side_by_side: Gloo symbols bound across the two copies:\n  " +
                 "\n  ".join(crossed[:20]))
    for need in (("libtandem_gloo.so", "libgloo.so.0"), ("libtorch_cpu.so", "libtorch_cpu.so")):
        if need not in seen:
            sys.exit("test_gloo_side_by_side: no Gloo symbol bound from %s to %s: the log does "
                     "not show both copies in use" % need)
    print("test_gloo_side_by_side: ok")


if __name__ == "__main__":
    main()
