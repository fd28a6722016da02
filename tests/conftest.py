"""The fixtures more than one test module uses. Stand-ins, kernels and
compile caches go to folders this run owns (the root conftest.py sets
QWEN3_STANDIN_DIR, QWEN3_KERNEL_CACHE and TORCHINDUCTOR_CACHE_DIR).

Environment variables only the tests read (the README lists the others):
    QWEN3_REAL_DOWNLOAD=1   run the tests that download the real model
                            (tests/test_real_download.py, test_download.py)
    QWEN3_REAL_DIR          where those keep the real files between runs
    QWEN3_BROWSER           the Chromium binary of tests/test_browser_widgets.py
    QWEN3_ZH_NOTEBOOKS=1    also run the Chinese notebooks under nbval
"""

import pytest


@pytest.fixture
def tiny_cfg():
    """The tiny float32 Qwen3 config of `tests.tiny` (GQA and qk-norm on)."""
    from tests.tiny import tiny_config

    return tiny_config()


@pytest.fixture(scope="session")
def tok(tmp_path_factory):
    """The real Qwen3 base tokenizer (its offline rebuild), once a session."""
    from tests._view_fixtures import load_tokenizer, standin_files

    path, _ = standin_files(tmp_path_factory, "base", tokenizer_only=True)
    return load_tokenizer(path)


@pytest.fixture(scope="module")
def model():
    """A tiny random Qwen3 with the real vocabulary, one per test module
    (tests may add hooks to it)."""
    from tests._view_fixtures import tiny_model

    return tiny_model()


@pytest.fixture(scope="session")
def standin_06b(tmp_path_factory):
    """(tokenizer path, weights path) of the 0.6B base stand-in, built once."""
    from tests._view_fixtures import standin_files

    return standin_files(tmp_path_factory, "base", tokenizer_only=False)


# --- the fast decoder's tests (tests/fast/) --------------------------------


@pytest.fixture(scope="session")
def kernels():
    """The fast decoder's CPU kernels; skips where they cannot be built."""
    from utils.fast import get_kernels

    loaded = get_kernels()
    if loaded is None:
        pytest.skip("the AVX2 kernel cannot be built on this machine")
    return loaded


@pytest.fixture(scope="session")
def test_kernels():
    """The library's test build (utils.fast.build: the same kernels plus
    tests/fast/csrc's entry points); skips where it cannot be built."""
    from utils.fast import get_kernels

    loaded = get_kernels(testing=True)
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
