"""The two places `utils.download` fetches a file from, and how a fetched
file is checked and installed.

1. The Hugging Face repo `rasbt/qwen3-from-scratch` through
   `huggingface_hub` (its metadata call and its `http_get`), into a partial
   file in `.<name>.hub/` beside the file that the next run resumes with
   HTTP Range, checked against the size and ETag the Hub announces.
2. The book's backup mirror on Backblaze B2, over plain HTTPS with
   `requests`, resuming an interrupted download from `<name>.part` with
   HTTP Range, checked against the sha1 B2 announces.

Either way the content checks of `utils.download.provenance` run before a file gets
its final name and its verification record (`install`). Working files are
opened and cleaned up through `utils.linksafe`: never through a link.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import utils.download.provenance as provenance
from utils import linksafe, settings
from utils.download.provenance import IntegrityError
from utils.download.watch import (
    SourceGaveUp,
    StallWatch,
    body,
    new_watch,
    progress_class,
    retry_after,
    shutdown,
    wait_text,
    watched_session,
)
from utils.fileio import atomic_move
from utils.log import get_logger

__all__ = ["REPO_ID", "from_backup", "from_hub", "install", "staging_path"]

log = get_logger("utils.download")  # one name for the package's lines

REPO_ID = "rasbt/qwen3-from-scratch"
_HUB_CHUNK = 1 << 16  # the Hub client's read size (its own: 10 MB)
_MAX_STALLS = 3  # tries in a row that bring no new bytes end a source
_MAX_REQUESTS = 60  # hard cap on GETs for one file from one source
_BACKOFF = 1.0  # first pause between tries in seconds; doubles, up to 30 s
_MAX_RATE_WAIT = 60.0  # seconds of "Retry-After" the download accepts in all
_SLOW_HEADERS = 1.0  # seconds for response headers that count as slow
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # an ETag fit for a file name


def install(staged: Path, dest: Path, source: str, check: str, sha256: str) -> None:
    """Check the content of a fetched file, then move it into place, drop
    any stand-in mark and write the record. Raises `IntegrityError` first if
    the content is not the book's file (nothing is installed then)."""
    if staged.is_symlink():
        raise IntegrityError(f"{staged} became a symbolic link; not installed")
    content = provenance.check_content(staged, dest.name)
    provenance.record_path(dest).unlink(missing_ok=True)
    atomic_move(staged, dest)
    provenance.sidecar_path(dest).unlink(missing_ok=True)
    provenance.write_record(
        dest, {"sha256": sha256, "checked": check, "source": source, "content": content}
    )


def staging_path(dest: Path) -> Path:
    """The Hub's staging folder for `dest`: `.<name>.hub` beside it."""
    return dest.with_name(f".{dest.name}.hub")


# --------------------------------------------------------------------------
# Source 1: Hugging Face Hub
# --------------------------------------------------------------------------


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
            self.watch.on_trip(lambda: shutdown(sock))
        if response.status_code not in (429, 503):
            return
        wait = retry_after(response.headers)
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
                f"and {wait_text(wait)}"
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
    xet = settings.text("HF_HUB_DISABLE_XET")
    if xet is not None:
        constants.HF_HUB_DISABLE_XET = settings.is_true(xet)
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


def _hub_partial(staging: Path, name: str, etag: str | None) -> Path:
    """The partial transfer of `name` at `etag` in the staging folder (made a
    real folder here: a planted link is removed, never followed); partials
    of other versions of the file go (they are no prefix of this one)."""
    linksafe.prepare_folder(staging)
    tag = (etag or "").lower()
    part = staging / (f"{name}.{tag}.incomplete" if _HEX.fullmatch(tag) else
                      f"{name}.incomplete")  # fmt: skip
    for path in staging.iterdir():
        if path != part:
            linksafe.remove_leftover(path)
    return part


