"""Every command the README lists runs as written, after the two set-up commands.

    test_readme_commands.py REPO BUILD_DIR

Reads the README's code blocks: each line that starts with `build/bin/` is a command. First
checks that `scripts/main` (the README's first set-up command) builds every program those
commands name, then runs each command verbatim, with a time limit, from a scratch directory laid
out like the repository root (`build` -> BUILD_DIR, `examples`, `README.md`), so what a command
writes there (checkpoints, runs) is thrown away afterwards. Each must exit 0.
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

repo, build = (os.path.abspath(p) for p in sys.argv[1:3])


def readme_commands():
    text = open(os.path.join(repo, "README.md")).read()
    commands = []
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
        commands += [line.strip() for line in block.splitlines() if line.strip().startswith("build/bin/")]
    return commands


def main_targets():
    text = open(os.path.join(repo, "scripts", "main")).read()
    m = re.search(r"--target((?:\s+\\?\s*[A-Za-z0-9_-]+)+)", text)
    return set(m.group(1).replace("\\", " ").split()) if m else set()


commands = readme_commands()
if len(commands) < 5:
    sys.exit("test_readme_commands: found only %d commands in README.md" % len(commands))
programs = sorted({p[len("build/bin/"):] for c in commands for p in shlex.split(c)
                   if p.startswith("build/bin/")})
missing = [p for p in programs if p not in main_targets()]
if missing:
    sys.exit("test_readme_commands: the README runs %s, which scripts/main does not build "
             "(its --target list)" % ", ".join(missing))

failed = []
with tempfile.TemporaryDirectory(prefix="tandem-readme-") as root:
    os.symlink(build, os.path.join(root, "build"))
    for name in ("examples", "README.md"):
        os.symlink(os.path.join(repo, name), os.path.join(root, name))
    for command in commands:
        start = time.monotonic()
        try:
            p = subprocess.run(shlex.split(command), cwd=root, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=420)
            status, out = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            status, out = "timeout", (e.stdout or b"").decode(errors="replace")
        print("%-8s %6.1f s  %s" % ("ok" if status == 0 else "FAILED", time.monotonic() - start, command),
              flush=True)
        if status != 0:
            failed.append(command)
            print(out[-3000:])
if failed:
    sys.exit("test_readme_commands: %d of %d README commands failed" % (len(failed), len(commands)))
print("test_readme_commands: all %d README commands ran" % len(commands))
