"""A real Ctrl-C while a command is still importing torch: the command runs
in a fresh interpreter whose import of torch waits two seconds first,
catching (losing) any KeyboardInterrupt raised inside, as torch's C++ half
can; the test sends SIGINT once that import has begun."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

DRIVER = r"""
import importlib.abc, runpy, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)

class SlowTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch":  # the seconds torch's import takes
            sys.meta_path.remove(self)
            try:  # as its C++ half can: an interrupt inside is lost
                print("READY", file=sys.stderr, flush=True)
                time.sleep(2)
            except KeyboardInterrupt:
                pass
        return None

sys.meta_path.insert(0, SlowTorch())
module = sys.argv.pop(1)
sys.argv[0] = module
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def ctrl_c_while_torch_imports(module: str, *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -m module args` sent SIGINT
    while its import of torch runs."""
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, module, *args], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    first = proc.stderr.readline()
    if first.strip() == "READY":
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, first + err
