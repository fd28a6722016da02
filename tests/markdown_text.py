"""The repository's Markdown as a reader sees it rendered.

One CommonMark parser (`markdown-it-py`, the spec JupyterLab and GitHub
follow, with GitHub's tables) for the documentation tests: which files and
notebook cells hold Markdown, which of them are Chinese, where a soft line
break sits next to a full-width character (it renders as a stray space),
what each heading's anchor is (as GitHub makes it) and where each link
points. Also the code a page shows (its commands) and the labels notebook
code passes to `chart_text`.
"""

from __future__ import annotations

import ast
import os
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import nbformat
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_ZH = ROOT / "README.zh.md"  # the same first screen, in Chinese
# The Chinese notebooks: each English notebook folder's zh/ (the folders
# are scripts/sync_zh_notebooks.py's FOLDERS; a test ties the two).
ZH_NOTEBOOK_DIRS = tuple(sorted(p for p in (ROOT / "ch02").glob("*/zh") if p.is_dir()))
# Folders that are not the repository's own documents.
SKIPPED_DIRS = {".git", ".venv", "node_modules", "qwen3"}
# Besides East Asian wide and full-width characters, the punctuation Chinese
# prose uses that Unicode counts as ambiguous width.
CHINESE_PUNCTUATION = "“”‘’—…·"


@dataclass(frozen=True)
class Doc:
    """One piece of Markdown: a file, part of one, or a notebook cell."""

    label: str  # what a failure names: path, and cell id for notebooks
    path: Path  # the file it lives in (links resolve from its folder)
    text: str


@cache
def parser() -> MarkdownIt:
    """CommonMark plus the GitHub tables the docs use."""
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def repo_files(suffix: str) -> list[Path]:
    """Every file ending in `suffix`, without following links into folders
    and without the hidden, virtual-environment and download folders."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(
            d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")
        )
        found += [Path(folder) / f for f in files if f.endswith(suffix)]
    return sorted(p for p in found if not p.is_symlink())


def notebook_cells(path: Path) -> list[Doc]:
    nb = nbformat.read(path, as_version=4)
    return [
        Doc(f"{rel(path)} cell {c.get('id')}", path, c.source)
        for c in nb.cells
        if c.cell_type == "markdown"
    ]


def all_markdown() -> list[Doc]:
    """Every `*.md` file and every notebook's markdown cells."""
    files = [Doc(rel(p), p, p.read_text(encoding="utf-8")) for p in repo_files(".md")]
    cells = [doc for nb in repo_files(".ipynb") for doc in notebook_cells(nb)]
    return files + cells


def chinese_markdown() -> list[Doc]:
    """Every `*.zh.md` (`README.zh.md` among them) and the zh notebooks' cells."""
    files = [
        Doc(rel(p), p, p.read_text(encoding="utf-8")) for p in repo_files(".zh.md")
    ]
    cells = [
        d
        for folder in ZH_NOTEBOOK_DIRS
        for nb in sorted(folder.glob("*.ipynb"))
        for d in notebook_cells(nb)
    ]
    return files + cells


# --- What the rendered text shows -------------------------------------------


def _inline_tokens(markdown: str) -> Iterator:
    for token in parser().parse(markdown):
        if token.type == "inline":
            yield token


def literal_emphasis(markdown: str) -> list[str]:
    """Each `**` or `__` that survives rendering as text (an emphasis that
    did not close), with the text around it."""
    found = []
    for token in _inline_tokens(markdown):
        text = "".join(
            child.content if child.type == "text" else "\x00"
            for child in token.children or []
        )
        for m in re.finditer(r"\*\*|__", text):
            found.append(
                text[max(0, m.start() - 20) : m.end() + 20].replace("\x00", "|")
            )
    return found


def is_full_width(char: str) -> bool:
    """A character with no space beside it in Chinese typesetting."""
    return (
        unicodedata.east_asian_width(char) in ("W", "F") or char in CHINESE_PUNCTUATION
    )


def breaks_next_to_full_width(markdown: str) -> list[str]:
    """Each soft line break (rendered as a space) with a full-width character
    right before or after it, outside code blocks; hard breaks (two trailing
    spaces or a backslash) are a new line, not a space, and stay allowed."""
    found = []
    for token in _inline_tokens(markdown):
        text = token.content
        for m in re.finditer(r"\n", text):
            before = text[: m.start()]
            if before.endswith(("  ", "\\")):
                continue
            left = before.rstrip(" \t")[-1:]
            right = text[m.end() :].lstrip(" \t")[:1]
            if any(c and is_full_width(c) for c in (left, right)):
                found.append(text[max(0, m.start() - 12) : m.end() + 12])
    return found


# --- Headings and links --------------------------------------------------------


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading with this text (github-slugger): lower
    case, punctuation and symbols dropped, each space a hyphen."""
    kept = (
        c
        for c in heading.strip().lower()
        if c.isalnum() or c in "-_ " or unicodedata.category(c).startswith("M")
    )
    return "".join(kept).replace(" ", "-")


def _plain(inline) -> str:
    return "".join(
        child.content
        for child in inline.children or []
        if child.type in ("text", "code_inline", "softbreak")
    )


@dataclass(frozen=True)
class Heading:
    anchor: str
    offset: int  # the line it starts on


def headings(markdown: str) -> list[Heading]:
    """The document's headings with GitHub's anchors (`-1`, `-2` for repeats)."""
    tokens = parser().parse(markdown)
    seen: dict[str, int] = {}
    found = []
    for i, token in enumerate(tokens):
        if token.type != "heading_open":
            continue
        slug = github_anchor(_plain(tokens[i + 1]))
        anchor = f"{slug}-{seen[slug]}" if slug in seen else slug
        seen[slug] = seen.get(slug, 0) + 1
        found.append(Heading(anchor, token.map[0]))
    return found


@dataclass(frozen=True)
class Link:
    text: str
    href: str


def links(markdown: str) -> list[Link]:
    """Every link (inline or reference style) with its visible text."""
    found = []
    for token in _inline_tokens(markdown):
        children = token.children or []
        for i, child in enumerate(children):
            if child.type != "link_open":
                continue
            text = []
            for inner in children[i + 1 :]:
                if inner.type == "link_close":
                    break
                text.append(inner.content)
            found.append(Link("".join(text), str(child.attrs.get("href", ""))))
    return found


def code_snippets(text: str) -> list[str]:
    """Lines of fenced code blocks (continuations joined, `$ ` prompts
    dropped) and inline code spans."""
    out, block, lines = [], False, text.splitlines()
    joined = ""
    for line in lines:
        if line.lstrip().startswith("```"):
            block = not block
            continue
        if block:
            joined += line.rstrip().removesuffix("\\").strip() + " "
            if not line.rstrip().endswith("\\"):
                out.append(joined.strip().removeprefix("$ "))
                joined = ""
        else:  # a span that is only a command's name names it in prose
            out += [
                span
                for span in re.findall(r"`([^`]+)`", line)
                if not re.fullmatch(r"(uv run )?qwen3-(generate|chat)", span)
            ]
    return out


def chart_text_literals(source: str) -> list[str]:
    """The strings a code cell passes to `chart_text` as literals."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "chart_text"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ]
