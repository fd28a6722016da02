"""Get the book's Qwen3 0.6B files: tokenizer JSON and `.pth` weights.

`download_qwen3_small` tries two sources, file by file:

1. the Hugging Face repo `rasbt/qwen3-from-scratch` through `huggingface_hub`
   (`HF_ENDPOINT`, `HF_HUB_DISABLE_XET` and `QWEN3_DOWNLOAD_TIMEOUT` are
   applied at call time, so a mirror set in a running notebook works). The
   library resumes a dropped connection within a call but discards a partial
   file, so across runs only a finished file (kept in `.<name>.hub/` until
   installed) is reused;
2. the book's backup mirror on Backblaze B2, over plain HTTPS with `requests`,
   resuming an interrupted download from `<name>.part` with HTTP Range.

A file only appears under its final name once it is complete, matches the
size and hash its source announced (where it announces one) and passes the
content checks of `utils.provenance`, which also writes the verification
record that lets later calls skip the network. Then its leftovers (`.part`,
staging folder) go.

Every wait is bounded: `QWEN3_DOWNLOAD_TIMEOUT` seconds of silence fail a try
(default 10); retries back off and end after a few tries without new bytes; a
source that sends less than `_STALL_MIN_BYTES` in `_STALL_WINDOW` seconds
(slow-loris: a byte a second keeps every per-read timeout happy) is dropped
for the next one; a rate limit asking to wait more than `_MAX_RATE_WAIT`
seconds ends the source with a line that says when to try again. The stall
rule needs a watchdog thread that closes the connection, since no per-read
timeout of `requests` or `httpx` bounds a whole transfer; this module has
that code because neither library offers it.

A lock file (`.download.lock`) lets two processes share one folder; a failed
download leaves nothing a later run cannot use (no empty folder, no lock
file). With `QWEN3_STANDIN=1` no request is made: offline stand-ins are
provided in a separate folder (see `utils.standin`), never in `out_dir`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from utils import provenance, standin
from utils.fileio import atomic_move, temp_name_pattern
from utils.provenance import IntegrityError, is_verified

REPO_ID = "rasbt/qwen3-from-scratch"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
BACKUP_URL = "https://f001.backblazeb2.com/file/reasoning-from-scratch/qwen3-0.6B"
BACKUP_URL_ENV = "QWEN3_BACKUP_URL"
TIMEOUT_ENV = "QWEN3_DOWNLOAD_TIMEOUT"
KINDS = ("base", "reasoning")
LOCK_NAME = ".download.lock"

_CHUNK = 1 << 16  # small reads: a dropped connection loses at most this much
_HUB_CHUNK = 1 << 16  # the Hub client's read size (its own: 10 MB)
_DEFAULT_TIMEOUT = 10.0  # seconds of silence before a try fails
_MAX_STALLS = 3  # tries in a row that bring no new bytes end a source
_MAX_REQUESTS = 60  # hard cap on GETs for one file from one source
_BACKOFF = 1.0  # first pause between tries in seconds; doubles, up to 30 s
_STALL_WINDOW = 30.0  # seconds over which a source must send ...
_STALL_MIN_BYTES = 32 * 1024  # ... at least this much (else: next source)
_MAX_RATE_WAIT = 60.0  # seconds of "Retry-After" the download accepts in all
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Qwen3Files:
    """Paths of the files `download_qwen3_small` provided."""

    tokenizer: Path
    model: Path | None
    standin: bool

    def __iter__(self) -> Iterator[Path]:
        """The files that exist: the tokenizer, then the weights if fetched."""
        yield self.tokenizer
        if self.model is not None:
            yield self.model


def local_files(
    model: str | os.PathLike, tokenizer: str | os.PathLike | None
) -> tuple[Path, Path | None, bool]:
    """(model, tokenizer, standin) for files the reader names explicitly (the
    CLI's --model-file, the benchmark's --model-path): checks they exist and
    prints the stand-in banner when the weights are a stand-in (sidecar or the
    mark inside the checkpoint). Raises FileNotFoundError naming the path."""
    paths = [Path(model)] + ([] if tokenizer is None else [Path(tokenizer)])
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"file not found: {path}")
    is_standin = provenance.is_standin(paths[0])
    if is_standin:
        provenance.print_standin_banner()
    return paths[0], (paths[1] if tokenizer is not None else None), is_standin


def _hints(out_dir: str | os.PathLike, kind: str) -> str:
    official = "Qwen3-0.6B-Base" if kind == "base" else "Qwen3-0.6B"
    also = (
        "\n    Notebook 01 also loads the reasoning tokenizer: import Qwen3-0.6B the"
        "\n    same way, with --kind reasoning."
        if kind == "base"
        else ""
    )
    command = (
        "uv run python -m utils.hf_interop import-qwen3 FOLDER "
        f"--kind {kind} --out-dir {Path(out_dir).absolute()}"
    )
    return f"""\
