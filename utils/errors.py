"""One error style for the commands (qwen3-generate, qwen3-chat, the
benchmark, import-qwen3) and one-line error text for widgets and fallbacks.

A reader who mistypes an option or points at a damaged file should see one
line that says what to do, never a traceback: `CommandParser` reports usage
errors as ``prog: error: ... (see --help)`` (an unknown option first, with
the nearest known one), `run_command` turns a `UsageError` into
``prog: error: ...`` with exit status 2 and any other failure into the same
shape with status 1. A reader of the output who stops early (``| head``)
ends the command quietly, as a Unix tool does; an output the disk refuses
is one line (`write_stdout`). Ctrl-C is status 130 after one line;
`ctrl_c_held` keeps it from landing inside work that must not stop half-way.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import inspect
import os
import re
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

STANDIN_HELP = (
    "Offline (no internet, no model files): set QWEN3_STANDIN=1 to run on "
    "stand-ins (the real tokenizer and RANDOM weights of the real shape: "
    "real speed and memory, gibberish text)."
)

# What a shell reports for a process that SIGPIPE ended (128 + 13): the
# status `yes | head -1` gives its first command under `set -o pipefail`.
BROKEN_PIPE_STATUS = 141
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # as argparse reads one


class UsageError(Exception):
    """A problem the user can fix (bad option, missing or damaged file,
    failed download); printed as one line, exit status 2."""


class OutputError(UsageError):
    """Standard output refused the command's output (a full disk, a
    read-only file): one line naming where it goes, exit status 2; stdout
    is then silenced, so the interpreter's last flush adds nothing."""


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


def utf8_text(text: str) -> str:
    """argparse `type` for free text (a prompt): refuse an argument whose
    bytes were not UTF-8 (Python keeps them as lone surrogates), naming the
    first bad byte, instead of failing later inside the tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = text.encode("utf-8", "surrogateescape")
        start = len(text[: exc.start].encode("utf-8", "surrogateescape"))
        raise argparse.ArgumentTypeError(
            f"not UTF-8 text (byte {raw[start : start + 1]!r} at byte {start}); "
            "set the terminal or locale to UTF-8 (e.g. LANG=C.UTF-8) and pass "
            "the text again"
        ) from None
    return text


def require_streams(*names: str) -> None:
    """Raise `UsageError` naming the first of `names` ("stdin", "stdout")
    that the command was started without (``>&-``, ``<&-``): Python then
    has no stream object for it."""
    roles = {"stdin": "reads its input from", "stdout": "writes its output to"}
    examples = {"stdin": "< messages.txt", "stdout": "> answer.txt"}
    for name in names:
        if getattr(sys, name) is None:
            raise UsageError(
                f"{name} is closed; this command {roles[name]} {name}: start "
                f"it with {name} open (a terminal, a pipe or a file, e.g. "
                f"{examples[name]})."
            )


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows `(default: ...)` only where there is a default to show: not for
    required options, nor for options whose default is None."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default is None:
            return action.help
        return super()._get_help_string(action)


class CommandParser(argparse.ArgumentParser):
    """argparse with the commands' shared conventions: a usage error is one
    line and exit status 2; an unknown option is named first (before a
    missing required one), with the nearest known option; options are
    spelled out (no abbreviations); real defaults are shown in --help; the
    epilog says how to try the command offline."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("epilog", STANDIN_HELP)
        kwargs.setdefault("allow_abbrev", False)
        if "suggest_on_error" in inspect.signature(super().__init__).parameters:
            kwargs.setdefault("suggest_on_error", True)  # Python 3.14+: choices
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        unknown = self._unknown_options(argv)
        if unknown:
            self.error(f"unrecognized arguments: {unknown}")
        return super().parse_known_args(argv, namespace)

    def _unknown_options(self, argv: list[str]) -> str | None:
        """The first token of `argv` that looks like an option this parser
        does not have (up to a `--` or a subcommand), with a suggestion."""
        commands = {
            name
            for action in self._actions
            if isinstance(action, argparse._SubParsersAction)
            for name in action.choices
        }
        known = list(self._option_string_actions)
        for token in argv:
            if token == "--" or token in commands:
                return None
            name = token.split("=", 1)[0]
            if not self._looks_unknown(token, name):
                continue
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            return f"{token} (did you mean {close[0]}?)" if close else token
        return None

    def _looks_unknown(self, token: str, name: str) -> bool:
        """Whether argparse would read `token` as an option it lacks."""
        if len(token) < 2 or token[0] not in self.prefix_chars or " " in token:
            return False
        if name in self._option_string_actions:
            return False
        if _NEGATIVE_NUMBER.match(token):
            return False  # a negative number is a value
        if token[1] not in self.prefix_chars:  # -X...: a short option + value
            return token[:2] not in self._option_string_actions
        return not (
            self.allow_abbrev
            and any(o.startswith(name) for o in self._option_string_actions)
        )


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Hold Ctrl-C while the block runs; raise its KeyboardInterrupt once
    the block is done. For work that must not stop half-way (a build that
    empties the model it reads, which is kept only once whole) and for
    torch's import, whose C++ half may abort the process or swallow an
    interrupt raised inside it. Off the main thread, or where SIGINT is not
    Python's default handler (ignored, or someone else's), it changes
    nothing."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    heard: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: heard.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if heard:
        raise KeyboardInterrupt


def write_stdout(text: str) -> None:
    """A command's answer text to stdout, now. A refusal other than a
    reader gone (a full disk, a read-only file) is an `OutputError` naming
    where stdout goes, not an OSError with a temporary name."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise OutputError(
            f"could not write the answer to standard output ({_stdout_file()}{why}): "
            "send it to a file you can write, on a disk with free space "
            "(> answer.txt), or to the terminal"
        ) from None


def _stdout_file() -> str:
    """The file stdout goes to and ": " where Linux tells (/proc), else
    nothing."""
    try:
        target = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
    except (AttributeError, OSError, ValueError):
        return ""
    return f"{target}: " if target.startswith("/") else ""


def _stdout_reader_gone() -> bool:
    """Whether the BrokenPipeError came from stdout: its pipe has no reader
    left (poll says POLLERR on Linux, POLLHUP on the BSDs and macOS). True
    where that cannot be asked (no poll, no real stdout), since stdout is
    where the commands write most."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (AttributeError, OSError, ValueError):
        return True
    gone = select.POLLERR | select.POLLHUP
    return any(events & gone for _, events in poller.poll(0))


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's last flush of a pipe
    the reader closed says nothing (the recipe in Python's `signal` docs)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no real stdout here
        pass


def run_command(prog: str, body: Callable[[], int]) -> int:
    """Run a command's body and return its exit status: 2 after one line
    for a `UsageError`, 130 on Ctrl-C, 141 and no word when the reader of
    stdout went away (``| head``), 1 after one line for anything else."""
    try:
        return body()
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        if isinstance(exc, OutputError):
            _silence_stdout()
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:
        if not _stdout_reader_gone():
            print(f"{prog}: error: {first_line(exc)}", file=sys.stderr)
            return 1
        _silence_stdout()
        return BROKEN_PIPE_STATUS
    except Exception as exc:  # noqa: BLE001 - last resort: still no traceback
        print(f"{prog}: error: {first_line(exc)}", file=sys.stderr)
        return 1
