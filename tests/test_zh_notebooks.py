"""The Chinese notebooks in `zh/` cannot drift from the English ones.

Same code cells in the same order (comments may be translated), the same
checked outputs, every notebook present, the markdown actually translated,
every chart label the notebooks pass to `chart_text` translated, the book's
listings under the Chinese edition's captions, and no line break next to a
full-width character in any notebook or `*.zh.md`
(it renders as a stray space).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from tests import book_text
from tests.markdown_text import (
    ZH_NOTEBOOK_DIRS,
    breaks_next_to_full_width,
    chart_text_literals,
    chinese_markdown,
)
from utils.language import ZH_TEXT

ROOT = Path(__file__).resolve().parents[1]
EN_DIR = ROOT / "ch02" / "01_main-chapter-code"
ZH_DIR = EN_DIR / "zh"
CJK = re.compile(r"[\u4e00-\u9fff]")
# Every `*.zh.md`, README.zh.md among them (the notebooks: below).
ZH_DOCS = [d for d in chinese_markdown() if d.path.suffix == ".md"]


def load_sync():
    """scripts/sync_zh_notebooks.py as a module (scripts/ is no package)."""
    path = ROOT / "scripts" / "sync_zh_notebooks.py"
    spec = importlib.util.spec_from_file_location("sync_zh_notebooks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sync = load_sync()
# Every English notebook with a Chinese twin: the chapter's and the bonus ones
ENGLISH = [nb for folder in sync.FOLDERS for nb in sync.english_notebooks(folder)]


def twin(en_path: Path) -> Path:
    """The Chinese notebook of an English one."""
    return en_path.parent / "zh" / en_path.name


def checked(cell) -> bool:
    return cell.cell_type == "code" and any(
        line.strip() == "# NBVAL_CHECK_OUTPUT" for line in cell.source.splitlines()
    )


def drift(en, zh) -> list[str]:
    """Every way the zh notebook's code differs from the English one."""
    problems = []
    en_code = [c for c in en.cells if c.cell_type == "code"]
    zh_code = [c for c in zh.cells if c.cell_type == "code"]
    if len(en_code) != len(zh_code):
        problems.append(f"{len(zh_code)} code cells, English has {len(en_code)}")
    for i, (a, b) in enumerate(zip(en_code, zh_code, strict=False)):
        if sync.strip_comments(a.source) != sync.strip_comments(b.source):
            problems.append(f"code cell {i} ({a.get('id')}) differs")
        elif checked(a) and a.outputs != b.outputs:
            problems.append(f"checked output of code cell {i} ({a.get('id')}) differs")
    return problems


def test_english_notebooks_exist():
    assert len(ENGLISH) >= 7, [p.name for p in ENGLISH]
    assert sync.FOLDERS[0] == EN_DIR


def test_the_docs_checks_read_the_zh_folders_sync_keeps():
    """tests.markdown_text finds the Chinese notebooks by their zh/ folders
    (links, line breaks, the glossary); they are the sync tool's folders."""
    assert ZH_NOTEBOOK_DIRS == tuple(sorted(f / "zh" for f in sync.FOLDERS))


@pytest.mark.parametrize("en_path", ENGLISH, ids=lambda p: p.stem)
def test_zh_notebook_matches_the_english_code(en_path):
    zh_path = twin(en_path)
    assert zh_path.is_file(), (
        f"{zh_path.relative_to(ROOT)} is missing; run "
        f"`uv run python scripts/sync_zh_notebooks.py` and translate its markdown"
    )
    en = nbformat.read(en_path, as_version=4)
    zh = nbformat.read(zh_path, as_version=4)
    assert drift(en, zh) == [], "run scripts/sync_zh_notebooks.py"


@pytest.mark.parametrize("en_path", ENGLISH, ids=lambda p: p.stem)
def test_zh_markdown_is_translated(en_path):
    zh_path = twin(en_path)
    if not zh_path.is_file():
        pytest.fail(f"{zh_path.name} is missing")
    en = nbformat.read(en_path, as_version=4)
    zh = nbformat.read(zh_path, as_version=4)
    _, untranslated = sync.sync_notebook(en, zh, en_path.name)
    assert untranslated == [], f"markdown cells still in English: {untranslated}"
    titles = [c.source for c in zh.cells if c.cell_type == "markdown"][:1]
    assert titles and CJK.search(titles[0]), "the first markdown cell is the title"


@pytest.mark.parametrize(
    "path",
    ENGLISH + [twin(p) for p in ENGLISH],
    ids=lambda p: str(p.relative_to(EN_DIR.parent)),
)
def test_notebook_markdown_has_no_line_break_next_to_full_width(path):
    nb = nbformat.read(path, as_version=4)
    breaks = [
        f"{c.id}: {b!r}"
        for c in nb.cells
        if c.cell_type == "markdown"
        for b in breaks_next_to_full_width(c.source)
    ]
    assert breaks == [], "join these lines (a break renders as a space)"