What you can try:
  * Behind a proxy: set HTTPS_PROXY / HTTP_PROXY. If your network inspects TLS
    (company certificate), point REQUESTS_CA_BUNDLE and SSL_CERT_FILE at a CA
    bundle that contains that certificate.
  * A source answered with a web page instead of the file: a captive portal or
    login page (hotel, campus, company Wi-Fi). Open any web page in a browser,
    log in, then run this again.
  * Hugging Face blocked or slow where you are (e.g. mainland China): set
    HF_ENDPOINT to a Hugging Face mirror, e.g. HF_ENDPOINT=https://hf-mirror.com,
    and HF_HUB_DISABLE_XET=1 (Xet transfers may bypass the mirror).
  * Slow network: allow more seconds of silence, e.g. QWEN3_DOWNLOAD_TIMEOUT=60
    (it applies to both sources).
  * The official checkpoints (Qwen/Qwen3-0.6B-Base, Qwen/Qwen3-0.6B) are also on
    ModelScope (modelscope.cn). Download the Qwen/{official} folder and
    convert it into the book's verified files (in the repository):
      {command}{also}
  * Offline testing only: QWEN3_STANDIN=1 writes stand-ins instead, i.e. the real
    tokenizer and RANDOM weights of the real shape (gibberish text, NOT the model)."""


class DownloadError(RuntimeError):
    """No source could deliver a file. `str()` is the whole message: each URL
    tried with what went wrong, then `hint` (what to try). Jupyter shows only
    this message, without a traceback (`_render_traceback_`)."""

    def __init__(
        self,
        name: str,
        attempts: list[tuple[str, str]],
        out_dir: str | os.PathLike = "qwen3",
    ) -> None:
        self.name = name
        self.attempts = list(attempts)
        self.hint = _hints(out_dir, "reasoning" if "reasoning" in name else "base")
        tried = "\n".join(f"  - {url}\n      {err}" for url, err in attempts)
        super().__init__(
            f"Could not download {name} from any source. Tried:\n{tried}\n{self.hint}"
        )

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback: the message itself."""
        return f"{type(self).__name__}: {self}".splitlines()


class SourceGaveUp(OSError):
    """A source was abandoned: too slow, or it asks to wait too long."""


def file_names(kind: str) -> tuple[str, str]:
    """The book's (tokenizer, weights) file names for `kind`."""
    if kind not in KINDS:
        raise ValueError(
            f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}"
        )
    return f"tokenizer-{kind}.json", f"qwen3-0.6B-{kind}.pth"


def download_qwen3_small(
    kind: str = "base",
    tokenizer_only: bool = False,
    out_dir: str | os.PathLike = "qwen3",
    *,
    backup_url: str | None = None,
) -> Qwen3Files:
    """Make the Qwen3 0.6B tokenizer (and weights) for `kind` available; use
    the returned paths.

    kind: "base" or "reasoning". Files in `out_dir` with a valid verification
    record are used without any network request. Otherwise the Hugging Face
    repo `rasbt/qwen3-from-scratch` is tried (at `HF_ENDPOINT` if set), then the
    book's backup mirror; `backup_url` (or env `QWEN3_BACKUP_URL`) replaces the
    mirror's base URL. With `QWEN3_STANDIN=1`, offline stand-ins are provided
    in `utils.standin.standin_files_dir()` instead (no network, `out_dir` is
    left alone, `standin=True`). Raises `DownloadError` if all sources fail.
    """
    tok_name, model_name = file_names(kind)
    names = [tok_name] if tokenizer_only else [tok_name, model_name]
    out = Path(out_dir)
    if standin.standin_enabled():
        paths = standin.provide_standins(out, kind, names)
        return Qwen3Files(paths[0], paths[1] if len(paths) > 1 else None, True)

    created = [p for p in (out, *out.parents) if not p.exists()]  # deepest first
    out.mkdir(parents=True, exist_ok=True)
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
    backup = (backup_url or os.environ.get(BACKUP_URL_ENV) or BACKUP_URL).rstrip("/")
    try:
        for name in names:
            _ensure_file(out, name, endpoint, backup)
    except BaseException as exc:
        for folder in created:  # only folders this call made, if left empty
            try:
                folder.rmdir()
            except OSError:
                break
        if isinstance(exc, DownloadError):  # the message says it all
            raise exc.with_traceback(None) from None
        raise
    return Qwen3Files(
        tokenizer=out / tok_name,
        model=None if tokenizer_only else out / model_name,
        standin=False,
    )


