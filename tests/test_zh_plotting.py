"""Chinese chart labels: a CJK font when one exists, one warning when not."""

from __future__ import annotations

import io
import warnings

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402

from utils import plotting  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Each test starts with matplotlib's settings, no cached font choice and
    no earlier warning."""
    plotting.find_cjk_font.cache_clear()
    monkeypatch.setattr(plotting, "_warned_no_font", False)
    monkeypatch.delenv(plotting.LANG_ENV, raising=False)
    with matplotlib.rc_context():
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
    assert plotting.notebook_language() == "en"
    assert plotting.chart_text("tokens/sec") == "tokens/sec"
    monkeypatch.chdir(tmp_path / "zh")
    assert plotting.notebook_language() == "zh"
    monkeypatch.setenv(plotting.LANG_ENV, "en")
    assert plotting.notebook_language() == "en"
    assert (
        plotting.chart_text("Generation speed on {device}", device="cpu")
        == "Generation speed on cpu"
    )


def test_without_a_cjk_font_labels_stay_english_with_one_warning(monkeypatch):
    monkeypatch.setattr(plotting, "CJK_FONTS", ("No Such CJK Font",))
    monkeypatch.setattr(plotting, "_CJK_FILE_HINTS", ())
    monkeypatch.setenv(plotting.LANG_ENV, "zh")
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


def test_with_a_cjk_font_chinese_labels_render(monkeypatch):
    if plotting.find_cjk_font() is None:
        pytest.skip("no CJK font installed (e.g. apt install fonts-noto-cjk)")
    monkeypatch.setenv(plotting.LANG_ENV, "zh")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no font" warning either
        title = plotting.chart_text("This machine ({device})", device="cpu")
    assert title == "本机（cpu）"
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

    for english, chinese in plotting.ZH_CHART_TEXT.items():
        assert fields(english) == fields(chinese), english
        assert chinese.strip(), english
