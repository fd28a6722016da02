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


# --- the fast decoder's tests (tests/fast/) --------------------------------


@pytest.fixture(scope="session")
def kernels():
    """The fast decoder's CPU kernels; skips where they cannot be built."""
    from utils.fast import get_kernels

    loaded = get_kernels()
    if loaded is None:
        pytest.skip("the AVX2 kernel cannot be built on this machine")
    return loaded


@pytest.fixture(scope="module")
def fast_tiny():
    """(the book's model, a FastQwen3 sharing its weights) on the tiny
    float32 config with context 512: one pair per test module."""
    from tests.tiny import book_model, tiny_config, tiny_state_dict
    from utils.fast import FastQwen3

    cfg = tiny_config(context_length=512)
    book = book_model(tiny_state_dict(0, cfg), cfg)
    return book, FastQwen3.from_book_model(book)


@pytest.fixture
def exact_calls(monkeypatch):
    """Rows of every exact-kernel call eager code makes during the test."""
    from utils.fast.kernels import Kernels

    calls: list[int] = []
    real = Kernels.matvec_multi

    def spy(self, x, weights, scales=None, *, exact=False):
        if exact:
            calls.append(sum(w.shape[0] for w in weights))
        return real(self, x, weights, scales, exact=exact)

    monkeypatch.setattr(Kernels, "matvec_multi", spy)
    return calls