def download_timeout() -> float:
    """Seconds of silence after which one try fails (`QWEN3_DOWNLOAD_TIMEOUT`)."""
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        return float(value) if value and float(value) > 0 else _DEFAULT_TIMEOUT
    except ValueError:
        return _DEFAULT_TIMEOUT


# --------------------------------------------------------------------------
# One file: lock, sources, leftovers
# --------------------------------------------------------------------------


def install_file(staged: Path, dest: Path, source: str, check: str) -> None:
    """Check a file obtained another way (e.g. converted from the official
    checkpoints), move it to `dest` and record it as verified."""
    _install(staged, dest, source, check, provenance.hash_file(staged)["sha256"])


def _install(staged: Path, dest: Path, source: str, check: str, sha256: str) -> None:
    """Check the content of a downloaded file, then move it into place, drop
    any stand-in mark and write the record. Raises `IntegrityError` first if
    the content is not the book's file (nothing is installed then)."""
    content = provenance.check_content(staged, dest.name)
    provenance.record_path(dest).unlink(missing_ok=True)
    atomic_move(staged, dest)
    provenance.sidecar_path(dest).unlink(missing_ok=True)
    provenance.write_record(
        dest, {"sha256": sha256, "checked": check, "source": source, "content": content}
    )


def _leftovers(dest: Path) -> list[Path]:
    """What earlier tries left beside `dest`: `.part`, Hub staging, temp files."""
    found = [dest.with_name(dest.name + ".part"), dest.with_name(f".{dest.name}.hub")]
    return [p for p in found if p.exists()] + list(
        dest.parent.glob(temp_name_pattern(dest))
    )


def _remove_leftovers(dest: Path) -> None:
    for path in _leftovers(dest):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _size_str(n: float) -> str:
    if n >= 1e5:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.1f} kB" if n >= 1e3 else f"{n:.0f} B"


@contextlib.contextmanager
def _exclusive(out: Path, name: str) -> Iterator[None]:
    """Hold the folder's lock file `.download.lock` (waits, saying so once,
    while another process downloads into `out`). After a failure the lock
    file goes (filelock re-checks, after locking, that the file it locked is
    still the one at that path, so a process waiting on it tries again), and
    a folder removed meanwhile is made again."""
    from filelock import FileLock, Timeout

    said, races = False, 0
    while True:
        lock = FileLock(out / LOCK_NAME)
        try:
            out.mkdir(parents=True, exist_ok=True)
            lock.acquire(timeout=-1 if said else 0)
            break
        except Timeout:
            print(f"{out / name}: another process is downloading into {out}; waiting")
            said = True
        except (FileNotFoundError, FileExistsError):
            # A failed run removed the empty folder while we (or filelock's
            # poll loop, which makes the folder again) looked at it: pathlib's
            # mkdir(exist_ok=True) then says "exists" for a folder now gone.
            races += 1
            if races > 20 or (out.exists() and not out.is_dir()):
                raise
            time.sleep(0.01 * races)
    try:  # the held lock file keeps the folder from being removed
        yield
    except BaseException:
        (out / LOCK_NAME).unlink(missing_ok=True)
        raise
    finally:
        lock.release()


