"""The book's Chapter 2 code and printed output, and how the notebooks type it.

`tests/data/book_listings.md` holds every code block and printed output of
the chapter, in order, as `### Block N: section S, code|output[ — caption]`
headings each followed by one fenced block. The notebook tests compare the
notebooks with it; a reader's clone has it too (nothing outside the
repository is read).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "book_listings.md"
_HEADING = re.compile(
    r"^### Block (\d+): section (2\.\d+), (code|output)(?: — (.+))?$", re.M
)
_FENCE = re.compile(r"```[a-z]*\n(.*?)\n```", re.S)


@dataclass(frozen=True)
class Block:
    """One code block or printed output of the chapter."""

    number: int
    section: str
    kind: str  # "code" or "output"
    caption: str | None  # e.g. "清单 2.1 自动获取设备"
    text: str


@cache
def book_blocks() -> dict[int, Block]:
    """All blocks of the chapter by number (1-61)."""
    source = DATA.read_text(encoding="utf-8")
    heads = list(_HEADING.finditer(source))
    blocks = {}
    for head, after in zip(heads, heads[1:] + [None], strict=True):
        chunk = source[head.end() : after.start() if after else len(source)]
        fence = _FENCE.search(chunk)
        if fence is None:
            raise ValueError(f"{DATA.name}: block {head[1]} has no fenced text")
        number = int(head[1])
        blocks[number] = Block(number, head[2], head[3], head[4], fence[1])
    return blocks


def listing(n: int) -> Block:
    """The code block of Listing 2.n."""
    found = [
        b
        for b in book_blocks().values()
        if b.caption and b.caption.startswith(f"清单 2.{n} ")
    ]
    if len(found) != 1:
        raise LookupError(f"Listing 2.{n} is not in {DATA.name}")
    return found[0]


# How the notebooks type the book's code. Every difference a notebook may
# show is listed as (printed text, typed text); the "differs from the book"
# table in ch02/01_main-chapter-code/README.md gives the reason for each.
BOOK_IMPORT = "from reasoning_from_scratch.qwen3 import download_qwen3_small"
STANDIN_LINE = "if files.standin:  # stand-ins live elsewhere, never in qwen3/\n"
DOCUMENTED: dict[int, list[tuple[str, str]]] = {
    # Listing 2.1: the new TF32 settings from PyTorch 2.11 on (book package 0.2.0)
    17: [
        (
            "            if (major, minor) >= (2, 9):",
            "            # The printed listing has (2, 9); see the text above\n"
            "            if (major, minor) >= (2, 11):",
        )
    ],
    # utils.download: verified downloads, stand-ins, returns the paths
    10: [
        (
            BOOK_IMPORT,
            f"# The book: {BOOK_IMPORT}\nfrom utils.download import "
            "download_qwen3_small",
        ),
        ("download_qwen3_small(", "files = download_qwen3_small("),
    ],  # fmt: skip
    20: [("download_qwen3_small(", "files = download_qwen3_small(")],
    # Stand-ins never live in qwen3/: their paths come from `files`
    12: [
        (
            '"tokenizer-base.json"\n',
            f'"tokenizer-base.json"\n{STANDIN_LINE}    tokenizer_path = '
            "files.tokenizer\n",
        )
    ],
    22: [
        (
            '"qwen3-0.6B-base.pth"\n',
            f'"qwen3-0.6B-base.pth"\n{STANDIN_LINE}    model_path = files.model\n',
        )
    ],
    # Stand-in runs are short (random weights never stop at <|endoftext|>)
    41: [
        (
            "max_new_tokens = 100\n",
            "max_new_tokens = 100\nif files.standin:  # random weights: short "
            "runs keep tests fast\n    max_new_tokens = 10\n",
        )
    ],
}
# Where each code block of the chapter is typed: a code cell of its own
# ("cell", after the documented edits), one line of a cell that lets the
# reader switch it on ("line"), or a fenced block in a markdown cell that
# explains it ("markdown"). Section 2.2's commands are on the installing page.
TYPED = {
    8: ("01_tokenizer.ipynb", "cell"),
    10: ("01_tokenizer.ipynb", "cell"),
    12: ("01_tokenizer.ipynb", "cell"),
    13: ("01_tokenizer.ipynb", "cell"),
    15: ("01_tokenizer.ipynb", "cell"),
    17: ("02_load-model.ipynb", "listing"),
    18: ("02_load-model.ipynb", "cell"),
    19: ("02_load-model.ipynb", "line"),
    20: ("02_load-model.ipynb", "cell"),
    22: ("02_load-model.ipynb", "cell"),
    24: ("03_next-token.ipynb", "cell"),
    25: ("03_next-token.ipynb", "cell"),
    27: ("03_next-token.ipynb", "cell"),
    30: ("03_next-token.ipynb", "cell"),
    32: ("03_next-token.ipynb", "cell"),
    34: ("03_next-token.ipynb", "cell"),
    36: ("03_next-token.ipynb", "cell"),
    38: ("03_next-token.ipynb", "cell"),
    40: ("04_generate.ipynb", "listing"),
    41: ("04_generate.ipynb", "cell"),
    43: ("04_generate.ipynb", "cell"),
    44: ("04_generate.ipynb", "cell"),
    46: ("04_generate.ipynb", "listing"),
    47: ("04_generate.ipynb", "cell"),
    49: ("05_kv-cache.ipynb", "listing"),
    50: ("05_kv-cache.ipynb", "markdown"),
    51: ("05_kv-cache.ipynb", "markdown"),
    52: ("05_kv-cache.ipynb", "cell"),
    54: ("06_compile.ipynb", "cell"),
    55: ("06_compile.ipynb", "listing"),
    57: ("06_compile.ipynb", "listing"),
    59: ("06_compile.ipynb", "markdown"),
    60: ("06_compile.ipynb", "line"),
}


def typed(block: int) -> str:
    """The book's block with this repository's documented edits applied."""
    text = book_blocks()[block].text
    for printed, ours in DOCUMENTED.get(block, []):
        assert text.count(printed) == 1, f"block {block}: {printed!r} not unique"
        text = text.replace(printed, ours)
    return text
