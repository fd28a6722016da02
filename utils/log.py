"""One way for library code to speak: the `utils` logger, to stderr.

Why: stdout belongs to the reader's answer (`qwen3-generate ... > answer.txt`
must hold the generated text and nothing else), so every diagnostic,
progress line and banner from `utils/` goes through `logging` to stderr, in
one format: `utils.<module>: <message>`. A module gets its logger with
`get_logger(__name__)`; a reader who wants them quiet sets
`logging.getLogger("utils").setLevel(logging.WARNING)`.

The handler looks up `sys.stderr` each time it writes, so a notebook, a
redirected stream or pytest's capture sees the lines where they are now.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["ROOT", "get_logger"]

ROOT = "utils"
_FORMAT = "%(name)s: %(message)s"


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler whose stream is always the current `sys.stderr`."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: D401 - the current stderr
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it
        pass


def _root() -> logging.Logger:
    root = logging.getLogger(ROOT)
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(handler)
        if root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
        root.propagate = False  # not twice where the reader configured logging
    return root


def get_logger(name: str) -> logging.Logger:
    """The logger for module `name` (`__name__`: under `utils`), with the
    project's stderr handler set up on first use (not at import)."""
    _root()
    if name != ROOT and not name.startswith(ROOT + "."):
        name = f"{ROOT}.{name}"
    return logging.getLogger(name)