def _ensure_file(out: Path, name: str, endpoint: str, backup: str) -> None:
    dest = out / name
    verified = is_verified(dest)
    if verified and not _leftovers(dest):
        print(f"{dest}: already downloaded and verified")
        return
    with _exclusive(out, name):
        if is_verified(dest):  # already, or another process finished it
            _remove_leftovers(dest)
            print(
                f"{dest}: already downloaded and verified"
                if verified
                else f"{dest}: downloaded and verified by another process"
            )
            return
        for stale in out.glob(temp_name_pattern(dest)):  # never resumable
            stale.unlink(missing_ok=True)
        _download(dest, endpoint, backup)
        _remove_leftovers(dest)


def _download(dest: Path, endpoint: str, backup: str) -> None:
    name = dest.name
    timeout = download_timeout()
    hub_where = f"HF_ENDPOINT={endpoint}" if os.environ.get("HF_ENDPOINT") else endpoint
    sources: list[tuple[str, str, str, Callable[..., str]]] = [
        ("Hugging Face Hub", hub_where, f"{endpoint}/{REPO_ID}/resolve/main/{name}",
         _from_hub),
        ("backup mirror", urlsplit(backup).netloc or backup, f"{backup}/{name}",
         _from_backup),
    ]  # fmt: skip
    attempts: list[tuple[str, str]] = []
    for label, where, url, fetch in sources:
        if attempts:
            print(f"{name}: trying the {label} ({url})")
        try:
            check = fetch(url, dest, endpoint, timeout)
        except Exception as exc:  # noqa: BLE001 - each source's error is reported
            attempts.append((url, describe_error(exc, url, timeout)))
            print(f"{name}: {label} ({where}) failed: {attempts[-1][1]}")
            continue
        size = _size_str(dest.stat().st_size)
        print(f"Saved {dest} ({size}, {check}) from the {label}: {url}")
        return
    raise DownloadError(name, attempts, dest.parent)


# --------------------------------------------------------------------------
# What went wrong, in a few words
# --------------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and every exception it wraps (causes, contexts, `reason`s and
    exception arguments, as requests and urllib3 nest them), outermost first."""
    seen: list[BaseException] = []
    todo: list[Any] = [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None), *e.args]
    return seen


def _host(chain: list[BaseException], url: str) -> str:
    """The host an error was about: the request's, else the URL's."""
    for e in chain:
        with contextlib.suppress(Exception):  # httpx raises if no request
            return str(e.request.url.host)  # type: ignore[attr-defined]
        host = getattr(getattr(e, "conn", None), "host", None)
        if isinstance(host, str):
            return host
    return urlsplit(url).hostname or url


def _http_status(chain: list[BaseException], host: str) -> str | None:
    """ "HTTP 404 Not Found from <host>" for the first error that carries a
    response (with when to try again, if a 429/503 says)."""
    for e in chain:
        response = getattr(e, "response", None)
        code = getattr(response, "status_code", None)
        if isinstance(code, int):
            reason = getattr(response, "reason_phrase", None) or getattr(
                response, "reason", ""
            )
            text = f"HTTP {code} {reason or ''}".strip() + f" from {host}"
            wait = _retry_after(response.headers) if code in (429, 503) else None
            return text if wait is None else f"{text}; it {_wait_text(wait)}"
    return None


def describe_error(exc: BaseException, url: str, timeout: float) -> str:
    """The innermost cause of a failed try in a few words, e.g. "cannot
    resolve huggingface.co", "connection refused by 127.0.0.1:9", "timed out
    after 10 s", "HTTP 404 Not Found", or what a check found wrong."""
    chain = _chain(exc)
    for e in chain:  # our own errors already say it in one line
        if isinstance(e, (IntegrityError, SourceGaveUp)):
            return str(e)
    host = _host(chain, url)
    text = " ".join(str(e) for e in chain)
    errnos = {getattr(e, "errno", None) for e in chain}
    if errnos & {errno.ENOSPC, errno.EDQUOT}:
        return "no space left on the disk"
    if errno.EFBIG in errnos:
        return "file too large for this system's file size limit"
    if any(isinstance(e, socket.gaierror) for e in chain) or re.search(
        r"Name or service not known|nodename nor servname|getaddrinfo failed|"
        r"[Nn]ame resolution|NameResolution",
        text,
    ):
        return f"cannot resolve {host}"
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or (
        "Connection refused" in text or errno.ECONNREFUSED in errnos
    ):
        port = urlsplit(url).port
        return f"connection refused by {host}" + (f":{port}" if port else "")
    if any(isinstance(e, (TimeoutError, socket.timeout)) for e in chain) or any(
        "Timeout" in type(e).__name__ for e in chain
    ):
        return f"timed out after {timeout:g} s (no answer from {host})"
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        return f"the TLS certificate of {host} is not trusted (see the CA hint below)"
    status = _http_status(chain, host)
    if status:
        return status
    if any(isinstance(e, ConnectionResetError) for e in chain):
        return f"connection reset by {host}"
    inner = chain[-1] if chain else exc
    words = f"{type(inner).__name__}: {str(inner).strip()}".split()
    short = " ".join(words)
    return short if len(short) <= 120 else short[:117].rsplit(" ", 1)[0] + " ..."


