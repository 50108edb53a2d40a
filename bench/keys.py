#!/usr/bin/env python3
"""Checks that a benchmark still writes the keys its committed JSON has: the key paths of
bench/results/NAME.json in the working tree (what the last run wrote) against the same file at a
commit (default HEAD), recursively, values and list lengths ignored (a list's elements share one
path, "[]"). Prints the paths the run lost (a reader of the committed JSON would miss them) and
those it added; exits 1 when it lost any.
  python3 bench/keys.py NAME... [--rev REV] [--ignore PREFIX...]
Keys that only a full run writes (or only a machine with some facility) show as lost after a
--quick run: --ignore names their paths."""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def paths(value, prefix=""):
    """Every key path below VALUE: "a.b", "a.list[].c"."""
    out = set()
    if isinstance(value, dict):
        for k, v in value.items():
            p = "%s.%s" % (prefix, k) if prefix else k
            out.add(p)
            out |= paths(v, p)
    elif isinstance(value, list):
        for v in value:
            out |= paths(v, prefix + "[]")
    return out


def committed(name, rev):
    text = subprocess.run(["git", "-C", harness.REPO, "show", "%s:bench/results/%s.json" % (rev, name)],
                          stdout=subprocess.PIPE, check=True, text=True).stdout
    return json.loads(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="+")
    p.add_argument("--rev", default="HEAD")
    p.add_argument("--ignore", nargs="*", default=[])
    args = p.parse_args()
    lost_any = False
    for name in args.names:
        new = paths(harness.read_json(os.path.join(harness.RESULTS, name + ".json")))
        old = paths(committed(name, args.rev))
        lost = sorted(k for k in old - new if not any(k.startswith(i) for i in args.ignore))
        # An added block is one line: its own path, not each key inside it.
        added = sorted(k for k in new - old if not any(k.startswith(a + ".") or k.startswith(a + "[]")
                                                    for a in new - old if a != k))
        lost_any |= bool(lost)
        print("%s: %d key paths committed, %d written; lost %d, added %d" % (
            name, len(old), len(new), len(lost), len(added)))
        for k in lost:
            print("  lost   %s" % k)
        for k in added:
            print("  added  %s" % k)
    return 1 if lost_any else 0


if __name__ == "__main__":
    sys.exit(main())
