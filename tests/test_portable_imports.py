"""Every `utils` module imports where a platform-only module is missing.

Windows has no `resource`, `fcntl`, `termios`, `pwd`...; Linux and macOS have
no `msvcrt` or `winreg`. A fresh interpreter makes every import of those
names fail when the importing code is a `utils` module (third-party packages
such as psutil choose their own platform code and are left alone), then
imports each module and calls the helpers that reach for one lazily.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLATFORM_ONLY = (
    # Unix only
    "resource",
    "fcntl",
    "termios",
    "tty",
    "pty",
    "readline",
    "pwd",
    "grp",
    "syslog",
    # Windows only
    "msvcrt",
    "winreg",
    "winsound",
    "_winapi",
    "_overlapped",
)

SCRIPT = r"""
import builtins, importlib, json, sys, traceback
blocked = set(json.loads(sys.argv[1]))
real_import = builtins.__import__

def guarded(name, globals=None, locals=None, fromlist=(), level=0):
    caller = (globals or {}).get("__name__") or ""
    if level == 0 and name.split(".")[0] in blocked and (
        caller == "utils" or caller.startswith("utils.")
    ):
        raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
    return real_import(name, globals, locals, fromlist, level)

builtins.__import__ = guarded
for name in blocked:  # also drop any already imported, so no cached copy helps
    sys.modules.pop(name, None)

def check(label, fn):
    try:
        value = fn()
        results[label] = None if value is None else repr(value)
    except BaseException:
        results[label] = traceback.format_exc(limit=-3)

results = {}
for module in json.loads(sys.argv[2]):
    check(module, lambda: importlib.import_module(module) and None)

def memory():
    from utils.device import process_memory_bytes
    current, peak = process_memory_bytes()
    return None if peak >= current > 0 else (current, peak)

check("process_memory_bytes", memory)
print(json.dumps(results))
"""


def utils_modules(root: Path = ROOT) -> list[str]:
    """`utils.<name>` (and `utils.<package>[.<name>]`) for every module file
    in the package but `utils/__init__.py` and the `__main__.py` files (they
    run a command)."""
    names = []
    for path in (root / "utils").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts.pop()
        if len(parts) > 1:
            names.append(".".join(parts))
    return sorted(names)


def import_blocked(root: Path = ROOT) -> dict[str, object]:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            SCRIPT,
            json.dumps(PLATFORM_ONLY),
            json.dumps(utils_modules(root)),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_package_lists_its_modules():
    modules = utils_modules()
    assert {"utils.generation", "utils.cli.commands", "utils.streaming"} <= set(modules)
    mains = len(list((ROOT / "utils").rglob("__main__.py")))
    assert len(modules) == len(list((ROOT / "utils").rglob("*.py"))) - 1 - mains


@pytest.mark.slow
def test_every_utils_module_imports_without_platform_only_modules():
    results = import_blocked()
    assert set(results) == {*utils_modules(), "process_memory_bytes"}
    failed = {name: err for name, err in results.items() if err is not None}
    assert not failed, "\n".join(f"{n}:\n{e}" for n, e in failed.items())