# --------------------------------------------------------------------------
# Bounded transfers: the stall watchdog and the progress bars
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
        with self._lock:
            self._closers.append(closer)
        if self.verdict is not None:
            _quietly(closer)

    def check(self) -> None:
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
            f"too slow: {_size_str(got)} in the last {self.window:g} s "
            f"({_size_str(got / self.window)}/s; the least accepted is "
            f"{_size_str(self.min_bytes)} per {self.window:g} s)"
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


def _shutdown(sock: socket.socket | None) -> None:
    """Wake a read blocked on `sock` in another thread (close alone does not)."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _watch(timeout: float) -> StallWatch:
    # a reader who allows more seconds of silence gets a longer window too
    return StallWatch(max(_STALL_WINDOW, 2 * timeout), _STALL_MIN_BYTES)


def _progress_class(watch: StallWatch | None, name: str | None = None) -> type:
    """A huggingface_hub progress bar class (so the library's switches that
    turn bars off still apply) that feeds `watch`, ends a transfer whose
    server ignores HTTP Range and keeps dropping the connection (the library
    would restart from byte 0 for as long as some bytes arrive each time),
    and, when its stream is not a terminal (a log file, CI), prints one line
    when it starts and one when it ends instead of a bar redrawn with
    carriage returns (naming the file `name`). In Jupyter the usual widget
    stays."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from huggingface_hub.utils import tqdm as hub_tqdm

    class Progress(hub_tqdm):
        restarts = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            off = kwargs.get("disable") is True or are_progress_bars_disabled(
                kwargs.get("name")
            )
            self._lines = not off and _plain_stream(kwargs.get("file"), type(self))
            if self._lines:
                kwargs["disable"] = True
            self._count = int(kwargs.get("initial") or 0)
            self._started = time.monotonic()
            self._ended = False
            self._label = name or kwargs.get("desc") or "download"
            self._stream = kwargs.get("file") or sys.stderr
            super().__init__(*args, **kwargs)
            if self._lines:
                total = kwargs.get("total")
                self._say(f"downloading {_size_str(total)}" if total else "downloading")

        def _say(self, text: str) -> None:
            print(f"{self._label}: {text}", file=self._stream, flush=True)

        def update(self, n: float | None = 1) -> bool | None:
            if n is not None and n < 0:  # the library rewinds: a restart
                self.restarts += 1
                if self.restarts >= _MAX_STALLS:
                    raise IntegrityError(
                        f"the server ignores HTTP Range and dropped the "
                        f"connection {self.restarts + 1} times; gave up"
                    )
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
                total = self.total or 0
                if total and self._count >= total:
                    rate = _size_str(self._count / max(secs, 1e-3))
                    self._say(f"100% of {_size_str(total)} in {secs:.1f} s ({rate}/s)")
                else:
                    of = f" of {_size_str(total)}" if total else ""
                    self._say(
                        f"stopped at {_size_str(self._count)}{of} after {secs:.1f} s"
                    )
            super().close()

    return Progress


def _plain_stream(file: Any, cls: type) -> bool:
    """True when bars would go to something that is not a terminal and not
    a Jupyter output (where tqdm shows a widget)."""
    if any(c.__module__.startswith("tqdm.notebook") for c in cls.__mro__):
        return False
    stream = file if file is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    try:
        return not (callable(isatty) and isatty())
    except (OSError, ValueError):
        return True


# --------------------------------------------------------------------------
# Source 1: Hugging Face Hub
# --------------------------------------------------------------------------