@pytest.mark.parametrize("doc", ZH_DOCS, ids=lambda d: d.label)
def test_zh_docs_have_no_line_break_next_to_full_width(doc):
    assert breaks_next_to_full_width(doc.text) == []


def test_break_check_finds_breaks_and_allows_the_rest():
    check = breaks_next_to_full_width
    assert check("矩阵-向量\n内核") == ["矩阵-向量\n内核"]
    assert check("> 第一行，\n> 第二行") != []
    assert check("  续行，\n  第二行") != []
    assert check("- 列表项，\n  续行") != []
    assert check("内存，\nKV 缓存") != []  # full-width punctuation, then Latin
    assert check("见 KV 缓存\n（第 2 节）") != []  # a full-width parenthesis
    assert check("做法——\n通过镜像") != []
    assert check("中文 `code`\n中文") != []
    assert check("中文 `code`\nmore") == []  # no full-width neighbour
    assert check("English prose\nwraps freely.") == []
    assert check("段落一。\n\n段落二。") == []  # a paragraph break
    assert check("第一行。  \n第二行") == []  # a hard break is a new line
    assert check("```text\n代码\n块\n```") == []
    assert check("## 标题\n正文") == []  # a heading ends its line
    assert check("说明：\n- 第一项") == []  # a list starts a new block


def glossary_avoided() -> dict[str, str]:
    """Avoided term -> the term to use, from the glossary in ch02/README.zh.md
    (its 术语对照 table: English | 中文用语 | 出处 | 不用)."""
    text = (ROOT / "ch02" / "README.zh.md").read_text(encoding="utf-8")
    table = text.split("## 术语对照", 1)[1]
    avoided = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[3].startswith("`"):
            for term in re.findall(r"`([^`]+)`", cells[3]):
                avoided[term] = cells[1]
    return avoided


def zh_prose() -> list[tuple[str, str]]:
    """(where, text) of every Chinese text: docs, zh markdown, zh comments
    (the glossary itself, which names the avoided terms, left out)."""
    found = [(d.label, d.text.split("## 术语对照", 1)[0]) for d in chinese_markdown()]
    for path in map(twin, ENGLISH):
        for c in nbformat.read(path, as_version=4).cells:
            if c.cell_type == "code":
                found.append((f"{path.name} cell {c.id}", c.source))
    return found


def test_the_glossary_lists_the_avoided_terms():
    avoided = glossary_avoided()
    assert {"替身", "BPE 排名", "Transformer 块", "超出本书的内容"} <= set(avoided)
    assert avoided["替身"].startswith("占位权重")


@pytest.mark.parametrize("where_text", zh_prose(), ids=lambda wt: wt[0])
def test_zh_text_uses_the_glossary_terms(where_text):
    where, text = where_text
    found = {t: use for t, use in glossary_avoided().items() if t in text}
    assert found == {}, f"{where}: write these as the glossary says: {found}"


def test_zh_docs_give_the_linux_download_of_the_english_table():
    """The Chinese pages round the Linux x86-64 total of the installing page's
    table (tests/test_project.py ties that table to uv.lock)."""
    page = ROOT / "ch02" / "02_setup-tips" / "python-and-uv.md"
    lines = page.read_text(encoding="utf-8").splitlines()
    linux = [ln for ln in lines if ln.startswith("| Linux x86-64 |")]
    (row,) = [ln for ln in linux if ln.count(" GB") >= 3]  # the sizes table
    sizes = [float(x) for x in re.findall(r"(\d+\.\d+) GB", row)]
    total = f"约 {sizes[-1]:.1f} GB"
    pages = [
        d
        for d in ZH_DOCS
        if d.label in ("README.zh.md", "ch02/02_setup-tips/python-and-uv.zh.md")
    ]
    assert len(pages) == 2
    for doc in pages:
        assert total in doc.text, f"{doc.label}: write {total} for Linux x86-64"


@pytest.mark.parametrize("n", range(1, 7))
def test_zh_listings_carry_the_editions_captions(n):
    block = book_text.listing(n)
    notebook, _ = book_text.TYPED[block.number]
    zh = nbformat.read(ZH_DIR / notebook, as_version=4)
    cells = [
        c.source
        for c in zh.cells
        if c.cell_type == "code" and c.source.startswith(f"# 清单 2.{n} ")
    ]
    assert len(cells) == 1, f"zh/{notebook}: one cell must start with # 清单 2.{n}"
    head, body = cells[0].split("\n", 1)
    assert head == f"# {block.caption}"
    # Only this repository's own comments may be translated
    assert sync.strip_comments(body) == sync.strip_comments(
        book_text.typed(block.number)
    )


