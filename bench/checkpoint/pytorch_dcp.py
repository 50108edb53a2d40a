#!/usr/bin/env python3
"""PyTorch peer of bench_checkpoint: the same state saved and loaded with torch.distributed.checkpoint.

Run on the venv's interpreter (scripts/env.sh: the torch wheel tandem builds against); the C++
driver bench_checkpoint starts it (--python, --dcp-script) so that its saves run in the same rounds,
interleaved with tandem's, each after the driver's global sync(2).

  python3 bench/checkpoint/pytorch_dcp.py serve --layers N [--threads T]
      Builds `layers` x Linear(2048, 2048) and one AdamW step (lr 1e-3, synthetic randn gradients,
      as the C++ does), prints "ready CHECKSUM INFO_JSON", then answers one line per command read
      from stdin ("ok ..." or "error MESSAGE"):
        save DIR          dcp.save into DIR: "ok SECONDS STATE_DICT_SECONDS BYTES"
        async DIR         dcp.async_save, default staging: "ok BLOCKED TOTAL"
        async_thread DIR  dcp.async_save, DefaultStager with use_async_staging: "ok BLOCKED STAGED TOTAL"
        load DIR          dcp.load into a second model + AdamW kept by this process:
                          "ok SECONDS CHECKSUM STATE_DICT_SECONDS"
        quit
  python3 bench/checkpoint/pytorch_dcp.py load --dir DIR --layers N [--threads T]
      A fresh model + AdamW in this new process, restored from DIR: prints
      "SECONDS CHECKSUM STATE_DICT_SECONDS".
  python3 bench/checkpoint/pytorch_dcp.py selftest [--layers 2] [--dir DIR]
      save, both async saves and a load at a small size; checks the loaded state equals the saved.

What is timed (wall clock, time.perf_counter):
  save: get_state_dict(model, optimizer) + dcp.save({"model", "optim"}, FileSystemWriter(DIR)):
    plan, write one file per rank (__0_0.distcp), fsync it (sync_files=True, the default), write
    .metadata.tmp, fsync it, rename it to .metadata. No fsync of the directory.
  async (the call as documented, dcp.async_save(state_dict, storage_writer=FileSystemWriter(DIR))):
    the writer is DCP's BlockingAsyncStager: async_save copies the whole state into new CPU memory
    before it returns (blocked), then a thread runs dcp.save on the copy (total: until its future's
    result()). cache_staged_state_dict=True (reuse the staging copy) pins it (cudaHostRegister) and
    fails without an NVIDIA driver, so it is not used.
  async_thread: async_stager=DefaultStager(StagingOptions(use_pinned_memory=False,
    use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=False)): the copy runs on
    a staging thread (staged: AsyncSaveResponse.staging_completion, after which the model may change
    again), the write on another (total: upload_completion). The nearest to tandem's async save.
    A new stager for every save (torch 2.11's DefaultStager fails on its second stage()).
  load: get_state_dict(fresh model, fresh AdamW) (which first creates the optimizer state with a
    zero-gradient, lr 0 step, as DCP requires; STATE_DICT_SECONDS) + dcp.load in place +
    set_state_dict. DCP verifies no checksums.
All saves pass no_dist=True: without an initialized process group DCP 2.x saves and loads in one
process anyway (it warns "torch.distributed is disabled, unavailable or uninitialized, assuming the
intent is to save in a single process").
CHECKSUM: exact sums of the bits of the first and last layers' weights and AdamW moments and the
optimizer's step counts, compared by the driver to see that every load restored the saved state.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


# no_dist=True says so already; the warning would only clutter the benchmark's output.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


class Stack(torch.nn.Module):
    """Linear(2048, 2048) x layers, named fc0..fcN-1 as the C++ Stack."""

    def __init__(self, layers):
        super().__init__()
        for i in range(layers):
            self.add_module("fc%d" % i, torch.nn.Linear(2048, 2048))


def make_state(layers, step):
    model = Stack(layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if step:
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
        for p in model.parameters():
            p.grad = None
    return model, opt


def bits_sum(t):
    t = t.detach().contiguous()
    if t.dtype == torch.float32:
        t = t.view(torch.int32)
    return int(t.to(torch.int64).sum())


def checksum(model, opt):
    params = list(model.parameters())
    total = 0
    for p in params[:2] + params[-2:]:  # first and last layers' weight and bias
        s = opt.state[p]
        total += bits_sum(p) + bits_sum(s["exp_avg"]) + bits_sum(s["exp_avg_sq"])
    for p in params:
        total += int(opt.state[p]["step"])
    return str(total)


def state_bytes(model, opt):
    n = 0
    for p in model.parameters():
        n += p.numel() * p.element_size()
        for v in opt.state[p].values():
            if torch.is_tensor(v):
                n += v.numel() * v.element_size()
    return n


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def state_dict_of(model, opt):
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def save(model, opt, path):
    t0 = time.perf_counter()
    sd = state_dict_of(model, opt)
    t1 = time.perf_counter()
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0


def async_save(model, opt, path):
    t0 = time.perf_counter()
    fut = dcp.async_save(state_dict_of(model, opt), storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    blocked = time.perf_counter() - t0
    fut.result()
    return blocked, time.perf_counter() - t0


def staging_thread_stager():
    """A DefaultStager with a staging thread. torch 2.11's serves one save only: its _stage() ends
    with StateDictStager.close(), which clears the deepcopy dispatch table, so a second stage()
    fails with KeyError: <class 'type'>. Made (untimed) before each save, closed after it."""
    return DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                        use_async_staging=True, use_non_blocking_copy=False))


def async_save_thread(model, opt, path, stager):
    t0 = time.perf_counter()
    resp = dcp.async_save(state_dict_of(model, opt), storage_writer=dcp.FileSystemWriter(path),
                          async_stager=stager, no_dist=True)
    blocked = time.perf_counter() - t0
    resp.staging_completion.result()
    staged = time.perf_counter() - t0
    resp.upload_completion.result()
    return blocked, staged, time.perf_counter() - t0


def load(model, opt, path):
    """Seconds for the whole restore, and for its get_state_dict (optimizer state creation) part."""
    t0 = time.perf_counter()
    sd = state_dict_of(model, opt)
    t1 = time.perf_counter()
    dcp.load(sd, checkpoint_id=path, no_dist=True)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return time.perf_counter() - t0, t1 - t0


def probe_cached_staging():
    """Whether FileSystemWriter(cache_staged_state_dict=True) can stage on this machine."""
    from torch.distributed._state_dict_utils import _create_cpu_state_dict
    try:
        _create_cpu_state_dict({"x": torch.zeros(16)}, pin_memory=True)
        return "works"
    except Exception as e:  # noqa: BLE001 - recorded as found
        return "fails: %s" % str(e).splitlines()[0][:160]


def serve(args):
    torch.manual_seed(0)
    model, opt = make_state(args.layers, step=True)
    info = {
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "state_bytes": state_bytes(model, opt),
        "tensors": sum(1 + sum(torch.is_tensor(v) for v in opt.state[p].values()) for p in model.parameters()),
        "process_group_initialized": torch.distributed.is_available() and torch.distributed.is_initialized(),
        "file_system_writer_sync_files_default": dcp.FileSystemWriter(tempfile.gettempdir()).sync_files,
        "cache_staged_state_dict": probe_cached_staging(),
    }
    print("ready %s %s" % (checksum(model, opt), json.dumps(info)), flush=True)
    target = None
    for line in sys.stdin:
        words = line.split(None, 1)
        if not words:
            continue
        cmd, arg = words[0], (words[1].strip() if len(words) > 1 else "")
        if cmd == "quit":
            break
        try:
            if cmd == "save":
                s, sd_s = save(model, opt, arg)
                out = "%.6f %.6f %d" % (s, sd_s, dir_bytes(arg))
            elif cmd == "async":
                out = "%.6f %.6f" % async_save(model, opt, arg)
            elif cmd == "async_thread":
                stager = staging_thread_stager()  # one per save: see staging_thread_stager()
                try:
                    out = "%.6f %.6f %.6f" % async_save_thread(model, opt, arg, stager)
                finally:
                    stager.close()
            elif cmd == "load":
                if target is None:
                    target = make_state(args.layers, step=False)
                s, sd_s = load(*target, arg)
                out = "%.6f %s %.6f" % (s, checksum(*target), sd_s)
            else:
                raise ValueError("unknown command %r" % cmd)
            print("ok " + out, flush=True)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            print("error %s: %s" % (type(e).__name__, str(e).replace("\n", " ")[:500]), flush=True)


def load_main(args):
    model, opt = make_state(args.layers, step=False)
    s, sd_s = load(model, opt, args.dir)
    print("%.6f %s %.6f" % (s, checksum(model, opt), sd_s), flush=True)


def selftest(args):
    torch.manual_seed(0)
    model, opt = make_state(args.layers, step=True)
    want = checksum(model, opt)
    root = args.dir or tempfile.mkdtemp(prefix="dcp-selftest-")
    try:
        s, sd_s = save(model, opt, os.path.join(root, "sync"))
        print("save %.3f s (state dict %.4f s), %d bytes" % (s, sd_s, dir_bytes(os.path.join(root, "sync"))))
        print("async blocked %.4f s, total %.3f s" % async_save(model, opt, os.path.join(root, "async")))
        stager = staging_thread_stager()
        print("async_thread blocked %.4f s, staged %.3f s, total %.3f s"
              % async_save_thread(model, opt, os.path.join(root, "async_thread"), stager))
        stager.close()
        print("cache_staged_state_dict: %s" % probe_cached_staging())
        for sub in ("sync", "async", "async_thread"):
            m2, o2 = make_state(args.layers, step=False)
            s, sd_s = load(m2, o2, os.path.join(root, sub))
            got = checksum(m2, o2)
            for a, b in zip(model.parameters(), m2.parameters()):
                assert torch.equal(a, b), sub + ": parameter differs"
                for k in ("exp_avg", "exp_avg_sq", "step"):
                    assert torch.equal(opt.state[a][k], o2.state[b][k]), sub + ": " + k + " differs"
            assert got == want, "%s: checksum %s != %s" % (sub, got, want)
            print("load %s %.3f s (get_state_dict %.3f s): equal" % (sub, s, sd_s))
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print("selftest ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["serve", "load", "selftest"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--dir", default="")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    {"serve": serve, "load": load_main, "selftest": selftest}[args.mode](args)


if __name__ == "__main__":
    main()