def _retry_after(headers: Any) -> float | None:
    """Seconds a 429/503 asks to wait (Retry-After, or RateLimit with none
    remaining), if it says."""
    value = (headers.get("retry-after") or "").strip()
    if value.isdigit():
        return float(value)
    if value:
        from email.utils import parsedate_to_datetime

        with contextlib.suppress(TypeError, ValueError):
            return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    with contextlib.suppress(ImportError):
        from huggingface_hub.utils import parse_ratelimit_headers

        info = parse_ratelimit_headers(headers)
        if info is not None and info.remaining == 0:
            return float(info.reset_in_seconds)
    return None


def _wait_text(wait: float) -> str:
    """ "asks to wait N s; try again after HH:MM (local time)"."""
    when = time.strftime("%H:%M", time.localtime(time.time() + wait))
    return f"asks to wait {wait:.0f} s; try again after {when} (local time)"


class _HubGuard:
    """Event hooks for huggingface_hub's HTTP client during one transfer: no
    new request once the watch tripped, the connection registered with the
    watch, and a rate limit that asks to wait longer than the download's
    remaining allowance ends the source instead of a sleep of hours (the
    library's `_http_backoff_base` in `huggingface_hub/utils/_http.py`
    sleeps Retry-After + 1 s, up to 5 times, for the GET of a file too)."""

    def __init__(self, watch: StallWatch) -> None:
        self.watch = watch
        self.allowance = _MAX_RATE_WAIT

    def on_request(self, request: Any) -> None:
        self.watch.check()

    def on_response(self, response: Any) -> None:
        self.watch.check()
        stream = response.extensions.get("network_stream")
        with contextlib.suppress(Exception):
            sock = stream.get_extra_info("socket")
            self.watch.on_trip(lambda: _shutdown(sock))
        if response.status_code not in (429, 503):
            return
        wait = _retry_after(response.headers)
        if wait is None:
            return  # the library's own backoff: a few seconds
        if wait > self.allowance:
            what = (
                "is rate-limiting this machine"
                if response.status_code == 429
                else "is unavailable"
            )
            raise SourceGaveUp(
                f"{response.request.url.host} {what} (HTTP {response.status_code}) "
                f"and {_wait_text(wait)}"
            )
        self.allowance -= wait + 1
        self.watch.pause(wait + 1)  # huggingface_hub sleeps wait + 1 s


@contextlib.contextmanager
def _hub_settings(timeout: float, guard: _HubGuard) -> Iterator[None]:
    """Apply, for one call, what huggingface_hub only reads when first
    imported: `QWEN3_DOWNLOAD_TIMEOUT` (its `HF_HUB_DOWNLOAD_TIMEOUT` and
    `HF_HUB_ETAG_TIMEOUT`), `HF_HUB_DISABLE_XET` as set now (left alone when
    unset), small reads (so progress, and the stall rule, see every 64 kB),
    and `guard`'s hooks on the HTTP client (where the library has
    `set_client_factory`). Everything is restored afterwards."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    saved = {
        k: getattr(constants, k)
        for k in ("HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_ETAG_TIMEOUT",
                  "DOWNLOAD_CHUNK_SIZE", "HF_HUB_DISABLE_XET")
    }  # fmt: skip
    constants.HF_HUB_DOWNLOAD_TIMEOUT = timeout
    constants.HF_HUB_ETAG_TIMEOUT = timeout
    constants.DOWNLOAD_CHUNK_SIZE = min(saved["DOWNLOAD_CHUNK_SIZE"], _HUB_CHUNK)
    xet = os.environ.get("HF_HUB_DISABLE_XET")
    if xet is not None:
        constants.HF_HUB_DISABLE_XET = xet.strip().upper() in {"1", "ON", "YES", "TRUE"}
    previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None)
    set_factory = getattr(huggingface_hub, "set_client_factory", None)

    def factory() -> Any:
        client = previous()  # type: ignore[misc]
        hooks = client.event_hooks
        client.event_hooks = {
            "request": [*hooks.get("request", []), guard.on_request],
            "response": [*hooks.get("response", []), guard.on_response],
        }
        guard.watch.on_trip(client.close)
        return client

    hooked = previous is not None and set_factory is not None
    if hooked:
        set_factory(factory)
    try:
        yield
    finally:
        if hooked:
            set_factory(previous)
        for key, value in saved.items():
            setattr(constants, key, value)


def _from_hub(url: str, dest: Path, endpoint: str, timeout: float) -> str:
    """Fetch `dest.name` with huggingface_hub into `.<name>.hub/` beside it,
    check it against the size and ETag the Hub announced, then install it.

    Within a call the library resumes dropped connections itself. A file it
    finished stays in the staging folder until installed, so a run stopped
    before that reuses it without a new transfer (huggingface_hub discards a
    partial transfer, so across runs a file restarts from its first byte).
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download

    staging = dest.with_name(f".{dest.name}.hub")
    for leftover in staging.rglob("*.incomplete"):  # from a killed run
        leftover.unlink(missing_ok=True)
    watch = _watch(timeout)
    try:
        with watch, _hub_settings(timeout, _HubGuard(watch)):
            meta = get_hf_file_metadata(url, endpoint=endpoint, timeout=timeout)
            staged = Path(
                hf_hub_download(
                    REPO_ID,
                    dest.name,
                    revision="main",
                    local_dir=staging,
                    endpoint=endpoint,
                    etag_timeout=timeout,
                    tqdm_class=_progress_class(watch, dest.name),
                )
            )
    except BaseException:
        if not (staging / dest.name).is_file():  # nothing worth keeping
            shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        return _check_hub_file(staged, dest, url, meta)
    finally:  # installed, or not worth keeping: either way start clean
        shutil.rmtree(staging, ignore_errors=True)


