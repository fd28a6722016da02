"""Test-wide settings: every test runs offline with the Qwen3 stand-ins."""

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Set before any notebook kernel starts, so nbval kernels inherit it too.
    os.environ.setdefault("QWEN3_STANDIN", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
