"""Shared pytest set-up: compiled kernels go to one temporary folder per
test session, so the suite builds them once and never writes to the
reader's own kernel cache (unless QWEN3_KERNEL_CACHE points elsewhere)."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_kernel_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get("QWEN3_KERNEL_CACHE"):
            mp.setenv("QWEN3_KERNEL_CACHE", str(tmp_path_factory.mktemp("kernels")))
        yield
