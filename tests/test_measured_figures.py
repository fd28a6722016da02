"""A figure measured once and quoted on another page agrees with its source.

Each page keeps its measured figures in one dated table; where prose (on
that page or another) repeats one, it must say the same number. Sources:
the bonus README's speed table and agreement table, and notebook 06's
filled Table 2.1 row (en and zh); quoted in the notebooks, the bonus README
and the commands page's memory table. A quote below that no longer matches its
source, or no longer appears at all, fails here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
BONUS = ROOT / "ch02" / "03_fast-decoding" / "README.md"
COMMANDS = ROOT / "docs" / "commands.md"
COMMANDS_ZH = ROOT / "docs" / "commands.zh.md"
NB06 = ROOT / "ch02" / "01_main-chapter-code" / "06_compile.ipynb"
NB06_ZH = NB06.parent / "zh" / NB06.name


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every markdown table in `text`: rows of cells (header first, the
    |---| line dropped)."""
    tables, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def cell(text: str, header: str, row: str, column: str) -> str:
    """The cell of the table whose first header cell starts with `header`,
    in the row whose first cell contains `row`, under the column whose header
    starts with `column`."""
    for table in markdown_tables(text):
        if table[0][0].startswith(header):
            col = next(i for i, h in enumerate(table[0]) if h.startswith(column))
            found = [r[col] for r in table[1:] if row in r[0]]
            assert len(found) == 1, (header, row, found)
            return found[0]
    raise AssertionError(f"no table headed {header!r}")


def notebook_text(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def bonus_speed(mode: str, text: str | None = None) -> str:
    text = BONUS.read_text(encoding="utf-8") if text is None else text
    return cell(text, "Mode", f"`{mode}`", "tok/s")


def bonus_memory(mode: str) -> str:
    text = BONUS.read_text(encoding="utf-8")
    return cell(text, "Mode", f"`{mode}`", "Peak memory")


def bonus_agreement(candidate: str) -> str:
    text = BONUS.read_text(encoding="utf-8")
    return cell(text, "Candidate", f"`{candidate}`", "Identical").removesuffix(" %")


def bonus_prefill(mode: str) -> str:
    text = BONUS.read_text(encoding="utf-8")
    return cell(text, "Prefill, 512", f"`{mode}`", "tok/s vs").removesuffix("x")


def nb06_row(path: Path, column: str) -> str:
    """A cell of notebook 06's filled row; `column` is the English mode name
    (the Chinese notebook's columns are its Chinese names)."""
    from utils.language import in_language

    zh = path != NB06
    return cell(notebook_text(path), "硬件" if zh else "Hardware", "EPYC",
                in_language(column, lang="zh" if zh else "en"))  # fmt: skip


# (page, pattern with one group per figure, where each figure comes from)
BOOK_KV_CACHE = [lambda: bonus_speed("kv_cache")]
QUOTES: list[tuple[Path, str, list[Callable[[], str]]]] = [
    (NB06, r"has the book's KV cache at (\S+) tok/s", BOOK_KV_CACHE),
    (NB06_ZH, r"测得书中的 KV 缓存为 (\S+) tok/s", BOOK_KV_CACHE),
    (BONUS, r"here (\S+) against (\S+) tok/s",
     [lambda: bonus_speed("fast_native"), lambda: bonus_speed("fast_compiled")]),
    (COMMANDS, r"\| (\S+) \(int8: the `fast_native_int8` row",
     [lambda: bonus_memory("fast_native_int8")]),
    (COMMANDS_ZH, r"\| (\S+)（int8：\[附加内容表格（英文）\]",
     [lambda: bonus_memory("fast_native_int8")]),
]  # fmt: skip


def page_text(path: Path) -> str:
    if path.suffix == ".ipynb":
        return notebook_text(path)
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("page", "pattern", "sources"), QUOTES, ids=[q[1][:32] for q in QUOTES]
)
def test_a_quoted_figure_equals_its_source(page, pattern, sources):
    text = " ".join(page_text(page).split())  # prose wraps anywhere
    quotes = re.findall(pattern, text)
    assert len(quotes) == 1, f"{page.name}: {pattern!r} found {quotes}"
    said = quotes[0] if isinstance(quotes[0], tuple) else (quotes[0],)
    assert list(said) == [source() for source in sources], page.name


def test_both_notebooks_fill_the_same_row():
    for column in ("Regular", "KV cache"):
        assert nb06_row(NB06, column) == nb06_row(NB06_ZH, column)


def test_a_changed_source_is_caught():
    """The check reads the table, not a copy of its numbers."""
    text = BONUS.read_text(encoding="utf-8")
    row = "| `kv_cache` (the book's) | "
    now = bonus_speed("kv_cache")
    changed = text.replace(f"{row}{now} |", f"{row}{now}9 |")
    assert bonus_speed("kv_cache", changed) == f"{now}9"
