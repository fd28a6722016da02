"""The pages read as documentation: a README a reader takes in at one
screen, a bonus README of bounded length, and no history of how the
repository was made in any page, notebook or text of `utils/` (that lives
in git: issue numbers, commit hashes, "before/after" narratives, rounds of
work, notes on what else ran on a measuring machine)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BONUS = ROOT / "ch02" / "03_fast-decoding" / "README.md"
FIRST_SCREEN = 40  # lines within which the two commands must stand

# Words that tell the repository's history instead of documenting it.
HISTORY = re.compile(
    r"""\bissues?\s+\#?\d+            # "issue 52"
    | \bthe\s+issue's\b               # "the issue's 1.4x"
    | \bmain\s+at\b                   # "main at `dc44ec6`"
    | \bbefore/after\b
    | \bthis\s+round\b | \brounds?\s+of\s+(?:our|this)\s+work\b
    | \bother\s+sessions?\b | \bshared\s+with\s+(?:other|six)\b
    | \bdevelopment\s+machine\b | 开发机 | 本轮
    | (?<!\.)\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b  # a commit
    """,
    re.X | re.I,
)
URL = re.compile(r"https?://\S+")


def texts() -> list[tuple[str, str]]:
    """(where, text) of every page, notebook cell and file of utils/, web
    addresses taken out (an upstream issue may be cited by its address)."""
    files = [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("ch02/**/*.md"),
             *ROOT.glob("utils/**/*.py"), *ROOT.glob("utils/**/*.[ch]"),
             *ROOT.glob("ch02/**/*.py")]  # fmt: skip
    found = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in files]
    for path in sorted(ROOT.glob("ch02/**/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            found.append((f"{path.relative_to(ROOT)} {cell.get('id')}", cell.source))
    return [(where, URL.sub("", text)) for where, text in found]


def test_no_page_tells_the_repositorys_history():
    said = [
        f"{where}: {m.group(0)!r}"
        for where, text in texts()
        for m in HISTORY.finditer(text)
    ]
    assert not said, said


@pytest.mark.parametrize(
    "text",
    ["as the issue's 1.4x", "issue 55", "before (main at d62ab82)",
     "before/after", "before this round's 170 tests", "shared with six other sessions",
     "本仓库在开发机上填好的一份答案", "a build at `dc44ec6`"],
)  # fmt: skip
def test_the_history_check_catches_what_it_is_for(text):
    assert HISTORY.search(text)


@pytest.mark.parametrize(
    "text",
    ["1.44269504f", "bf16_exact_avx512_xb", "pytorch/pytorch#166387 is cited",
     "three rounds of 40 steps", "1,024 tokens", "sha256 of the file"],
)  # fmt: skip
def test_the_history_check_leaves_documentation_alone(text):
    assert not HISTORY.search(text)


@pytest.mark.parametrize("page", [README, ROOT / "README.zh.md"], ids=["en", "zh"])
def test_the_readme_is_one_screen_with_the_two_commands_on_top(page):
    lines = page.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, len(lines)
    top = "\n".join(lines[:FIRST_SCREEN])
    assert "uv run jupyter lab" in top and "uv run pytest" in top
    assert not re.search(r"\d+ passed|\d+ skipped", top)


def test_the_bonus_readme_stays_in_bounds():
    assert len(BONUS.read_text(encoding="utf-8").splitlines()) <= 250


def test_every_link_between_pages_lands():
    """A page's link to a file of the repository finds it, and the heading
    it names (pages moved: the README's sections now live in docs/ and the
    setup tips). Web addresses are not checked (the tests run offline)."""
    from urllib.parse import unquote, urlsplit

    from tests.markdown_text import all_markdown, headings, links, notebook_cells

    def anchors(path: Path) -> set[str]:
        if path.suffix == ".ipynb":
            text = "\n\n".join(d.text for d in notebook_cells(path))
        else:
            text = path.read_text(encoding="utf-8")
        return {h.anchor for h in headings(text)}

    broken = []
    for doc in all_markdown():
        for link in links(doc.text):
            url = urlsplit(link.href)
            if url.scheme or link.href.startswith(("//", "mailto:")):
                continue
            target = (doc.path.parent / unquote(url.path)) if url.path else doc.path
            anchor = unquote(url.fragment)
            if not target.exists():
                broken.append(f"{doc.label}: {link.href} (no such file)")
            elif anchor and target.suffix in (".md", ".ipynb"):
                if anchor not in anchors(target):
                    broken.append(f"{doc.label}: {link.href} (no such heading)")
    assert not broken, broken