def _check_hub_file(staged: Path, dest: Path, url: str, meta: Any) -> str:
    size = staged.stat().st_size
    if meta.size is not None and size != meta.size:
        raise IntegrityError(f"got {size} bytes, the Hub announced {meta.size}")
    hashes = provenance.hash_file(staged)
    etag = (meta.etag or "").lower()
    if _HEX64.fullmatch(etag):  # LFS file: ETag is the sha256 of the content
        check, expected, actual = "sha256 verified", etag, hashes["sha256"]
    elif _HEX40.fullmatch(etag):  # regular git file: ETag is the git blob id
        check, expected, actual = "git blob sha1 verified", etag, hashes["git"]
    else:
        check, expected, actual = "size verified", "", ""
    if expected != actual:
        raise IntegrityError(f"content hash {actual} != ETag {expected}")
    _install(staged, dest, url, check, hashes["sha256"])
    return check


# --------------------------------------------------------------------------
# Source 2: the book's backup mirror (plain HTTPS, resumable)
# --------------------------------------------------------------------------


def _announced_sha1(headers: Any) -> str | None:
    """The whole-file sha1 a Backblaze B2 response announces, if any."""
    for key in ("x-bz-content-sha1", "x-bz-info-large_file_sha1"):
        value = (headers.get(key) or "").strip().lower()
        value = value.removeprefix("unverified:")
        if _HEX40.fullmatch(value):
            return value
    return None


def _from_backup(url: str, dest: Path, endpoint: str, timeout: float) -> str:
    """Download `url` into `<name>.part` (resuming with Range), check size,
    announced sha1 and content, then install it. A fresh start is tried once
    if a resumed file fails the check."""
    part = dest.with_name(dest.name + ".part")
    resumed = part.is_file() and part.stat().st_size > 0
    try:
        with _watch(timeout) as watch:
            total, sha1 = _fetch_resumable(url, part, timeout, watch)
        return _check_and_install(part, dest, url, total, sha1)
    except IntegrityError:
        part.unlink(missing_ok=True)
        if not resumed:
            raise
    with _watch(timeout) as watch:
        total, sha1 = _fetch_resumable(url, part, timeout, watch)
    try:
        return _check_and_install(part, dest, url, total, sha1)
    except IntegrityError:
        part.unlink(missing_ok=True)
        raise


def _check_and_install(
    part: Path, dest: Path, url: str, total: int | None, sha1: str | None
) -> str:
    size = part.stat().st_size
    if total is not None and size != total:
        raise IntegrityError(f"got {size} bytes, the server announced {total}")
    hashes = provenance.hash_file(part)
    if sha1 is not None and hashes["sha1"] != sha1:
        raise IntegrityError(f"content sha1 {hashes['sha1']} != announced {sha1}")
    check = "sha1 verified" if sha1 else "content checked (no hash announced)"
    _install(part, dest, url, check, hashes["sha256"])
    return check


