"""Package doors that import on first use.

A command's entry point (`utils.cli:generate_main`, `python -m
utils.benchmark`) imports its package before the command's body runs; a
door that imported its modules at once would import torch there (seconds),
where Ctrl-C gives a traceback instead of the command's one line. A door
made with `lazy_attributes` imports each name's module when the name is
first asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_attributes(
    package: str, homes: Mapping[str, tuple[str, ...]]
) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package`: each name of
    `homes[module]` from `package.module`, imported on this first ask."""

    def __getattr__(name: str) -> Any:
        for module, names in homes.items():
            if name in names:
                return getattr(import_module(f"{package}.{module}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
