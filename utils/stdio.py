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

Input from a file or a pipe (`InputLines`) is read as UTF-8 (a leading
BOM, as Notepad writes, is dropped), or in the encoding `PYTHONIOENCODING`
names where the reader set it; input that starts with the byte-order mark
of UTF-16 or UTF-32 (Notepad's "Unicode" is UTF-16 with one) is read in
that encoding. Bytes that are not text give one `InputEncodingError` line
naming the byte and the fix, before any answer; the fix names another
encoding only where the bytes read as text in it (no control characters),
so random bytes are not sent to cp1252, which decodes almost anything.
"""

from __future__ import annotations

import codecs
import io
import locale
import re
import sys
from typing import Any, BinaryIO

from utils import settings

__all__ = [
    "InputEncodingError",
    "InputLines",
    "check_input_file",
    "decode_input",
    "input_encoding",
    "utf8_streams",
    "wide_encoding",
]

_CHECK_LIMIT = 64 << 20  # bytes of a redirected file checked up front
# Encodings a non-UTF-8 input is tried in for the hint (GBK: Chinese Windows,
# cp1252: Western Windows); the locale's own comes first.
_GUESSES = ("gbk", "cp1252")
# What text has no business holding: control characters other than tab,
# line breaks and form feed (random bytes read in cp1252 are full of them)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
# Byte-order marks of the wide encodings (UTF-32 LE's begins as UTF-16 LE's)
_WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_WIDE = ("utf-16", "utf-32")


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


def wide_encoding(head: bytes) -> str | None:
    """The wide encoding, "utf-16" or "utf-32", whose byte-order mark
    `head` (the first bytes of an input) is; None for any other start
    (UTF-8's own mark is dropped as UTF-8 is read)."""
    return next((name for bom, name in _WIDE_BOMS if head.startswith(bom)), None)


def _reads_as_text(data: bytes, name: str) -> bool:
    """Whether `data` decodes in `name` (a character cut at its end
    allowed) to text without control characters."""
    try:
        text = codecs.getincrementaldecoder(name)().decode(data, final=False)
    except (LookupError, UnicodeDecodeError):
        return False
    return _CONTROL.search(text) is None


def _guesses() -> list[str]:
    """The encodings tried for the hint: the locale's, then GBK, cp1252."""
    names = []
    for name in (locale.getpreferredencoding(False), *_GUESSES):
        try:
            name = codecs.lookup(name).name
        except LookupError:
            continue
        if name not in ("utf-8", "ascii", *names):
            names.append(name)
    return names


def _error(exc: UnicodeDecodeError, encoding: str, place: str) -> InputEncodingError:
    """One line: which byte is not text, where (`place`), and what to do;
    another encoding is named only where all of `exc.object` (the file
    checked, or the line) reads as text in it."""
    byte = exc.object[exc.start : exc.start + 1].hex()
    encoding = encoding.removesuffix("-sig")
    if encoding in _WIDE:  # its byte-order mark chose it
        name = encoding.upper()
        return InputEncodingError(
            f"standard input starts with the byte-order mark of {name} but is "
            f"not {name} text (byte 0x{byte} at {place}); save it again as UTF-8."
        )
    if encoding != "utf-8":  # only PYTHONIOENCODING asks for another
        return InputEncodingError(
            f"standard input is not {encoding} text, the encoding PYTHONIOENCODING "
            f"names (byte 0x{byte} at {place}); save it in that encoding, or "
            "unset PYTHONIOENCODING to read UTF-8."
        )
    tried = _guesses()
    guess = next((n for n in tried if _reads_as_text(bytes(exc.object), n)), None)
    if guess is None:
        return InputEncodingError(
            f"standard input is not UTF-8 (byte 0x{byte} at {place}), nor text in "
            f"{' or '.join(tried)}; give it a text file saved as UTF-8."
        )
    return InputEncodingError(
        f"standard input is not UTF-8 (byte 0x{byte} at {place}); save it as "
        f"UTF-8 or run with PYTHONIOENCODING={guess}."
    )


def decode_input(data: bytes) -> str:
    """`data` (a line of standard input) as text in `input_encoding()`;
    `InputEncodingError` in one line when it is not."""
    encoding = input_encoding()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise _error(exc, encoding, f"position {exc.start} of a line") from None


def check_input_file(stream: BinaryIO | None, encoding: str | None = None) -> None:
    """Where standard input is a regular file, read it (up to 64 MiB) and
    go back, raising `InputEncodingError` if it is not text in `encoding`
    (default `input_encoding()`): a file in another encoding stops the
    command before any answer, not at its first bad line. A pipe is read
    line by line."""
    try:
        if stream is None or not stream.seekable():
            return
        start = stream.tell()
        data = stream.read(_CHECK_LIMIT)
        stream.seek(start)
    except (AttributeError, OSError, ValueError):
        return  # no real file behind it
    encoding = encoding or input_encoding()
    try:  # a character cut by the limit: its line is checked as it is read
        codecs.getincrementaldecoder(encoding)().decode(
            data, final=len(data) < _CHECK_LIMIT
        )
    except UnicodeDecodeError as exc:
        if encoding in _WIDE:  # its lines are not counted in bytes
            raise _error(exc, encoding, f"byte {exc.start}") from None
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1)
        raise _error(exc, encoding, f"line {line}, position {column}") from None


def _head(stream: BinaryIO) -> bytes:
    """The first bytes waiting in `stream`, left there to be read."""
    peek = getattr(stream, "peek", None)
    try:
        return peek(4)[:4] if peek is not None else b""
    except (OSError, ValueError):
        return b""


class InputLines:
    """Standard input that is a file or a pipe, a line at a time as text.

    Read in `input_encoding()`, or in UTF-16 or UTF-32 where the input
    starts with their byte-order mark. A regular file is checked whole
    before its first line (`check_input_file`); bytes that are not text
    raise `InputEncodingError`. A stream that is already text (no bytes
    under it) is read as it is."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self._raw: BinaryIO | None = getattr(stream, "buffer", None)
        self._wide: io.TextIOWrapper | None = None
        self._started = False
        self._read = 0  # lines read so far

    def readline(self) -> str | None:
        """The next line without its line ending; None at the end."""
        if self._raw is None:
            line = self.stream.readline()
        else:
            if not self._started:
                self._start(self._raw)
            line = self._next(self._raw)
        self._read += 1
        return None if line == "" else line.rstrip("\r\n")

    def _start(self, raw: BinaryIO) -> None:
        self._started = True
        wide = wide_encoding(_head(raw))
        check_input_file(raw, wide)
        if wide is not None:  # lines end at "\n" only, as in the bytes' case
            self._wide = io.TextIOWrapper(raw, encoding=wide, newline="\n")

    def _next(self, raw: BinaryIO) -> str:
        if self._wide is None:
            return decode_input(raw.readline())
        try:
            return self._wide.readline()
        except UnicodeDecodeError as exc:
            where = f"line {self._read + 1}"
            raise _error(exc, self._wide.encoding, where) from None
