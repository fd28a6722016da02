"""Get the book's Qwen3 0.6B files: tokenizer JSON and `.pth` weights.

`download_qwen3_small` tries two sources, file by file (`utils.download.sources`):
the Hugging Face repo `rasbt/qwen3-from-scratch` through `huggingface_hub`
(`HF_ENDPOINT`, `HF_HUB_DISABLE_XET` and `QWEN3_DOWNLOAD_TIMEOUT` are applied
at call time, so a mirror set in a running notebook works), then the book's
backup mirror on Backblaze B2, resuming an interrupted download from
`<name>.part` with HTTP Range.

A file only appears under its final name once it is complete, matches the
size and hash its source announced (where it announces one) and passes the
content checks of `utils.download.provenance`, which also writes the verification
record that lets later calls skip the network. Then its leftovers (`.part`,
staging folder) go; a link planted under one of those names is removed,
never written through (`utils.linksafe`).

Every wait is bounded (`utils.download.watch`): `QWEN3_DOWNLOAD_TIMEOUT` seconds
of silence fail a try (default 10, from 1 to 3600); retries back off and end
after a few tries without new bytes; a source that sends too little for too
long (slow-loris) is dropped for the next one; a rate limit asking to wait
longer than a minute in all ends the source with a line that says when to
try again.

A lock file per file (`.<name>.lock`, `utils.download.lock`) lets two
processes share one folder; a waiter gives up, naming the holder, when the
holder makes no progress. A failed download leaves nothing a later run
cannot use (no empty folder, no lock file; a partial file only where a later
run can resume it and the disk did not refuse it). With `QWEN3_STANDIN=1`
no request is made: offline stand-ins are provided in a separate folder
(see `utils.download.standin`), never in `out_dir`.
Progress and diagnostics go to stderr through `utils.log`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import utils.download.lock as download_lock
import utils.download.provenance as provenance
import utils.download.standin as standin
import utils.download.store as model_store
from utils import linksafe, settings
from utils.download.errors import describe_error, disk_reason, hints
from utils.download.provenance import IntegrityError, is_verified
from utils.download.sources import (
    REPO_ID,
    from_backup,
    from_hub,
    staging_path,
)
from utils.download.watch import size_str
from utils.fileio import temp_name_pattern
from utils.log import get_logger

__all__ = [
    "BACKUP_URL",
    "KINDS",
    "REPO_ID",
    "DownloadError",
    "NotAFolderError",
    "UntrustedFolderError",
    "Qwen3Files",
    "download_qwen3_small",
    "download_timeout",
    "file_names",
    "local_files",
]

log = get_logger("utils.download")  # one name for the package's lines

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
BACKUP_URL = "https://f001.backblazeb2.com/file/reasoning-from-scratch/qwen3-0.6B"
BACKUP_URL_ENV = "QWEN3_BACKUP_URL"
TIMEOUT_ENV = "QWEN3_DOWNLOAD_TIMEOUT"
KINDS = ("base", "reasoning")

_DEFAULT_TIMEOUT = 10.0  # seconds of silence before a try fails
_MIN_TIMEOUT = 1.0  # the range QWEN3_DOWNLOAD_TIMEOUT may set
_MAX_TIMEOUT = 3600.0
_FULL = ("no space left on the disk", "disk quota exceeded")  # disk_reason's
_timeouts_said: set[str] = set()  # values already reported as not used as given


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


class DownloadError(RuntimeError):
    """No source could deliver a file. `str()` is the whole message: each URL
    tried with what went wrong, then `hint` (what to try). Jupyter shows only
    this message, without a traceback (`_render_traceback_`). `causes`
    holds each source's exception, in the order tried."""

    def __init__(
        self,
        name: str,
        attempts: list[tuple[str, str]],
        out_dir: str | os.PathLike = "qwen3",
        causes: list[BaseException] | None = None,
    ) -> None:
        self.name = name
        self.attempts = list(attempts)
        self.causes = list(causes or [])
        self.hint = hints(out_dir, "reasoning" if "reasoning" in name else "base")
        tried = "\n".join(f"  - {url}\n      {err}" for url, err in attempts)
        super().__init__(
            f"Could not download {name} from any source. Tried:\n{tried}\n{self.hint}"
        )

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback: the message itself."""
        return f"{type(self).__name__}: {self}".splitlines()


class NotAFolderError(NotADirectoryError, ValueError):
    """`out_dir` is (or lies under) a file. A ValueError too, so the
    commands report it as a usage error in one line."""


class UntrustedFolderError(PermissionError, ValueError):
    """Another user could replace the files in `out_dir`. A ValueError too,
    so the commands report it as a usage error in one line."""


def local_files(
    model: str | os.PathLike, tokenizer: str | os.PathLike | None
) -> tuple[Path, Path | None, bool]:
    """(model, tokenizer, standin) for files the reader names explicitly (the
    CLI's --model-file, the benchmark's --model-path): checks they exist and
    shows the stand-in banner when the weights are a stand-in (sidecar or the
    mark inside the checkpoint). Raises FileNotFoundError naming the path."""
    paths = [Path(model)] + ([] if tokenizer is None else [Path(tokenizer)])
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"file not found: {path}")
    is_standin = provenance.is_standin(paths[0])
    if is_standin:
        provenance.print_standin_banner()
    return paths[0], (paths[1] if tokenizer is not None else None), is_standin


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
    out_dir: str | os.PathLike | None = "qwen3",
    *,
    backup_url: str | None = None,
) -> Qwen3Files:
    """Make the Qwen3 0.6B tokenizer (and weights) for `kind` available in
    `out_dir`; use the returned paths.

    kind: "base" or "reasoning". Files in `out_dir` with a valid verification
    record are used without any network request. Otherwise they come from
    the per-user model store (`utils.download.store`: `QWEN3_MODEL_STORE`,
    default `~/.cache/qwen3-ch02/models`), as a hard link where the file
    system allows it, else a checked copy; no request is made when the
    store holds a verified copy. What the store lacks is downloaded into it
    first: the Hugging Face repo `rasbt/qwen3-from-scratch` (at `HF_ENDPOINT`
    if set), then the book's backup mirror (`backup_url` or
    `QWEN3_BACKUP_URL` replaces its base URL). A store that is read-only or
    full, or that another user could change (`utils.linksafe.
    untrusted_reason`), is skipped (one line on stderr) and the files are
    downloaded into `out_dir` itself. `out_dir=None` returns the store's own
    paths (what the commands use by default).

    With `QWEN3_STANDIN=1`, offline stand-ins are provided in
    `utils.download.standin.standin_files_dir()` instead (no network, neither
    `out_dir` nor the store is touched, `standin=True`). Raises
    `DownloadError` if all sources fail, `NotAFolderError` if `out_dir` is a
    file, `UntrustedFolderError` if another user could change it,
    `download_lock.HolderStuckError` if a process holding a file's lock
    shows no sign of life.
    """
    tok_name, model_name = file_names(kind)
    names = [tok_name] if tokenizer_only else [tok_name, model_name]
    out = None if out_dir is None else Path(out_dir)
    if standin.standin_enabled():
        paths = standin.provide_standins(out or model_store.store_dir(), kind, names)
        return Qwen3Files(paths[0], paths[1] if len(paths) > 1 else None, True)
    if out is not None:
        check_folder(out)
    made = (
        []
        if out is None
        else [p for p in (out, *out.parents) if not linksafe.lexists(p)]
    )
    request = _Request(out, *_endpoints(backup_url), model_store.store_dir())
    try:
        _check_trust(request)
        paths = [_provide(request, name) for name in names]
    except BaseException as exc:
        for folder in made:  # only folders this call made, if left empty
            try:
                folder.rmdir()
            except OSError:
                break
        if isinstance(exc, DownloadError):  # the message says it all
            raise exc.with_traceback(None) from None
        raise
    return Qwen3Files(paths[0], paths[1] if len(paths) > 1 else None, False)


def check_folder(out: Path) -> None:
    """Raise `NotAFolderError` (one line: what to do) if `out`, or the
    nearest part of it that exists, is not a folder."""
    for path in (out, *out.parents):
        if linksafe.lexists(path):
            if path.is_dir():
                return
            what = "a file" if path.is_file() else "not a folder"
            raise NotAFolderError(
                f"{path} is {what}, so {out} cannot be the folder for the model "
                "files: choose another folder (out_dir, or --out-dir in the "
                f"commands), or move {path} away"
            )


def _check_trust(request: _Request) -> None:
    """Refuse a folder of the caller's, and stop using the store, where
    another user could replace the files and their records (`utils.linksafe.
    untrusted_reason`: the folder, or one above it, is theirs or writable by
    them). Each is made first, so a new folder under a shared sticky one such
    as /tmp is judged as this user's own."""
    if request.out is not None:
        reason = _trust_reason(request.out)
        if reason is not None:
            raise UntrustedFolderError(
                f"{request.out} cannot be trusted: {reason}, so another user "
                "could replace the model files there; choose a folder of your "
                "own (out_dir, or --out-dir in the commands)"
            )
    if request.store is not None:
        reason = _trust_reason(request.store)
        if reason is not None:
            _leave_store(request, f"another user could replace them: {reason}")


