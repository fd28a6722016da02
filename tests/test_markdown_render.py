"""Every Markdown text renders as written: no `**` or `__` left on screen.

CommonMark closes an emphasis only where the closing `**` is right-flanking:
`**这一步很慢：**用…` stays literal, because the closing `**` follows a
full-width colon and precedes a CJK letter. JupyterLab and GitHub follow the
spec, so the reader sees the asterisks. Every `*.md` file of the repository
and every markdown cell of every notebook (English and Chinese) is rendered
with `markdown-it-py` here and must not show them.
"""

from __future__ import annotations

import pytest

from tests.markdown_text import all_markdown, literal_emphasis

DOCS = all_markdown()


def test_the_docs_and_notebooks_are_found():
    labels = [d.label for d in DOCS]
    assert "README.md" in labels
    assert any(label.startswith("ch02/02_setup-tips/") for label in labels)
    assert sum("/zh/" in label for label in labels) > 50  # zh notebook cells
    assert sum(".ipynb cell" in label for label in labels) > 100


def test_literal_emphasis_is_found_and_allowed_forms_pass():
    assert literal_emphasis("**这一步很慢：**用真实模型") != []
    assert literal_emphasis("**比较每秒 token 数，而不是时间。**书中") != []
    assert literal_emphasis("__这一步很慢：__用真实模型") != []
    assert literal_emphasis("**这一步很慢**：用真实模型") == []
    assert literal_emphasis("**This is slow:** with the real model") == []
    assert literal_emphasis("`__init__` and `a ** b`") == []
    assert literal_emphasis("```python\nx = 2 ** 8\n```") == []
    assert literal_emphasis("| **no** | yes |\n|---|---|\n| a | b |") == []


@pytest.mark.parametrize("doc", DOCS, ids=[d.label for d in DOCS])
def test_markdown_renders_without_literal_emphasis_markers(doc):
    assert literal_emphasis(doc.text) == [], (
        "move the punctuation outside the ** markers (or reword)"
    )
