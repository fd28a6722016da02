"""Chart text in the notebook's language, and a font that can draw Chinese.

The English notebooks and their Chinese copies in `zh/` share every code
cell, so a chart cell writes its labels through `chart_text`:

    ax.set_title(chart_text("KV cache memory of Qwen3 0.6B"))

In a notebook that runs in a folder named `zh` (or with `QWEN3_LANG=zh`)
this returns the Chinese label from `utils.language.ZH_TEXT` (the one table
of the notebooks' words); elsewhere it returns the English text unchanged.
In both languages it adds a CJK font as matplotlib's fallback family, for
new text and for the text of the figure being drawn (its title, axis labels
and ticks exist from `plt.subplots()` on, so a label set through
`chart_text` after `plt.subplots()` draws Chinese too, and so do the Chinese
tokens of the stand-in's English charts). Where no CJK font is installed the
Chinese notebooks' labels stay English and one warning says which font to
install, so a chart never shows empty boxes in their place.

A token piece on a chart's axis goes through `chart_label` (notebook 03's
chart and the next-token view alike): the piece itself, in quotes, with only
the characters no font of the chart can draw written as escapes.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

from utils.language import ZH_TEXT, in_language, notebook_language

# Font family names (as matplotlib reports them) with Chinese glyphs, most
# common first: Linux (Noto/Source Han/WenQuanYi), Windows (YaHei, SimHei),
# macOS (PingFang, Hiragino, Heiti, Arial Unicode).
CJK_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans SC",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "Microsoft YaHei",
    "PingFang SC",
    "Hiragino Sans GB",
    "Heiti SC",
    "STHeiti",
    "SimHei",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Noto Sans CJK JP",
    "Noto Sans CJK TC",
    "Source Han Sans",
    "Droid Sans Fallback",
    "Arial Unicode MS",
)
# Font files that may hold one of them; matplotlib's font cache does not see
# fonts installed after it was built, so these are registered on demand.
_CJK_FILE_HINTS = (
    "notosanscjk",
    "notosanssc",
    "sourcehansans",
    "msyh",
    "pingfang",
    "hiragino sans gb",
    "stheiti",
    "simhei",
    "wqy",
    "droidsansfallback",
    "arial unicode",
)

INSTALL_HINT = (
    "install one, e.g. `sudo apt install fonts-noto-cjk` (Debian/Ubuntu), "
    "`sudo dnf install google-noto-sans-cjk-fonts` (Fedora); Windows and macOS "
    "ship Microsoft YaHei / PingFang"
)

_warned_no_font = False


@functools.cache
def find_cjk_font() -> str | None:
    """The first of `CJK_FONTS` matplotlib can use, or None.

    Registers matching font files installed after matplotlib built its cache.
    """
    from matplotlib import font_manager

    def installed() -> set[str]:
        return {f.name for f in font_manager.fontManager.ttflist}

    names = installed()
    if not names & set(CJK_FONTS):
        for path in font_manager.findSystemFonts():
            if any(h in Path(path).name.lower() for h in _CJK_FILE_HINTS):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):
                    continue  # unreadable file: try the next one
        names = installed()
    return next((name for name in CJK_FONTS if name in names), None)


def use_cjk_font(warn: bool = True) -> str | None:
    """Let matplotlib draw Chinese: add a CJK font as the fallback family of
    new text and of the text pyplot's current figure already holds.

    Returns the font's name; without one, warns once (if `warn`: naming what
    to install) and returns None.
    """
    global _warned_no_font
    import matplotlib

    name = find_cjk_font()
    if name is None:
        if warn and not _warned_no_font:
            _warned_no_font = True
            warnings.warn(
                f"No font with Chinese glyphs found for matplotlib (looked for "
                f"{', '.join(CJK_FONTS[:6])}, ...); chart labels stay in "
                f"English. To see them in Chinese, {INSTALL_HINT}, then restart "
                f"the kernel.",
                stacklevel=3,
            )
        return None
    # Latin text keeps its font; characters it lacks come from the CJK font
    # (matplotlib's per-glyph fallback, matplotlib >= 3.6).
    matplotlib.rcParams["font.family"] = _with_fallback(
        matplotlib.rcParams["font.family"], name
    )
    _add_fallback_to_current_figure(name)
    return name


def _with_fallback(families: str | list[str], name: str) -> list[str]:
    """`families` (a name or a list) with `name` last, if it is not there."""
    families = [families] if isinstance(families, str) else list(families)
    return families if name in families else [*families, name]


def _add_fallback_to_current_figure(name: str) -> None:
    """Text objects take their font when they are made: the title and axis
    labels of `plt.subplots()` were made before the first `chart_text` call
    changed rcParams. Give the current figure's text the fallback too (new
    ticks copy the first tick's font). Never opens a figure."""
    import sys

    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None or not pyplot.get_fignums():
        return
    from matplotlib.text import Text

    for text in pyplot.gcf().findobj(Text):
        families = text.get_fontfamily()
        if name not in families:
            text.set_fontfamily(_with_fallback(families, name))


def chart_text(text: str, /, **fields: object) -> str:
    """`text` in the notebook's language (see module docstring), formatted
    with `fields`; English where no CJK font or no translation exists. Adds
    the CJK fallback font in English notebooks too (the stand-in's tokens)."""
    zh = notebook_language() == "zh"
    font = use_cjk_font(warn=zh and text in ZH_TEXT)
    return in_language(text, lang="zh" if zh and font else "en", **fields)


def chart_label(piece: str) -> str:
    """A token piece as a chart's tick label: its repr (the quotes show a
    leading space), each character that no font of the chart's family or its
    CJK fallback has a glyph for written as an escape (`\\u0e01`), never an
    empty box. Adds the CJK fallback font, as `chart_text` does."""
    import matplotlib

    use_cjk_font(warn=False)
    drawable = _drawable(tuple(matplotlib.rcParams["font.family"]))
    return "".join(c if ord(c) in drawable else ascii(c)[1:-1] for c in repr(piece))


@functools.cache
def _drawable(families: tuple[str, ...]) -> frozenset[int]:
    """The code points the fonts of `families` (matplotlib's names, generic
    ones such as "sans-serif" included) have glyphs for: what matplotlib's
    per-glyph fallback can draw with them."""
    from matplotlib import font_manager, ft2font

    points: set[int] = set()
    for family in families:
        props = font_manager.FontProperties(family=[family])
        try:
            path = font_manager.findfont(props, fallback_to_default=False)
        except ValueError:  # not installed
            continue
        points.update(ft2font.FT2Font(path).get_charmap())
    return frozenset(points)
