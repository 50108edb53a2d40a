#!/usr/bin/env python3
"""tandemrun --metrics-port (issue 19): a running 2-worker job (the fault-tolerant example: DDP,
checkpoints, tandem's allocator installed) is scraped over HTTP with prometheus_client's
parser; every promised family is there with sane values; the endpoint is on loopback only.
    test_metrics_endpoint.py TANDEMRUN TRAIN_FAULT_TOLERANT CONFIG"""
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

tandemrun, worker, config = sys.argv[1:4]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fail(msg, proc=None):
    if proc is not None:
        proc.kill()
        out, err = proc.communicate()
        msg += "\n--- stdout\n" + out + "\n--- stderr\n" + err
    sys.exit("test_metrics_endpoint: " + msg)


port = free_port()
with tempfile.TemporaryDirectory() as ckpt:
    proc = subprocess.Popen(
        [tandemrun, "--standalone", "--nproc-per-node", "2", "--metrics-port", str(port), worker,
         "--config", config, "--set", "train.steps=100000", "--set", "checkpoint.every_n_steps=5",
         "--set", "checkpoint.directory=" + ckpt, "--set", "allocator.install=true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    families, text = {}, ""
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.5)
        if proc.poll() is not None:
            fail("tandemrun exited early", proc)
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
                if not r.headers["Content-Type"].startswith("text/plain; version=0.0.4"):
                    fail("content type " + r.headers["Content-Type"], proc)
                text = r.read().decode()
        except OSError:
            continue
        families = {f.name: f for f in text_string_to_metric_families(text)}
        steps = [s.value for s in families["tandem_steps"].samples] if "tandem_steps" in families else []
        ages = families.get("tandem_checkpoint_age_seconds")
        if len(steps) == 2 and min(steps) >= 12 and ages is not None and len(ages.samples) == 2:
            break
    else:
        fail("no complete scrape within 60 s; last:\n" + text, proc)

    def values(name, **labels):
        return [s.value for s in families[name].samples
                if s.name.startswith(name) and all(s.labels.get(k) == v for k, v in labels.items())]

    # prometheus_client drops the _total suffix from counter family names.
    checks = {
        "tandem_steps": lambda v: all(x >= 12 for x in v),
        "tandem_samples": lambda v: all(x >= 12 * 8 for x in v),
        "tandem_samples_per_second": lambda v: all(x > 0 for x in v),
        "tandem_loss": lambda v: all(0 < x < 10 for x in v),
        "tandem_step_seconds": lambda v: all(0 < x < 10 for x in v),
        "tandem_comm_seconds": lambda v: all(x > 0 for x in v),
        "tandem_exposed_comm_seconds": lambda v: all(x >= 0 for x in v),
        "tandem_wire_bytes": lambda v: all(x > 0 for x in v),
        "tandem_allocator_bytes": lambda v: len(v) == 6 and all(x > 0 for x in v),
        "tandem_checkpoint_age_seconds": lambda v: all(0 <= x < 30 for x in v),
        "tandem_node_samples_per_second": lambda v: len(v) == 1 and v[0] > 0,
        "tandem_restarts": lambda v: v == [0],
    }
    for name, ok in checks.items():
        if name not in families:
            fail("no family %s in:\n%s" % (name, text), proc)
        v = values(name)
        if not v or not ok(v):
            fail("%s = %s in:\n%s" % (name, v, text), proc)
    if values("tandem_wire_bytes", codec="average") == []:
        fail("no tandem_wire_bytes_total{codec=\"average\"}:\n" + text, proc)
    if sorted(s.labels["rank"] for s in families["tandem_loss"].samples) != ["0", "1"]:
        fail("not one loss per rank:\n" + text, proc)
    # Loopback only by default.
    addrs = [a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    for a in addrs:
        if a.startswith("127."):
            continue
        try:
            socket.create_connection((a, port), timeout=2).close()
            fail("the endpoint answers on %s; it must bind loopback only" % a, proc)
        except OSError:
            pass
    proc.terminate()
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
print("test_metrics_endpoint: ok (%d families)" % len(families))
