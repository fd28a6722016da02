"""The book's Chapter 2 code and printed output, read from tests/data.

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
