"""Test-wide settings: every test runs offline with the Qwen3 stand-ins.

This file sits at the repository root so pytest loads it for every run,
including runs that collect only notebooks (`uv run pytest ch02/...ipynb`).
"""

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Set before any notebook kernel starts, so nbval kernels inherit it too.
    os.environ.setdefault("QWEN3_STANDIN", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # The sanitize file in addopts is relative to the repository root; make it
    # work when pytest is started from a subfolder too.
    sanitize = getattr(config.option, "nbval_sanitize_with", None)
    if sanitize and not Path(sanitize).is_file():
        candidate = config.rootpath / sanitize
        if candidate.is_file():
            config.option.nbval_sanitize_with = str(candidate)
