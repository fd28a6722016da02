"""The commands' standard streams: UTF-8 out, so no answer is lost to a
code page; text in read as UTF-8 (or the encoding the reader names).

Why: Python writes redirected output in the locale's code page (cp936/GBK
on a Chinese Windows, cp1252 on a Western one), so
`qwen3-generate ... > answer.txt` failed at the first character that code
page lacks and the file stayed empty. Modern command-line tools write
UTF-8 to files and pipes whatever the locale (a Windows console takes
Unicode anyway), and so do ours: `utf8_streams`, called by each command's
entry point (never at import), makes stdout and stderr UTF-8 where they
are not a terminal, and lets a terminal show what its encoding cannot as
`?` instead of failing.

Input from a file or a pipe is read as UTF-8 (a leading BOM, as Notepad
writes, is dropped), or in the encoding `PYTHONIOENCODING` names where the
reader set it; bytes that are not text in that encoding give one
`InputEncodingError` line naming the byte and the fix, before any answer.
"""

from __future__ import annotations

import codecs
import locale
import sys
from typing import Any, BinaryIO

from utils import settings

__all__ = [
    "InputEncodingError",
    "check_input_file",
    "decode_input",
    "input_encoding",
    "utf8_streams",
]

_CHECK_LIMIT = 64 << 20  # bytes of a redirected file checked up front
# Encodings a non-UTF-8 input is tried in for the hint (GBK: Chinese Windows,
# cp1252: Western Windows); the locale's own comes first.
_GUESSES = ("gbk", "cp1252")


class InputEncodingError(ValueError):
    """Input bytes that are not text in the encoding they are read in."""


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def utf8_streams() -> None:
    """Make stdout and stderr unable to fail on a character: UTF-8 where
    they go to a file or a pipe, the terminal's encoding with `?` for what
    it cannot show where they are a terminal. Streams without
    `reconfigure` (a notebook's) or closed ones are left as they are."""
    for stream, errors in ((sys.stdout, "replace"), (sys.stderr, "backslashreplace")):
        if stream is None or not hasattr(stream, "reconfigure"):
            continue
        try:
            if _is_terminal(stream):
                stream.reconfigure(errors=errors)
            else:
                stream.reconfigure(encoding="utf-8", errors=errors)
        except (ValueError, OSError):  # closed, or not reconfigurable now
            continue


def _named_encoding() -> str | None:
    """The encoding `PYTHONIOENCODING` names (`gbk`, `gbk:strict`), if any."""
    value = settings.text("PYTHONIOENCODING")
    name = (value or "").split(":", 1)[0].strip()
    return name or None


def input_encoding() -> str:
    """What standard input is read in: `PYTHONIOENCODING`'s encoding where
    the reader set one, else UTF-8 (Notepad's BOM allowed)."""
    named = _named_encoding()
    if named is not None:
        try:
            name = codecs.lookup(named).name
        except LookupError:
            name = "utf-8"  # Python itself refuses to start with an unknown one
        if name != "utf-8":
            return name
    return "utf-8-sig"


def _guess(data: bytes) -> str | None:
    """The first likely encoding that reads `data` (the locale's, then GBK,
    then cp1252), for the hint; None if none does."""
    names = [locale.getpreferredencoding(False), *_GUESSES]
    for name in names:
        try:
            if codecs.lookup(name).name in ("utf-8", "ascii"):
                continue
            data.decode(name)
        except (LookupError, UnicodeDecodeError):
            continue
        return codecs.lookup(name).name
    return None


def _error(exc: UnicodeDecodeError, encoding: str, place: str) -> InputEncodingError:
    """One line: which byte is not text, where (`place`), and what to do."""
    byte = exc.object[exc.start : exc.start + 1].hex()
    encoding = encoding.removesuffix("-sig")
    if encoding != "utf-8":  # only PYTHONIOENCODING asks for another
        return InputEncodingError(
            f"standard input is not {encoding} text, the encoding PYTHONIOENCODING "
            f"names (byte 0x{byte} at {place}); save it in that encoding, or "
            "unset PYTHONIOENCODING to read UTF-8."
        )
    line_start = exc.object.rfind(b"\n", 0, exc.start) + 1
    line_end = exc.object.find(b"\n", exc.start)
    guess = _guess(bytes(exc.object[line_start : None if line_end < 0 else line_end]))
    also = f" or run with PYTHONIOENCODING={guess}" if guess else ""
    return InputEncodingError(
        f"standard input is not UTF-8 (byte 0x{byte} at {place}); save it as "
        f"UTF-8{also}."
    )


def decode_input(data: bytes) -> str:
    """`data` (a line of standard input) as text in `input_encoding()`;
    `InputEncodingError` in one line when it is not."""
    encoding = input_encoding()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise _error(exc, encoding, f"position {exc.start} of a line") from None


def check_input_file(stream: BinaryIO | None) -> None:
    """Where standard input is a regular file, read it (up to 64 MiB) and
    go back, raising `InputEncodingError` if it is not text: a file in
    another encoding stops the command before the model loads and before
    any answer, not at its first bad line. A pipe is read line by line."""
    try:
        if stream is None or not stream.seekable():
            return
        start = stream.tell()
        data = stream.read(_CHECK_LIMIT)
        stream.seek(start)
    except (AttributeError, OSError, ValueError):
        return  # no real file behind it
    encoding = input_encoding()
    try:
        data.decode(encoding)
    except UnicodeDecodeError as exc:
        if exc.end == len(data) == _CHECK_LIMIT:
            return  # a character cut by the limit: its line is checked later
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1)
        raise _error(exc, encoding, f"line {line}, position {column}") from None
