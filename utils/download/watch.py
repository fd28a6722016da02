"""Bounded HTTP transfers for `utils.download`: the stall watchdog, rate
limits, the watched `requests` session and the progress bars.

Why this exists: no per-read timeout of `requests` or `httpx` bounds a whole
transfer. A source that sends a byte a second (slow-loris) keeps every read
timeout happy, so a watchdog thread judges the rate over a window and shuts
the connection when it is too low (`StallWatch`). The sessions and progress
bars here feed that watch with what actually arrives. A server that asks to
wait (`Retry-After`) is read by `retry_after`; `wait_text` says when to try
again in the reader's local time.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from utils.download.provenance import IntegrityError
from utils.log import get_logger

__all__ = [
    "MAX_RESTARTS",
    "SourceGaveUp",
    "StallWatch",
    "body",
    "new_watch",
    "progress_class",
    "retry_after",
    "shutdown",
    "size_str",
    "wait_text",
    "watched_session",
]

log = get_logger("utils.download")  # one name for the package's lines

CHUNK = 1 << 16  # small reads: a dropped connection loses at most this much
MAX_RESTARTS = 3  # restarts from byte 0 (server ignores Range) end a source
_STALL_WINDOW = 30.0  # seconds over which a source must send ...
_STALL_MIN_BYTES = 32 * 1024  # ... at least this much (else: next source)
_MAX_WAIT_SHOWN = 30 * 86400.0  # beyond this, "try again after" says no time


class SourceGaveUp(OSError):
    """A source was abandoned: too slow, or it asks to wait too long."""


def size_str(n: float) -> str:
    """A byte count for people: "812 B", "3.4 kB", "1.4 MB"."""
    if n >= 1e5:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.1f} kB" if n >= 1e3 else f"{n:.0f} B"


# --------------------------------------------------------------------------
# The stall watchdog
# --------------------------------------------------------------------------


class StallWatch:
    """Fails a transfer that brings fewer than `min_bytes` in any `window`
    seconds: a watchdog thread runs the registered closers (which shut the
    connection, waking the blocked read) and every later `check()` raises
    `SourceGaveUp` with the rate seen. `pause(s)` exempts an announced wait."""

    def __init__(self, window: float, min_bytes: int) -> None:
        self.window, self.min_bytes = window, min_bytes
        self.verdict: str | None = None
        self._events: deque[tuple[float, int]] = deque()
        self._since = time.monotonic()
        self._closers: list[Callable[[], object]] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StallWatch:
        self._since = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._done.set()
        self._thread.join()
        if self.verdict is not None and isinstance(exc, Exception):
            raise SourceGaveUp(self.verdict) from None

    def count(self, n: float) -> None:
        """`n` bytes arrived (negative: the client rewound; ignored)."""
        if n > 0:
            with self._lock:
                self._events.append((time.monotonic(), int(n)))

    def pause(self, seconds: float) -> None:
        """A wait the source announced: the window starts again after it."""
        with self._lock:
            self._since = max(self._since, time.monotonic() + seconds)
            self._events.clear()

    def on_trip(self, closer: Callable[[], object]) -> None:
        """Run `closer` when the watch trips (at once if it already has)."""
        with self._lock:
            self._closers.append(closer)
        if self.verdict is not None:
            _quietly(closer)

    def check(self) -> None:
        """Raise `SourceGaveUp` if the watch has tripped."""
        if self.verdict is not None:
            raise SourceGaveUp(self.verdict)

    def _judge(self) -> str | None:
        now = time.monotonic()
        with self._lock:
            if now - self._since < self.window:
                return None
            while self._events and self._events[0][0] < now - self.window:
                self._events.popleft()
            got = sum(n for _, n in self._events)
        if got >= self.min_bytes:
            return None
        return (
            f"too slow: {size_str(got)} in the last {self.window:g} s "
            f"({size_str(got / self.window)}/s; the least accepted is "
            f"{size_str(self.min_bytes)} per {self.window:g} s)"
        )

    def _run(self) -> None:
        while not self._done.wait(min(0.5, self.window / 4)):
            verdict = self._judge()
            if verdict is not None:
                self.verdict = verdict
                with self._lock:
                    closers = list(self._closers)
                for closer in closers:
                    _quietly(closer)
                return


def _quietly(closer: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        closer()


def shutdown(sock: socket.socket | None) -> None:
    """Wake a read blocked on `sock` in another thread (close alone does not)."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def new_watch(timeout: float) -> StallWatch:
    """The watch for one source: a reader who allows more seconds of silence
    (`timeout`) gets a longer window too."""
    return StallWatch(max(_STALL_WINDOW, 2 * timeout), _STALL_MIN_BYTES)


# --------------------------------------------------------------------------
# Rate limits
# --------------------------------------------------------------------------


def retry_after(headers: Any) -> float | None:
    """Seconds a 429/503 asks to wait (Retry-After, or RateLimit with none
    remaining), if it says."""
    value = (headers.get("retry-after") or "").strip()
    if value.isdigit():
        return float(value)
    if value:
        from email.utils import parsedate_to_datetime

        with contextlib.suppress(TypeError, ValueError, OverflowError):
            return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    with contextlib.suppress(ImportError):
        from huggingface_hub.utils import parse_ratelimit_headers

        info = parse_ratelimit_headers(headers)
        if info is not None and info.remaining == 0:
            return float(info.reset_in_seconds)
    return None


def wait_text(wait: float) -> str:
    """ "asks to wait N s; try again after HH:MM (local time)"; without the
    time of day for a wait of more than a month (or one past the calendar)."""
    if not wait <= _MAX_WAIT_SHOWN:
        return f"asks to wait {wait:.0f} s; try again much later"
    when = time.strftime("%H:%M", time.localtime(time.time() + wait))
    return f"asks to wait {wait:.0f} s; try again after {when} (local time)"


