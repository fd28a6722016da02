"""Test-wide settings: every test runs offline with the Qwen3 stand-ins.

This file sits at the repository root so pytest loads it for every run,
including runs that collect only notebooks (`uv run pytest ch02/...ipynb`).
Stand-in files go to a temporary folder this run owns (`QWEN3_STANDIN_DIR`),
never to a `qwen3/` folder where a reader keeps real downloads; the CPU
kernels are built into another one (`QWEN3_KERNEL_CACHE`), and a test that
downloads for real (from loopback hosts) keeps its files in a third
(`QWEN3_MODEL_STORE`), not in ~/.cache.
Inductor's compiled code goes to one folder per `ATEN_CPU_CAPABILITY`.
`QWEN3_NO_WIDGETS` is set: `utils.widgets` prints plain results, in the
tests and in the notebook kernels nbval starts.
"""

import gc
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# tests.sigint_guard: the test that leaves SIGINT's handler changed fails;
# pytester runs that plugin's own test.
pytest_plugins = ("pytester", "tests.sigint_guard")

_OWN_DIRS: list[tuple[str, str]] = []  # (environment variable, folder)


def pytest_configure(config: pytest.Config) -> None:
    # Set before any notebook kernel starts, so nbval kernels inherit it too.
    os.environ.setdefault("QWEN3_STANDIN", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["QWEN3_NO_WIDGETS"] = "1"  # whatever the shell says: plain output
    for var, prefix in (
        ("QWEN3_STANDIN_DIR", "qwen3-standin-files-"),
        ("QWEN3_KERNEL_CACHE", "qwen3-kernels-"),
        ("QWEN3_MODEL_STORE", "qwen3-model-store-"),
    ):
        if not os.environ.get(var):
            folder = tempfile.mkdtemp(prefix=prefix)  # private: mode 700
            _OWN_DIRS.append((var, folder))
            os.environ[var] = folder
    _inductor_cache_per_capability()
    # The sanitize file in addopts is relative to the repository root; make it
    # work when pytest is started from a subfolder too.
    sanitize = getattr(config.option, "nbval_sanitize_with", None)
    if sanitize and not Path(sanitize).is_file():
        candidate = config.rootpath / sanitize
        if candidate.is_file():
            config.option.nbval_sanitize_with = str(candidate)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The Chinese notebooks in `zh/` share every code cell with the English
    ones, which nbval already executes (`tests/test_zh_notebooks.py` keeps the
    two in step), so they are not executed again (the suite's time budget)
    unless `QWEN3_ZH_NOTEBOOKS=1`. Here rather than in a conftest.py in `zh/`,
    which JupyterLab would list beside the notebooks."""
    from utils.settings import is_true

    if (
        collection_path.suffix == ".ipynb"
        and collection_path.parent.name == "zh"
        and not is_true(os.environ.get("QWEN3_ZH_NOTEBOOKS"))
    ):
        return True
    return None


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Notebook cells (nbval) count as slow: `-m "not slow"` skips them."""
    for item in items:
        if item.nodeid.split("::")[0].endswith(".ipynb"):
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection imported (torch, transformers, sympy: millions of
    objects) to the collector's permanent generation, so every later
    collection, Python's own and the benchmark's between modes, walks only
    what the tests make."""
    gc.collect()
    gc.freeze()


def _inductor_cache_per_capability() -> None:
    """Compiled code in one subfolder of inductor's cache per
    ATEN_CPU_CAPABILITY, as for readers (utils.compile), set before any
    notebook kernel starts so they inherit it."""
    from utils.compile import separate_inductor_cache

    separate_inductor_cache()


def pytest_unconfigure(config: pytest.Config) -> None:
    while _OWN_DIRS:
        var, folder = _OWN_DIRS.pop()
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get(var) == folder:
            del os.environ[var]
