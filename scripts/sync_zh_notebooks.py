"""Bring the Chinese notebooks in `zh/` up to date with the English ones.

    uv run python scripts/sync_zh_notebooks.py            # update zh/*.ipynb
    uv run python scripts/sync_zh_notebooks.py --check    # exit 1 if stale

Every folder in `FOLDERS` (the chapter's notebooks, the bonus notebooks)
has its Chinese twins in its own `zh/`. Each zh notebook is rebuilt in the
English notebook's cell order:

* code cells come from the English notebook, source and outputs verbatim;
  only where the zh cell (same cell id) differs from the English one in
  comments alone is its translated source kept;
* markdown cells keep their Chinese text (matched by cell id); an English
  markdown cell without a Chinese one is copied in English and listed, so it
  can be translated; Chinese-only markdown cells stay after the cell they
  followed.

A missing zh notebook is created as a copy of the English one (all markdown
still to translate). Run it after `scripts/refresh_notebooks.py`.
"""

from __future__ import annotations

import argparse
import copy
import io
import sys
import tokenize
from pathlib import Path

import nbformat

from utils.fileio import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
# The English notebook folders; each keeps its Chinese notebooks in zh/.
FOLDERS = (
    ROOT / "ch02" / "01_main-chapter-code",
    ROOT / "ch02" / "04_batched-inference",
)
EN_DIR = FOLDERS[0]
ZH_DIR = EN_DIR / "zh"
NBVAL_PREFIX = "# NBVAL_"


def strip_comments(source: str) -> str:
    """Python source without its comments (nbval markers kept) and without
    the blank lines that leaves, for comparing code across languages.

    IPython lines (`!pip ...`, `%cd ...`) are compared as they are."""
    lines = source.splitlines()
    magic = {i for i, line in enumerate(lines, 1) if line.lstrip()[:1] in ("!", "%")}
    python = "\n".join(
        line[: len(line) - len(line.lstrip())] + "pass" if i in magic else line
        for i, line in enumerate(lines, 1)
    )
    cut: dict[int, int] = {}  # line number -> column where a comment starts
    try:
        for tok in tokenize.generate_tokens(io.StringIO(python).readline):
            if tok.type == tokenize.COMMENT and not tok.string.startswith(NBVAL_PREFIX):
                cut[tok.start[0]] = tok.start[1]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        cut = {  # not Python after all: whole-line comments only
            i: len(line) - len(line.lstrip())
            for i, line in enumerate(lines, 1)
            if line.lstrip().startswith("#")
            and not line.lstrip().startswith(NBVAL_PREFIX)
        }
    kept = []
    for number, line in enumerate(lines, 1):
        line = line[: cut[number]] if number in cut else line
        if line.strip():
            kept.append(line.rstrip())
    return "\n".join(kept)


def english_notebooks(en_dir: Path = EN_DIR) -> list[Path]:
    """The English section notebooks, sorted."""
    return sorted(p for p in en_dir.glob("*.ipynb") if p.is_file())


def _ids(nb: nbformat.NotebookNode, path: Path) -> list[str]:
    ids = [cell.get("id") for cell in nb.cells]
    if None in ids or len(set(ids)) != len(ids):
        raise SystemExit(
            f"{path}: every cell needs a unique id (nbformat 4.5); open and save "
            f"it in JupyterLab, or run scripts/refresh_notebooks.py on it."
        )
    return ids


def sync_notebook(
    en: nbformat.NotebookNode, zh: nbformat.NotebookNode | None, name: str
) -> tuple[nbformat.NotebookNode, list[str]]:
    """The updated zh notebook, and the ids of markdown cells still in English."""
    en_ids = _ids(en, Path(name))
    out = copy.deepcopy(en)
    if zh is None:
        return out, [c.id for c in en.cells if c.cell_type == "markdown"]
    zh_by_id = {c.id: c for c in zh.cells if "id" in c}
    cells, untranslated = [], []
    for cell in en.cells:
        mine = zh_by_id.get(cell.id)
        if cell.cell_type == "markdown":
            if mine is not None and mine.cell_type == "markdown":
                cells.append(copy.deepcopy(mine))
            else:
                cells.append(copy.deepcopy(cell))
                untranslated.append(cell.id)
        else:
            new = copy.deepcopy(cell)
            if (
                mine is not None
                and mine.cell_type == cell.cell_type == "code"
                and strip_comments(mine.source) == strip_comments(cell.source)
            ):
                new.source = mine.source  # translated comments
            cells.append(new)
    # Chinese-only markdown cells: after the cell they followed in zh.
    previous = None
    for cell in zh.cells:
        if cell.get("id") not in en_ids and cell.cell_type == "markdown":
            at = next((i + 1 for i, c in enumerate(cells) if c.id == previous), 0)
            cells.insert(at, copy.deepcopy(cell))
        previous = cell.get("id")
    out.cells = cells
    untranslated += [
        c.id
        for c in cells
        if c.cell_type == "markdown"
        and c.id in en_ids
        and c.id not in untranslated
        and c.source == en.cells[en_ids.index(c.id)].source
        and any(ch.isalpha() for ch in c.source)
    ]
    return out, untranslated


def render(nb: nbformat.NotebookNode) -> str:
    """The notebook as committed (the same writer as refresh_notebooks)."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def sync(en_dir: Path = EN_DIR, zh_dir: Path = ZH_DIR, check: bool = False) -> int:
    """Sync every notebook; return the number of zh files changed (or stale)."""
    changed = 0
    for en_path in english_notebooks(en_dir):
        zh_path = zh_dir / en_path.name
        en = nbformat.read(en_path, as_version=4)
        zh = nbformat.read(zh_path, as_version=4) if zh_path.is_file() else None
        new, untranslated = sync_notebook(en, zh, en_path.name)
        text = render(new)
        old = zh_path.read_text(encoding="utf-8") if zh is not None else None
        rel = zh_path.relative_to(zh_dir.parent.parent)
        if text != old:
            changed += 1
            print(f"{rel}: {'would change' if check else 'updated'}")
            if not check:
                atomic_write_text(zh_path, text)
        if untranslated:
            print(f"{rel}: markdown still in English: {', '.join(untranslated)}")
    return changed


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if stale"
    )
    args = parser.parse_args(argv)
    changed = sum(sync(folder, folder / "zh", check=args.check) for folder in FOLDERS)
    if args.check and changed:
        print("Run: uv run python scripts/sync_zh_notebooks.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
