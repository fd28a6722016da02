"""The Chinese notebooks share every code cell with the English ones, which
nbval already executes; `tests/test_zh_notebooks.py` keeps the two in step.
So by default pytest does not execute them again (the suite's time budget);
set `QWEN3_ZH_NOTEBOOKS=1` to run them under nbval as well."""

import os

from utils.settings import is_true

if not is_true(os.environ.get("QWEN3_ZH_NOTEBOOKS")):
    collect_ignore_glob = ["*.ipynb"]
