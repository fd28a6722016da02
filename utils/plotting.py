"""Chart text in the notebook's language, and a font that can draw Chinese.

The English notebooks and their Chinese copies in `zh/` share every code
cell, so a chart cell writes its labels through `chart_text`:

    ax.set_title(chart_text("KV cache memory of Qwen3 0.6B"))

In a notebook that runs in a folder named `zh` (or with `QWEN3_LANG=zh`) this
returns the Chinese label from `ZH_CHART_TEXT`; elsewhere it returns the
English text unchanged. In both languages it adds a CJK font as matplotlib's
fallback family, for new text and for the text of the figure being drawn
(its title, axis labels and ticks exist from `plt.subplots()` on, so a label
set through `chart_text` after `plt.subplots()` draws Chinese too, and so do
the Chinese tokens of the stand-in's English charts). Where no CJK font is
installed the Chinese notebooks' labels stay English and one warning says
which font to install, so a chart never shows empty boxes in their place.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

from utils import settings

LANG_ENV = "QWEN3_LANG"

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

# English chart text used in the notebooks -> the Chinese edition's wording.
ZH_CHART_TEXT = {
    # 02_load-model
    "Qwen3 0.6B weights": "Qwen3 0.6B 权重大小",
    "as loaded": "加载后（输出层单独一份）",
    "tied once": "共享权重只算一次",
    # 03_next-token
    "probability": "概率",
    "Top-10 next tokens after the prompt": "提示词之后概率最高的 10 个 token",
    # 05_kv-cache
    "KV cache (bfloat16)": "KV 缓存（bfloat16）",
    "model weights (bfloat16)": "模型权重（bfloat16）",
    "tokens in the sequence": "序列中的 token 数",
    "KV cache memory of Qwen3 0.6B": "Qwen3 0.6B 的 KV 缓存内存占用",
    # 06_compile
    "Regular": "常规",
    "Regular compiled": "常规 + 编译",
    "KV cache": "KV 缓存",
    "KV cache compiled": "KV 缓存 + 编译",
    "tokens/sec": "每秒 token 数",
    "Table 2.1 from the book next to this machine": "书中表 2.1 与本机结果对比",
    "This machine ({device})": "本机（{device}）",
}

_warned_no_font = False


def notebook_language() -> str:
    """ "zh" for a notebook in a `zh` folder (or `QWEN3_LANG=zh`), else "en"."""
    lang = (settings.text(LANG_ENV) or "").lower()
    if lang in {"zh", "en"}:
        return lang
    return "zh" if Path.cwd().name == "zh" else "en"


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
    font = use_cjk_font(warn=zh and text in ZH_CHART_TEXT)
    if zh and font is not None and text in ZH_CHART_TEXT:
        text = ZH_CHART_TEXT[text]
    return text.format(**fields) if fields else text