def from_hub(url: str, dest: Path, endpoint: str, timeout: float) -> str:
    """Fetch `dest.name` from the Hub into `.<name>.hub/<name>.<etag>.incomplete`
    beside it, check it against the size and ETag the Hub announced, then
    install it.

    The metadata and the transfer go through huggingface_hub's own client
    and `http_get` (its endpoint, token, redirects, retries); the bytes go
    to a partial file of ours that an interrupted run (Ctrl-C, kill -9, a
    dropped network) leaves behind and the next run continues with an HTTP
    Range request (`hf_hub_download` itself starts every run from byte 0).
    A resumed file that fails the checks is fetched once more from byte 0.
    """
    staging = staging_path(dest)
    resumed = False
    with contextlib.suppress(OSError):
        resumed = any(staging.glob("*.incomplete"))
    try:
        return _fetch_from_hub(url, dest, endpoint, timeout, staging)
    except IntegrityError:
        linksafe.remove_leftover(staging)
        if not resumed:
            raise
    return _fetch_from_hub(url, dest, endpoint, timeout, staging)


def _fetch_from_hub(
    url: str, dest: Path, endpoint: str, timeout: float, staging: Path
) -> str:
    """One run of the Hub transfer into the staging folder, then the checks
    (the folder goes after them; a partial stays only on an interruption)."""
    from huggingface_hub import get_hf_file_metadata

    watch = new_watch(timeout)
    with watch, _hub_settings(timeout, _HubGuard(watch)):
        meta = get_hf_file_metadata(url, endpoint=endpoint, timeout=timeout)
        part = _hub_partial(staging, dest.name, meta.etag)
        have = linksafe.part_size(part)
        if meta.size is not None and have > meta.size:
            linksafe.remove_leftover(part)
            have = 0
        try:
            _hub_transfer(
                meta, part, dest.name, have, progress_class(watch, dest.name, meta.size)
            )
        except BaseException:
            if linksafe.part_size(part) == 0:  # nothing worth keeping
                linksafe.remove_leftover(staging)
            raise
    try:
        return _check_hub_file(part, dest, url, meta)
    finally:  # installed, or not worth keeping: either way start clean
        linksafe.remove_leftover(staging)


def _hub_transfer(
    meta: Any, part: Path, name: str, have: int, tqdm_class: type
) -> None:
    """The bytes of the file into `part`: by the library's Xet client where
    it would use one (its chunk cache keeps what an interrupted run got),
    else by its `http_get` from byte `have` on (HTTP Range)."""
    from huggingface_hub import constants, file_download
    from huggingface_hub.utils import build_hf_headers

    headers = {**build_hf_headers(), "Accept-Encoding": "identity"}
    xet = getattr(meta, "xet_file_data", None)
    if (
        xet is not None
        and not constants.HF_HUB_DISABLE_XET
        and (file_download.is_xet_available())
    ):
        linksafe.remove_leftover(part)
        file_download.xet_get(
            incomplete_path=part, xet_file_data=xet, headers=headers,
            expected_size=meta.size, displayed_filename=name, tqdm_class=tqdm_class,
        )  # fmt: skip
        return
    with linksafe.open_part(part, append=have > 0) as f:
        file_download.http_get(
            meta.location, f, resume_size=have, headers=headers,
            expected_size=meta.size, displayed_filename=name, tqdm_class=tqdm_class,
        )  # fmt: skip


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
    install(staged, dest, url, check, hashes["sha256"])
    return check


# --------------------------------------------------------------------------
# Source 2: the book's backup mirror (plain HTTPS, resumable)
# --------------------------------------------------------------------------


def from_backup(url: str, dest: Path, endpoint: str, timeout: float) -> str:
    """Download `url` into `<name>.part` (resuming with Range), check size,
    announced sha1 and content, then install it. A fresh start is tried once
    if a resumed file fails the check."""
    part = dest.with_name(dest.name + ".part")
    linksafe.clear_planted(part)
    resumed = linksafe.part_size(part) > 0
    try:
        return _fetch_and_install(url, part, dest, timeout)
    except IntegrityError:
        linksafe.remove_leftover(part)
        if not resumed:
            raise
    return _fetch_and_install(url, part, dest, timeout)