# --------------------------------------------------------------------------
# A requests session the watch can interrupt
# --------------------------------------------------------------------------


def watched_session(watch: StallWatch) -> Any:
    """A requests session whose connections register their socket with
    `watch`, so a stall shuts them even while headers trickle in."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    def watched(pool_cls: type) -> type:
        class Connection(pool_cls.ConnectionCls):  # type: ignore[name-defined]
            def connect(self) -> None:
                super().connect()
                sock = self.sock
                watch.on_trip(lambda: shutdown(sock))

        return type(pool_cls.__name__, (pool_cls,), {"ConnectionCls": Connection})

    pools = {"http": watched(HTTPConnectionPool), "https": watched(HTTPSConnectionPool)}

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
            manager = super().proxy_manager_for(proxy, **kwargs)
            if type(manager).__name__ == "ProxyManager":  # not SOCKS
                manager.pool_classes_by_scheme = pools
            return manager

    session = requests.Session()
    for prefix in ("http://", "https://"):
        session.mount(prefix, Adapter())
    return session


def body(response: Any) -> Iterator[bytes]:
    """The body as it arrives (each network read), so the watch sees it."""
    read1 = getattr(response.raw, "read1", None)
    if read1 is None:  # urllib3 1.x
        yield from response.iter_content(CHUNK)
        return
    while chunk := read1(CHUNK, decode_content=True):
        yield chunk


# --------------------------------------------------------------------------
# Progress bars
# --------------------------------------------------------------------------


def progress_class(
    watch: StallWatch | None, name: str | None = None, expected: int | None = None
) -> type:
    """A huggingface_hub progress bar class (so the library's switches that
    turn bars off still apply) that feeds `watch` and, when its stream is not
    a terminal (a log file, CI), logs one line when it starts and one when it
    ends instead of a bar redrawn with carriage returns (naming the file
    `name`). In Jupyter the usual widget stays.

    It also ends two transfers the library would repeat for a long time:
    an answer whose length is not the file's size `expected` (a CDN with a
    wrong Content-Length: every try ends short or long), and a server that
    ignores HTTP Range and keeps dropping the connection (the library
    restarts from byte 0 for as long as some bytes arrive each time)."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    class Progress(hub_tqdm):
        restarts = 0
        _lines = False  # until __init__ sets it (tqdm's __del__ may run first)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            total = kwargs.get("total")
            _check_announced(total, expected)
            _set_up_lines(self, kwargs, name)
            super().__init__(*args, **kwargs)
            if self._lines:
                self._say(f"downloading {size_str(total)}" if total else "downloading")

        def _say(self, text: str) -> None:
            log.info(f"{self._label}: {text}")

        def update(self, n: float | None = 1) -> bool | None:
            if n is not None and n < 0:  # the library rewinds: a restart
                _count_restart(self)
            if n is not None:
                self._count += int(n)
                if watch is not None:
                    watch.count(n)
            return super().update(n)

        def reset(self, total: float | None = None) -> None:
            self._count = 0
            super().reset(total)

        def close(self) -> None:
            if self._lines and not self._ended:
                self._ended = True
                secs = time.monotonic() - self._started
                self._say(_summary(self._count, self.total or 0, secs))
            super().close()

    return Progress


def _set_up_lines(bar: Any, kwargs: dict[str, Any], name: str | None) -> None:
    """Before tqdm's own __init__: where `bar` would draw on something that
    is not a terminal (and is not switched off), it logs lines instead and
    tqdm draws nothing; its count, clock and label for those lines."""
    from huggingface_hub.utils import are_progress_bars_disabled

    off = kwargs.get("disable") is True or are_progress_bars_disabled(
        kwargs.get("name")
    )
    bar._lines = not off and _plain_stream(kwargs.get("file"), type(bar))
    if bar._lines:
        kwargs["disable"] = True
    bar._count = int(kwargs.get("initial") or 0)
    bar._started = time.monotonic()
    bar._ended = False
    bar._label = name or kwargs.get("desc") or "download"


def _count_restart(bar: Any) -> None:
    """One more restart from byte 0; `MAX_RESTARTS` end the transfer."""
    bar.restarts += 1
    if bar.restarts >= MAX_RESTARTS:
        raise IntegrityError(
            f"the server ignores HTTP Range and dropped the "
            f"connection {bar.restarts + 1} times; gave up"
        )


def _check_announced(total: int | None, expected: int | None) -> None:
    """Raise `IntegrityError` when an answer's length is not the size of
    the file it should be."""
    if expected is not None and total is not None and total != expected:
        raise IntegrityError(
            f"the download server announced {total:,} bytes (Content-Length) "
            f"for a file of {expected:,} bytes; its answer cannot be the file"
        )


def _summary(count: int, total: int, secs: float) -> str:
    """The line a finished (or stopped) transfer ends with."""
    if total and count >= total:
        rate = size_str(count / max(secs, 1e-3))
        return f"100% of {size_str(total)} in {secs:.1f} s ({rate}/s)"
    of = f" of {size_str(total)}" if total else ""
    return f"stopped at {size_str(count)}{of} after {secs:.1f} s"


def _plain_stream(file: Any, cls: type) -> bool:
    """True when bars would go to something that is not a terminal and not
    a Jupyter output (where tqdm shows a widget)."""
    if any(c.__module__.startswith("tqdm.notebook") for c in cls.__mro__):
        return False
    import sys

    stream = file if file is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    try:
        return not (callable(isatty) and isatty())
    except (OSError, ValueError):
        return True