def _trust_reason(folder: Path) -> str | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a disk that refuses: said when it is written to
        if not folder.is_dir():
            return None  # nothing there to distrust
    return linksafe.untrusted_reason(folder)


def _endpoints(backup_url: str | None) -> tuple[str, str]:
    """(Hub endpoint, mirror base URL) as set now."""
    endpoint = (settings.text("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
    backup = backup_url or settings.text(BACKUP_URL_ENV) or BACKUP_URL
    return endpoint, backup.rstrip("/")


def download_timeout() -> float:
    """Seconds of silence after which one try fails: `QWEN3_DOWNLOAD_TIMEOUT`
    from 1 to 3600 (default 10). A value outside that range, or not a number,
    is replaced (said once on stderr per value): `0`, `inf` and anything above
    3600 by 3600, anything below 1 by 1, the rest by the default."""
    raw = settings.text(TIMEOUT_ENV)
    if raw is None:
        return _DEFAULT_TIMEOUT
    value, why = _parse_timeout(raw)
    if why is not None and raw not in _timeouts_said:
        _timeouts_said.add(raw)
        log.warning(f"{TIMEOUT_ENV}={raw} {why}; using {value:g} s")
    return value


def _parse_timeout(raw: str) -> tuple[float, str | None]:
    try:
        seconds = float(raw)
    except ValueError:
        return _DEFAULT_TIMEOUT, "is not a number of seconds"
    if math.isnan(seconds) or seconds < 0:
        return _DEFAULT_TIMEOUT, "is not a number of seconds"
    if seconds == 0 or seconds > _MAX_TIMEOUT:
        return _MAX_TIMEOUT, f"asks for no limit or more than {_MAX_TIMEOUT:g} s"
    if seconds < _MIN_TIMEOUT:
        return _MIN_TIMEOUT, f"is less than {_MIN_TIMEOUT:g} s"
    return seconds, None


# --------------------------------------------------------------------------
# One file: lock, sources, leftovers
# --------------------------------------------------------------------------


def _leftovers(dest: Path) -> list[Path]:
    """What earlier tries left beside `dest`: `.part`, Hub staging, temp
    files (links at those names included, dangling or not)."""
    found = [dest.with_name(dest.name + ".part"), staging_path(dest)]
    return [p for p in found if linksafe.lexists(p)] + list(
        dest.parent.glob(temp_name_pattern(dest))
    )


def _remove_leftovers(dest: Path) -> None:
    for path in _leftovers(dest):
        linksafe.clear_planted(path)  # a link: said in one line
        linksafe.remove_leftover(path)


def _exclusive(folder: Path, name: str) -> contextlib.AbstractContextManager:
    """Hold the lock of `folder/name` (`utils.download.lock`): a wait that
    ends when the holder's working files stop changing."""
    return download_lock.held(folder, name, lambda: _activity(folder / name))


def _activity(dest: Path) -> tuple:
    """A fingerprint of the work on `dest`: size and time of it and of every
    file among its leftovers (a `.part` growing, a staging folder filling)."""
    found = []
    for path in [dest, *_leftovers(dest)]:
        real_dir = path.is_dir() and not path.is_symlink()
        walked = os.walk(path) if real_dir else [(path.parent, [], [path.name])]
        for root, _dirs, files in walked:
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(root, name))
                    found.append((f"{root}/{name}", st.st_size, st.st_mtime_ns))
    return tuple(sorted(found))


@dataclass
class _Request:
    """One call of `download_qwen3_small`: the folder asked for (None: the
    store's own paths), the sources, and the store (None once it proved
    unable to keep the files)."""

    out: Path | None
    endpoint: str
    backup: str
    store: Path | None


def _provide(request: _Request, name: str) -> Path:
    """The verified file `name` where the caller asked for it: already
    there; from the store (downloaded into it first if needed); or, when
    the store's disk refuses, downloaded into `out` itself."""
    out = request.out
    if out is not None and is_verified(out / name):
        return _ensure_file(out, name, request)  # no request; leftovers go
    if request.store is not None:
        try:
            stored = _ensure_file(request.store, name, request, say=out is None)
        except Exception as exc:
            reason = disk_reason(exc)
            if reason is None:
                raise
            _leave_store(request, reason)
        else:
            if out is None or _same_folder(out, stored.parent):
                return stored
            return _place(stored, out / name)
    assert out is not None  # _leave_store raised otherwise
    return _ensure_file(out, name, request)


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _leave_store(request: _Request, reason: str) -> None:
    """Stop using the store for this call, saying so once; without a
    folder of the caller's to fall back to, raise `StoreUnusableError`."""
    store, request.store = request.store, None
    if request.out is None:
        raise model_store.StoreUnusableError(
            f"cannot keep the model files in {store} ({reason}): set "
            f"{model_store.STORE_ENV} to a folder of your own, or name a "
            "folder of your own (out_dir, or --out-dir in the commands)"
        )
    log.warning(
        f"{store}: cannot keep the model files there ({reason}); "
        f"downloading into {request.out} instead"
    )


def _place(stored: Path, dest: Path) -> Path:
    """Link (or copy) the stored file to `dest`, holding the store's lock
    (when it is writable: a link renews its record) and the folder's."""
    writable = os.access(stored.parent, os.W_OK)
    with (
        _exclusive(stored.parent, stored.name)
        if writable
        else contextlib.nullcontext(),
        _exclusive(dest.parent, dest.name),
    ):
        if not is_verified(stored):
            raise IntegrityError(f"{stored} changed before it could be used; run again")
        how = model_store.place(stored, dest)
        _remove_leftovers(dest)
    log.info(f"{dest}: {how} from the verified copy in {stored.parent}/")
    return dest


def _ensure_file(folder: Path, name: str, request: _Request, say: bool = True) -> Path:
    """`folder/name`, verified: as it is, or downloaded (one process at a
    time). `say`: log that it was already there."""
    dest = folder / name
    verified = is_verified(dest)
    if verified and not _leftovers(dest):
        if say:
            log.info(f"{dest}: already downloaded and verified")
        return dest
    with _exclusive(folder, name):
        if is_verified(dest):  # already, or another process finished it
            _remove_leftovers(dest)
            if say or not verified:
                log.info(
                    f"{dest}: already downloaded and verified"
                    if verified
                    else f"{dest}: downloaded and verified by another process"
                )
            return dest
        for stale in folder.glob(temp_name_pattern(dest)):  # never resumable
            linksafe.remove_leftover(stale)
        _download(dest, request)
        _remove_leftovers(dest)
    return dest


def _download(dest: Path, request: _Request) -> None:
    name, endpoint, backup = dest.name, request.endpoint, request.backup
    timeout = download_timeout()
    hub_where = f"HF_ENDPOINT={endpoint}" if settings.text("HF_ENDPOINT") else endpoint
    sources: list[tuple[str, str, str, Callable[..., str]]] = [
        ("Hugging Face Hub", hub_where, f"{endpoint}/{REPO_ID}/resolve/main/{name}",
         from_hub),
        ("backup mirror", urlsplit(backup).netloc or backup, f"{backup}/{name}",
         from_backup),
    ]  # fmt: skip
    attempts: list[tuple[str, str]] = []
    causes: list[BaseException] = []
    for label, where, url, fetch in sources:
        if attempts:
            log.info(f"{name}: trying the {label} ({url})")
        try:
            check = fetch(url, dest, endpoint, timeout)
        except Exception as exc:  # noqa: BLE001 - each source's error is reported
            attempts.append((url, describe_error(exc, url, timeout)))
            causes.append(exc)
            log.info(f"{name}: {label} ({where}) failed: {attempts[-1][1]}")
            continue
        size = size_str(dest.stat().st_size)
        log.info(f"Saved {dest} ({size}, {check}) from the {label}: {url}")
        return
    error = DownloadError(name, attempts, request.out or dest.parent, causes)
    if disk_reason(error) in _FULL:  # partial files would keep the disk full
        _remove_leftovers(dest)
    raise error
