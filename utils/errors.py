"""One error style for the commands (qwen3-generate, qwen3-chat, the
benchmark, import-qwen3) and one-line error text for widgets and fallbacks.

A reader who mistypes an option or points at a damaged file should see one
line that says what to do, never a traceback: `CommandParser` reports usage
errors as ``prog: error: ... (see --help)``, `run_command` turns a
`UsageError` into ``prog: error: ...`` with exit status 2 and any other
failure into the same shape with status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

STANDIN_HELP = (
    "Offline (no internet, no model files): set QWEN3_STANDIN=1 to run on "
    "stand-ins (the real tokenizer and RANDOM weights of the real shape: "
    "real speed and memory, gibberish text)."
)


class UsageError(Exception):
    """A problem the user can fix (bad option, missing or damaged file,
    failed download); printed as one line, exit status 2."""


def first_line(
    exc: BaseException, limit: int | None = None, text: str | None = None
) -> str:
    """``"TypeName: first non-empty line of the message"``, or just the type
    name for an empty message; cut to `limit` characters (ending in "...").
    `text` stands in for the message (a cleaned-up form of it)."""
    message = str(exc) if text is None else text
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    return text


class CommandParser(argparse.ArgumentParser):
    """argparse with the commands' shared conventions: a usage error is one
    line and exit status 2; defaults are shown in --help; the epilog says
    how to try the command offline."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        kwargs.setdefault("epilog", STANDIN_HELP)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def run_command(prog: str, body: Callable[[], int]) -> int:
    """Run a command's body and return its exit status: 2 after one line
    for a `UsageError`, 130 on Ctrl-C, 1 after one line for anything else."""
    try:
        return body()
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - last resort: still no traceback
        print(f"{prog}: error: {first_line(exc)}", file=sys.stderr)
        return 1