def test_every_chart_label_in_the_notebooks_has_a_translation():
    used = {
        text
        for path in ENGLISH
        for cell in nbformat.read(path, as_version=4).cells
        if cell.cell_type == "code"
        for text in chart_text_literals(cell.source)
    }
    missing = sorted(used - set(ZH_TEXT))
    assert missing == [], f"add these to utils.language.ZH_TEXT: {missing}"


# --------------------------------------------------------------------------
# The checks and the sync tool themselves
# --------------------------------------------------------------------------


def code(source, cell_id, outputs=()):
    cell = nbformat.v4.new_code_cell(source, id=cell_id)
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return cell


def md(source, cell_id):
    return nbformat.v4.new_markdown_cell(source, id=cell_id)


def toy_english():
    out = {"output_type": "stream", "name": "stdout", "text": "42\n"}
    return nbformat.v4.new_notebook(
        cells=[
            md("# Title", "t"),
            code(
                "# NBVAL_CHECK_OUTPUT\nx = 6 * 7  # the answer\nprint(x)", "c1", [out]
            ),
            md("More text.", "m"),
            code("!pip list  # shell\ny = x", "c2"),
        ]
    )


def test_comments_may_differ_code_may_not():
    strip = sync.strip_comments
    assert strip("x = 1  # one\n# note\ny = 2") == strip("x = 1  # 一\n\ny = 2")
    assert strip("s = '# not a comment'") != strip("s = '# 不是注释'")
    assert strip("# NBVAL_CHECK_OUTPUT\nx") != strip("x")
    assert (
        strip("!pip list  # shell\n%cd ..  # up") == "!pip list  # shell\n%cd ..  # up"
    )
    assert strip("!echo don't  # x\n# y\nz = 1  # z") == "!echo don't  # x\nz = 1"
    assert strip('s = """\n# in a string\n"""') == 's = """\n# in a string\n"""'


def test_drift_is_found_and_sync_repairs_it(tmp_path):
    en = toy_english()
    zh = sync.sync_notebook(en, None, "toy")[0]
    zh.cells[0].source = "# 标题"
    zh.cells[2].source = "更多说明。"
    zh.cells[1].source = zh.cells[1].source.replace("the answer", "答案")
    assert drift(en, zh) == []
    assert sync.sync_notebook(en, zh, "toy")[1] == []

    broken = nbformat.from_dict(zh)
    broken.cells[1].source = broken.cells[1].source.replace("6 * 7", "7 * 6")
    assert drift(en, broken) == ["code cell 0 (c1) differs"]
    broken = nbformat.from_dict(zh)
    broken.cells[1].outputs[0].text = "41\n"
    assert drift(en, broken) == ["checked output of code cell 0 (c1) differs"]
    broken = nbformat.from_dict(zh)
    del broken.cells[3]
    assert drift(en, broken) == ["1 code cells, English has 2"]

    # The English notebook changes: a code cell is edited, one is added, a
    # markdown cell is added; sync keeps every translation that still fits.
    en.cells[3].source = "!pip list\ny = x + 1"
    en.cells.insert(3, md("New English text.", "m2"))
    en.cells.append(code("print(y)", "c3"))
    zh.cells.insert(1, md("仅中文版的提示。", "zh-only"))
    new, untranslated = sync.sync_notebook(en, broken, "toy")
    assert drift(en, new) == []
    assert untranslated == ["m2"]
    assert [c.id for c in new.cells] == ["t", "c1", "m", "m2", "c2", "c3"]
    assert new.cells[1].source.endswith("# 答案\nprint(x)")  # comment kept
    new, _ = sync.sync_notebook(en, zh, "toy")
    assert [c.id for c in new.cells][:3] == ["t", "zh-only", "c1"]


def test_sync_writes_missing_notebooks_and_check_reports(tmp_path, capsys):
    en_dir, zh_dir = tmp_path / "en", tmp_path / "en" / "zh"
    en_dir.mkdir()
    nbformat.write(toy_english(), en_dir / "01_toy.ipynb")
    assert sync.sync(en_dir, zh_dir, check=True) == 1
    assert not zh_dir.exists()
    assert sync.sync(en_dir, zh_dir) == 1
    assert "markdown still in English: t, m" in capsys.readouterr().out
    assert sync.sync(en_dir, zh_dir, check=True) == 0
    assert sync.main(["--check"]) in (0, 1)  # the real folders: runs


@pytest.mark.parametrize("folder", sync.FOLDERS, ids=lambda p: p.name)
def test_the_zh_folder_holds_only_notebooks(folder):
    """JupyterLab lists everything in `zh/` beside the notebooks; test
    settings (which zh notebooks pytest runs) live in the root conftest.py."""
    import subprocess

    try:
        listed = subprocess.run(
            ["git", "ls-files", "--", "."], cwd=folder / "zh", capture_output=True,
            text=True, check=True,
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert listed and all(name.endswith(".ipynb") for name in listed), listed