def _watched_session(watch: StallWatch) -> Any:
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
                watch.on_trip(lambda: _shutdown(sock))

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


def _body(response: Any) -> Iterator[bytes]:
    """The body as it arrives (each network read), so the watch sees it."""
    read1 = getattr(response.raw, "read1", None)
    if read1 is None:  # urllib3 1.x
        yield from response.iter_content(_CHUNK)
        return
    while chunk := read1(_CHUNK, decode_content=True):
        yield chunk


def _fetch_resumable(
    url: str, part: Path, timeout: float, watch: StallWatch
) -> tuple[int | None, str | None]:
    """Append the rest of `url` to `part`; retry dropped connections from where
    they stopped, with exponential backoff. Gives up after `_MAX_STALLS` tries
    in a row that bring no byte beyond the most the file ever had, or after
    `_MAX_REQUESTS` requests. Returns (total size, announced sha1)."""
    import requests
    import urllib3

    dropped = (
        requests.exceptions.ConnectionError,
        requests.exceptions.ChunkedEncodingError,
        requests.exceptions.Timeout,
        urllib3.exceptions.ProtocolError,
        urllib3.exceptions.ReadTimeoutError,
    )
    stalls = requests_made = 0
    best = part.stat().st_size if part.is_file() else 0
    bar: list[Any] = []  # the progress bar, made on the first answer
    try:
        with _watched_session(watch) as session:
            while True:
                watch.check()
                requests_made += 1
                try:
                    return _get_once(session, url, part, timeout, watch, bar)
                except dropped:
                    watch.check()  # a stall, not a dropped connection
                    if not part.is_file():  # gone (416): start counting anew
                        best = 0
                    now = part.stat().st_size if part.is_file() else 0
                    stalls = 0 if now > best else stalls + 1
                    best = max(best, now)
                    if stalls >= _MAX_STALLS or requests_made >= _MAX_REQUESTS:
                        raise
                    pause = min(_BACKOFF * 2 ** max(stalls - 1, 0), 30.0)
                    watch.pause(pause)
                    time.sleep(pause)
    finally:
        for b in bar:
            b.close()


def _get_once(
    session: Any, url: str, part: Path, timeout: float, watch: StallWatch,
    bar: list[Any],
) -> tuple[int | None, str | None]:  # fmt: skip
    """One GET from where `part` ends. The progress bar is made on the first
    answer (into the list `bar`) and reset on later ones."""
    import requests

    have = part.stat().st_size if part.is_file() else 0
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with session.get(
        url, headers=headers, stream=True, timeout=(timeout, timeout)
    ) as r:
        if r.status_code == 416:  # part is not a prefix of the file
            part.unlink(missing_ok=True)
            raise requests.exceptions.ConnectionError("416 on resume")
        r.raise_for_status()
        total, mode = _plan_write(r, have)
        sha1 = _announced_sha1(r.headers)
        start = have if mode == "ab" else 0
        if not bar:
            bar.append(
                _progress_class(None)(
                    total=total, initial=start, unit="B", unit_scale=True,
                    unit_divisor=1024, desc=part.name.removesuffix(".part"),
                )
            )  # fmt: skip
        else:
            bar[0].reset(total=total)
            bar[0].update(start)
        with part.open(mode) as f:
            for chunk in _body(r):
                f.write(chunk)
                watch.count(len(chunk))
                bar[0].update(len(chunk))
        return total, sha1


def _plan_write(response: Any, have: int) -> tuple[int | None, str]:
    """From a GET response, the file's total size and how to open `.part`:
    append for a matching 206, truncate for a 200 (server ignored Range)."""
    if response.status_code == 206:
        m = re.fullmatch(
            r"bytes (\d+)-(\d+)/(\d+|\*)",
            response.headers.get("Content-Range", "").strip(),
        )
        if m is None or int(m.group(1)) != have:
            raise IntegrityError(
                f"unexpected Content-Range {response.headers.get('Content-Range')!r} "
                f"for a request from byte {have}"
            )
        return (None if m.group(3) == "*" else int(m.group(3))), "ab"
    length = response.headers.get("Content-Length")
    return (int(length) if length is not None else None), "wb"