def _fetch_and_install(url: str, part: Path, dest: Path, timeout: float) -> str:
    """One transfer into `part`, then the checks. A file that fails them
    goes; so does an empty `part` (nothing a later run could resume)."""
    try:
        with new_watch(timeout) as watch:
            total, sha1 = _Transfer(url, part, timeout, watch).run()
        return _check_and_install(part, dest, url, total, sha1)
    except IntegrityError:
        linksafe.remove_leftover(part)
        raise
    except BaseException:
        if linksafe.part_size(part) == 0:
            linksafe.remove_leftover(part)
        raise


def _announced_sha1(headers: Any) -> str | None:
    """The whole-file sha1 a Backblaze B2 response announces, if any."""
    for key in ("x-bz-content-sha1", "x-bz-info-large_file_sha1"):
        value = (headers.get(key) or "").strip().lower()
        value = value.removeprefix("unverified:")
        if _HEX40.fullmatch(value):
            return value
    return None


def _check_and_install(
    part: Path, dest: Path, url: str, total: int | None, sha1: str | None
) -> str:
    size = linksafe.part_size(part)
    if total is not None and size != total:
        raise IntegrityError(f"got {size} bytes, the server announced {total}")
    hashes = provenance.hash_file(part)
    if sha1 is not None and hashes["sha1"] != sha1:
        raise IntegrityError(f"content sha1 {hashes['sha1']} != announced {sha1}")
    check = "sha1 verified" if sha1 else "content checked (no hash announced)"
    install(part, dest, url, check, hashes["sha256"])
    return check


class _EmptyAnswer(SourceGaveUp):
    """An answer without a length that ended before any byte of the file
    (the connection closed, e.g. while its headers trickled in)."""


class _Again(Exception):
    """The server asked for a short wait, which was waited: ask again."""


def _dropped_errors() -> tuple[type[BaseException], ...]:
    import requests
    import urllib3

    return (
        requests.exceptions.ConnectionError,
        requests.exceptions.ChunkedEncodingError,
        requests.exceptions.Timeout,
        urllib3.exceptions.ProtocolError,
        urllib3.exceptions.ReadTimeoutError,
        _EmptyAnswer,
    )


