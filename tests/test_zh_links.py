"""A Chinese page's links lead to Chinese pages.

Every link in every `*.zh.md` (`README.zh.md` among them) and in the zh
notebooks' markdown must point at something that exists: a file or folder of
the repository, and where it names an anchor, a heading of that file with
that anchor as GitHub makes it. A link into prose (Markdown or a notebook)
must land in Chinese prose: a `*.zh.md` file or a zh notebook. The one way
into English prose is a link whose text says so (`English`, `英文`), such as
the language switch at the top of each page. Web addresses are not checked
(the tests run offline).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.markdown_text import (
    README_ZH,
    ROOT,
    ZH_NOTEBOOK_DIRS,
    Doc,
    chinese_markdown,
    headings,
    links,
    notebook_cells,
    rel,
)

DOCS = chinese_markdown()
ENGLISH_LABELS = ("English", "英文")


def anchors(path: Path) -> set[str]:
    """The anchors a link may use in `path`."""
    if path.suffix == ".ipynb":
        text = "\n\n".join(d.text for d in notebook_cells(path))
        return {h.anchor for h in headings(text)}
    return {h.anchor for h in headings(path.read_text(encoding="utf-8"))}


def is_prose(path: Path) -> bool:
    """Markdown or a notebook a reader reads (the tests' data files are not)."""
    return path.suffix in (".md", ".ipynb") and not rel(path).startswith("tests/")


def is_chinese(path: Path) -> bool:
    return path.name.endswith(".zh.md") or (
        path.suffix == ".ipynb" and path.parent in ZH_NOTEBOOK_DIRS
    )


def problem(doc: Doc, text: str, href: str) -> str | None:
    """Why this link fails, or None."""
    url = urlsplit(href)
    if url.scheme or href.startswith("//"):
        return None  # the web, not checked offline
    target = (doc.path.parent / unquote(url.path)).resolve() if url.path else doc.path
    if not target.is_relative_to(ROOT) or not target.exists():
        return "no such file"
    english_ok = any(label in text for label in ENGLISH_LABELS)
    if target.is_dir():
        if (target / "README.md").is_file() and not english_ok:
            return "a folder GitHub shows with its English README.md"
        return None
    anchor = unquote(url.fragment)
    if anchor and target.suffix in (".md", ".ipynb"):
        if anchor not in anchors(target):
            return f"no heading #{anchor} there"
    if is_prose(target) and not english_ok and not is_chinese(target):
        return "English prose (say so in the link text, or link a Chinese page)"
    return None


def link_problems(doc: Doc) -> list[str]:
    return [
        f"[{link.text}]({link.href}): {why}"
        for link in links(doc.text)
        if (why := problem(doc, link.text, link.href))
    ]


def test_the_chinese_docs_are_found():
    labels = [d.label for d in DOCS]
    assert "ch02/README.zh.md" in labels and rel(README_ZH) in labels
    assert sum(".ipynb cell" in label for label in labels) > 50


def test_the_link_check_tells_good_links_from_bad():
    page = Doc("t", ROOT / "ch02" / "02_setup-tips" / "README.zh.md", "")

    def why(text: str, href: str) -> str | None:
        return problem(page, text, href)

    assert why("中国大陆", "china-network.zh.md") is None
    assert why("English", "README.md") is None  # the language switch
    assert why("PyTorch", "python-and-uv.zh.md#pytorch-的不同版本") is None
    assert why("x", "https://example.com/#anything") is None
    assert why("x", "../../utils") is None  # code: a folder without README.md
    assert why("中文首页", "../../README.zh.md#从这里开始") is None
    assert "English prose" in why("指南", "python-and-uv.md")
    assert "English prose" in why("主 README", "../../README.md")
    assert "no heading" in why("英文首页", "../../README.md#quick-start")
    assert why("英文的首页", "../../README.md#start-here") is None
    assert "no heading" in why("x", "python-and-uv.zh.md#no-such-heading")
    assert "no such file" in why("x", "missing.zh.md")
    assert "English README.md" in why("x", "../03_fast-decoding/")
    assert why("附加内容（英文）", "../03_fast-decoding/README.md") is None


@pytest.mark.parametrize("doc", DOCS, ids=[d.label for d in DOCS])
def test_links_from_chinese_pages_land_in_chinese_prose(doc):
    assert link_problems(doc) == []
