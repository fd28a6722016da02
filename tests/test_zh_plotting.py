"""Chinese chart labels: a CJK font when one exists, one warning when not."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402

from utils import language, plotting  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Each test starts with matplotlib's settings, no cached font choice and
    no earlier warning."""
    plotting.find_cjk_font.cache_clear()
    monkeypatch.setattr(plotting, "_warned_no_font", False)
    monkeypatch.delenv(language.LANG_ENV, raising=False)
    # matplotlib's own families: any chart drawn before (a widget's, say)
    # added the CJK fallback to the process's settings
    with matplotlib.rc_context(
        {"font.family": matplotlib.rcParamsDefault["font.family"]}
    ):
        yield
    plotting.find_cjk_font.cache_clear()


def draw(title: str) -> list[str]:
    """Render a chart titled `title`; the warnings matplotlib raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig, ax = plt.subplots()
        ax.set_title(title)
        fig.savefig(io.BytesIO(), format="png")
        plt.close(fig)
    return [str(w.message) for w in caught]


def system_cjk_font_files() -> list[str]:
    return [
        path
        for path in font_manager.findSystemFonts()
        if any(h in path.lower() for h in plotting._CJK_FILE_HINTS)
    ]


def test_language_follows_the_notebook_folder(tmp_path, monkeypatch):
    (tmp_path / "zh").mkdir()
    monkeypatch.chdir(tmp_path)
    assert language.notebook_language() == "en"
    assert plotting.chart_text("tokens/sec") == "tokens/sec"
    monkeypatch.chdir(tmp_path / "zh")
    assert language.notebook_language() == "zh"
    monkeypatch.setenv(language.LANG_ENV, "en")
    assert language.notebook_language() == "en"
    assert (
        plotting.chart_text("Generation speed on {device}", device="cpu")
        == "Generation speed on cpu"
    )


def test_without_a_cjk_font_labels_stay_english_with_one_warning(monkeypatch):
    monkeypatch.setattr(plotting, "CJK_FONTS", ("No Such CJK Font",))
    monkeypatch.setattr(plotting, "_CJK_FILE_HINTS", ())
    monkeypatch.setenv(language.LANG_ENV, "zh")
    families = list(matplotlib.rcParams["font.family"])

    with pytest.warns(UserWarning, match="fonts-noto-cjk") as record:
        title = plotting.chart_text("KV cache memory of Qwen3 0.6B")
        plotting.chart_text("tokens/sec")
    assert len(record) == 1  # one warning, however many labels
    assert title == "KV cache memory of Qwen3 0.6B"
    assert matplotlib.rcParams["font.family"] == families
    # ...and the chart has no missing glyphs (no boxes)
    assert not [m for m in draw(title) if "missing from font" in m]

    # The same Chinese text without the fallback would be drawn as boxes,
    # which is what the English fallback avoids:
    assert any("missing from font" in m for m in draw("每秒 token 数"))


def test_english_labels_never_warn_about_fonts(monkeypatch):
    """The "install a CJK font" hint is for the Chinese notebooks only."""
    monkeypatch.setattr(plotting, "CJK_FONTS", ("No Such CJK Font",))
    monkeypatch.setattr(plotting, "_CJK_FILE_HINTS", ())
    monkeypatch.setenv(language.LANG_ENV, "en")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plotting.chart_text("tokens/sec") == "tokens/sec"


def test_the_current_figures_own_fonts_keep_first_place():
    """Text made before the first label (a monospace tick label, say) keeps
    its family and gains the CJK fallback after it."""
    name = plotting.find_cjk_font()
    if name is None:
        pytest.skip("no CJK font installed (e.g. apt install fonts-noto-cjk)")
    fig, ax = plt.subplots()
    ax.set_yticks([0, 1], ["a", "b"], fontfamily="monospace")
    plotting.chart_text("probability")
    assert ax.title.get_fontfamily() == ["sans-serif", name]
    assert ax.get_yticklabels()[0].get_fontfamily() == ["monospace", name]
    plt.close(fig)


def test_with_a_cjk_font_chinese_labels_render(monkeypatch):
    if plotting.find_cjk_font() is None:
        pytest.skip("no CJK font installed (e.g. apt install fonts-noto-cjk)")
    monkeypatch.setenv(language.LANG_ENV, "zh")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no font" warning either
        title = plotting.chart_text(
            "Table 2.1 from the book next to this machine ({device})", device="cpu"
        )
    assert title == "书中表 2.1 与本机（cpu）的结果对比"
    assert plotting.find_cjk_font() in matplotlib.rcParams["font.family"]
    assert matplotlib.rcParams["font.family"][0] != plotting.find_cjk_font()
    assert not [m for m in draw(title) if "missing from font" in m]


def test_fonts_installed_after_matplotlibs_cache_are_found(monkeypatch):
    files = system_cjk_font_files()
    if not files:
        pytest.skip("no CJK font files on this system")
    stale = [
        f for f in font_manager.fontManager.ttflist if f.name not in plotting.CJK_FONTS
    ]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", stale)
    name = plotting.find_cjk_font()
    assert name in plotting.CJK_FONTS
    assert name in {f.name for f in font_manager.fontManager.ttflist}


def test_every_translation_keeps_the_format_fields():
    import string

    def fields(text):
        return {f for _, f, _, _ in string.Formatter().parse(text) if f}

    for english, chinese in language.ZH_TEXT.items():
        assert fields(english) == fields(chinese), english
        assert chinese.strip(), english


# --- every chart cell of the notebooks, en and zh, in either order ----------

CH02 = Path(__file__).resolve().parents[1] / "ch02"
# The notebook folders with charts: the chapter's and the batched-inference bonus
NOTEBOOK_DIRS = (CH02 / "01_main-chapter-code", CH02 / "04_batched-inference")
# The ten ids notebook 03's seeded stand-in ranks first after its prompt
# (three of them Chinese: '优先', '其所', '取暖'; one Arabic, one Cyrillic).
STANDIN_TOP_IDS = [104747, 111014, 41954, 14177, 115693]
STANDIN_TOP_IDS += [23528, 125696, 63493, 126219, 54520]


def chart_cells() -> list[tuple[Path, str]]:
    """(notebook, source) of every code cell that draws with pyplot."""
    cells = []
    notebooks = [
        path
        for folder in NOTEBOOK_DIRS
        for path in [*folder.glob("*.ipynb"), *folder.glob("zh/*.ipynb")]
    ]
    for path in sorted(notebooks):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and "plt.subplots" in cell.source:
                cells.append((path, cell.source))
    return cells


def chart_inputs(stem: str, tok) -> dict:
    """What the chart cell of notebook `stem` reads from the cells before it
    (the real figures' shapes; the model itself is not needed)."""
    import torch
    from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B

    mine = {"Regular": 1.2, "Regular compiled": 1.5, "KV cache": 8.0}
    batch_sizes = [1, 2, 4, 8, 16]
    mine["KV cache compiled"] = 9.5
    inputs = {
        "02_load-model": {
            "bytes_per_param": {"float32": 4, "bfloat16": 2},
            "total_params": 751_632_384,
            "unique_params": 596_049_920,
        },
        "03_next-token": {
            "tokenizer": tok,
            "top_ids": torch.tensor(STANDIN_TOP_IDS),
            "top_probas": torch.linspace(0.49, 0.01, 10),
        },
        "05_kv-cache": {
            "torch": torch,
            "model": torch.nn.Linear(4, 4),
            "cfg": QWEN_CONFIG_06_B,
            "bytes_per_element": 2,
            "bytes_per_token": 114_688,
        },
        "01_batched-inference": {
            "torch": torch,
            "device": torch.device("cpu"),
            "batch_sizes": batch_sizes,
            "book_rates": {b: (17.0 * b**0.7, 17.0 / b**0.3) for b in batch_sizes},
        },
        "06_compile": {
            "device": torch.device("cpu"),
            "mine": mine,
            "book": {
                "Mac Mini M4 CPU": [5, 6, 28, 68],
                "This machine": [1, 2, 8, 9],
            },
        },
    }
    return inputs[stem]


def run_chart_cell(source: str, namespace: dict, labels_first: bool) -> list[str]:
    """Run a chart cell as a notebook kernel would (any warning an error),
    drawing what `plt.show()` shows; the text of the figure's labels.
    `labels_first`: every `chart_text` label of the cell is made once before
    the cell runs (the order that worked before `chart_text` fixed fonts on
    the current figure)."""
    from tests.markdown_text import chart_text_literals

    drawn: list[str] = []

    def show() -> None:
        for number in plt.get_fignums():
            fig = plt.figure(number)
            fig.savefig(io.BytesIO(), format="png")
            drawn.extend(t.get_text() for t in fig.findobj(matplotlib.text.Text))
            plt.close(fig)

    plt.close("all")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if labels_first:
            for text in chart_text_literals(source):
                plotting.chart_text(text)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(plt, "show", show)
            exec(compile(source, "<chart cell>", "exec"), namespace)
    return drawn


def test_every_notebook_has_its_charts():
    found = {(p.parent.name, p.stem) for p, _ in chart_cells()}
    stems = {"02_load-model", "03_next-token", "05_kv-cache", "06_compile"}
    bonus = "01_batched-inference"
    assert found == {
        *((d, s) for d in ("01_main-chapter-code", "zh") for s in stems),
        *((d, bonus) for d in ("04_batched-inference", "zh")),
    }


def cell_id(value: object) -> str:
    return f"{value.parent.name}/{value.stem}" if isinstance(value, Path) else ""


@pytest.mark.parametrize(
    "labels_first", [False, True], ids=["figure-first", "labels-first"]
)
@pytest.mark.parametrize(("path", "source"), chart_cells(), ids=cell_id)
def test_chart_cells_draw_every_glyph(path, source, labels_first, tok, monkeypatch):
    """No "Glyph ... missing from font(s)" (boxes): Chinese labels in zh/,
    the stand-in's Chinese tokens in notebook 03, whichever comes first."""
    import re

    import matplotlib.text  # noqa: F401  (run_chart_cell reads Text objects)

    if plotting.find_cjk_font() is None:
        pytest.skip("no CJK font installed (e.g. apt install fonts-noto-cjk)")
    monkeypatch.chdir(path.parent)  # as Jupyter runs it: zh/ means Chinese
    drawn = run_chart_cell(source, chart_inputs(path.stem, tok), labels_first)
    chinese = {t for t in drawn if re.search(r"[\u4e00-\u9fff]", t)}
    if path.parent.name == "zh":
        assert len(chinese) >= 2, drawn  # the title and an axis label at least
    elif path.stem == "03_next-token":
        assert len(chinese) == 3, drawn  # the stand-in's Chinese tokens
    else:
        assert not chinese, drawn


# --- notebook 06: Table 2.1 and its chart name the modes alike --------------


def table_modes(path: Path) -> tuple[list[str], list[str]]:
    """(the mode column of notebook 06's Table 2.1, in order, each once;
    the mode columns of its filled table's header)."""
    cells = {c.get("id"): c.source for c in nbformat.read(path, as_version=4).cells}
    rows = [line.split("|")[1].strip() for line in cells["nb06-table"].splitlines()
            if line.startswith("| ") and "Mac Mini M4 CPU" in line]  # fmt: skip
    header = cells["nb06-ex22-filled"].split("\n| ", 1)[1].splitlines()[0]
    return rows, [c.strip() for c in header.split("|")[1:-2]]


@pytest.mark.parametrize("folder", ["01_main-chapter-code", "zh"])
def test_table_2_1_and_its_chart_name_the_modes_alike(folder, tok, monkeypatch):
    """The chart's ticks are the table's modes and the filled table's
    columns; its legend and title say "this machine" in the notebook's
    language (a zh chart once read "This machine (cpu)" beside "常规")."""
    if plotting.find_cjk_font() is None:
        pytest.skip("no CJK font installed (e.g. apt install fonts-noto-cjk)")
    path = NOTEBOOK_DIRS[0] / ("zh" if folder == "zh" else "") / "06_compile.ipynb"
    (source,) = [s for p, s in chart_cells() if p == path]
    monkeypatch.chdir(path.parent)
    figures = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt, "show", lambda: figures.append(plt.gcf()))
        exec(compile(source, "<chart cell>", "exec"), chart_inputs("06_compile", tok))
    ax = figures[0].axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close("all")
    rows, columns = table_modes(path)
    assert ticks == rows == columns
    zh = folder == "zh"
    assert legend[-1] == ("本机" if zh else "This machine")
    assert ("本机（cpu）" if zh else "this machine (cpu)") in ax.get_title()
    english = ["Regular", "Regular compiled", "KV cache", "KV cache compiled"]
    chinese = ["常规", "常规 + 编译", "KV 缓存", "KV 缓存 + 编译"]
    assert ticks == (chinese if zh else english)