class _Transfer:
    """One file from the mirror into `part`: GETs from where `part` ends,
    retried with exponential backoff after a dropped connection. Gives up
    after `_MAX_STALLS` tries in a row that bring no byte beyond the most
    the file ever had, or after `_MAX_REQUESTS` requests. A 429/503 whose
    Retry-After fits in what is left of `_MAX_RATE_WAIT` is waited for."""

    def __init__(self, url: str, part: Path, timeout: float, watch: StallWatch):
        self.url, self.part, self.timeout, self.watch = url, part, timeout, watch
        self.bar: Any = None  # the progress bar, made on the first answer
        self.sha1: str | None = None  # as announced by any answer so far
        self.allowance = _MAX_RATE_WAIT
        self.short: list[tuple[int, int]] = []  # (got, announced) per short answer

    def run(self) -> tuple[int | None, str | None]:
        """Append the rest of the file to `part`; (total size, sha1)."""
        dropped = _dropped_errors()
        stalls = requests_made = 0
        best = linksafe.part_size(self.part)
        try:
            with watched_session(self.watch) as session:
                while True:
                    self.watch.check()
                    requests_made += 1
                    try:
                        return self._get(session)
                    except _Again:
                        continue
                    except dropped:
                        self.watch.check()  # a stall, not a dropped connection
                        now = linksafe.part_size(self.part)
                        best = 0 if not linksafe.lexists(self.part) else best
                        stalls = 0 if now > best else stalls + 1
                        best = max(best, now)
                        if stalls >= _MAX_STALLS or requests_made >= _MAX_REQUESTS:
                            self._explain_short()
                            raise
                        self._pause(min(_BACKOFF * 2 ** max(stalls - 1, 0), 30.0))
        finally:
            if self.bar is not None:
                self.bar.close()

    def _pause(self, seconds: float) -> None:
        self.watch.pause(seconds)
        time.sleep(seconds)

    def _explain_short(self) -> None:
        """Say what happened when every answer announced more bytes than it
        sent (a wrong Content-Length), instead of the last dropped read."""
        tail = self.short[-_MAX_STALLS:]
        if len(tail) == _MAX_STALLS and len(set(tail)) == 1:
            got, announced = tail[0]
            raise SourceGaveUp(
                f"the server announced {announced:,} bytes (Content-Length) but "
                f"each answer ended after {got:,}; gave up after {len(tail)} tries"
            )

    def _get(self, session: Any) -> tuple[int | None, str | None]:
        """One GET from where `part` ends."""
        have = linksafe.part_size(self.part)
        headers = {"Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        started = time.monotonic()
        timeouts = (self.timeout, self.timeout)
        with session.get(self.url, headers=headers, stream=True, timeout=timeouts) as r:
            waited = time.monotonic() - started
            if r.status_code == 416:
                return self._not_satisfiable(r, have)
            self._rate_limit(r)
            r.raise_for_status()
            total, append = _plan_write(r, have)
            self.sha1 = _announced_sha1(r.headers) or self.sha1
            start = have if append else 0
            self._progress(total, start)
            got = self._receive(r, append, total, start)
            if (
                got == 0
                and total is None
                and "chunked" not in str(r.headers.get("Transfer-Encoding", ""))
            ):
                raise _EmptyAnswer(_empty_text(waited))
            return total, self.sha1

    def _receive(self, r: Any, append: bool, total: int | None, start: int) -> int:
        """Write the body to `part`; the number of bytes received. A body
        that ends short of its Content-Length is noted for `_explain_short`."""
        got = 0
        try:
            with linksafe.open_part(self.part, append) as f:
                for chunk in body(r):
                    f.write(chunk)
                    got += len(chunk)
                    self.watch.count(len(chunk))
                    self.bar.update(len(chunk))
        except _dropped_errors():
            if total is not None:
                self.short.append((start + got, total))
            raise
        return got

    def _not_satisfiable(self, r: Any, have: int) -> tuple[int | None, str | None]:
        """A 416 on resume: `part` is already the whole file when the server
        names its size as `have` (an earlier answer announced a wrong
        length); otherwise `part` is no prefix of the file and goes."""
        import requests

        m = re.fullmatch(r"bytes \*/(\d+)", r.headers.get("Content-Range", "").strip())
        if m is not None and int(m.group(1)) == have:
            return have, self.sha1
        linksafe.remove_leftover(self.part)
        raise requests.exceptions.ConnectionError("416 on resume")

    def _rate_limit(self, r: Any) -> None:
        """Wait out a 429/503 whose Retry-After fits the allowance, then ask
        again (`_Again`); a longer one fails the source as an HTTP error."""
        if r.status_code not in (429, 503):
            return
        wait = retry_after(r.headers)
        if wait is None or wait > self.allowance:
            return
        self.allowance -= wait
        name = self.part.name.removesuffix(".part")
        log.info(f"{name}: the mirror asks to wait {wait:.0f} s (HTTP {r.status_code})")
        self._pause(wait)
        raise _Again

    def _progress(self, total: int | None, start: int) -> None:
        if self.bar is None:
            self.bar = progress_class(None)(
                total=total, initial=start, unit="B", unit_scale=True,
                unit_divisor=1024, desc=self.part.name.removesuffix(".part"),
            )  # fmt: skip
        else:
            self.bar.reset(total=total)
            self.bar.update(start)


def _empty_text(waited: float) -> str:
    if waited >= _SLOW_HEADERS:
        return (
            f"too slow: the answer's headers took {waited:.1f} s, then the "
            "connection closed before any of the file arrived"
        )
    return "the server closed the connection before sending any of the file"


def _plan_write(response: Any, have: int) -> tuple[int | None, bool]:
    """From a GET response, the file's total size and whether to append to
    `.part`: yes for a matching 206, no for a 200 (server ignored Range)."""
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
        return (None if m.group(3) == "*" else int(m.group(3))), True
    length = response.headers.get("Content-Length")
    return (int(length) if length is not None else None), False
