"""Get the book's Qwen3 0.6B files: tokenizer JSON and `.pth` weights.

`download_qwen3_small` tries two sources, file by file:

1. the Hugging Face repo `rasbt/qwen3-from-scratch` through `huggingface_hub`
   (`HF_ENDPOINT` and `HF_HUB_DISABLE_XET` are read at call time, so a mirror
   set in a running notebook works). The library resumes a dropped connection
   within a call but discards a partial file, so across runs only a finished
   file (kept in `.<name>.hub/` until installed) is reused;
2. the book's backup mirror on Backblaze B2, over plain HTTPS with `requests`,
   resuming an interrupted download from `<name>.part` with HTTP Range.

A file only ever appears under its final name once it is complete, matches the
size and hash its source announced (where it announces one), and its content
checks out: the weights load with `weights_only=True` into exactly the keys and
shapes of `QWEN_CONFIG_06_B`; the tokenizer is JSON with the Qwen3 vocabulary
and added tokens. A record `.<name>.verified.json` next to it (sha256, size,
modification and change times) lets later calls skip the network; a file
whose times or size changed is hashed again before it is trusted.

Retries are bounded (exponential backoff; a source that sends nothing new for
a few tries is abandoned; `QWEN3_DOWNLOAD_TIMEOUT` seconds of silence fail a
try). A lock file (`.download.lock`) lets two processes share one folder. With
`QWEN3_STANDIN=1` no request is made: offline stand-ins are provided in a
separate folder (see `utils.standin`), never in `out_dir`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.fileio import atomic_move, atomic_write_text, temp_name_pattern
from utils.qwen3_tokenizer import NON_SPECIAL_ADDED_TOKENS, SPECIAL_TOKENS

REPO_ID = "rasbt/qwen3-from-scratch"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
BACKUP_URL = "https://f001.backblazeb2.com/file/reasoning-from-scratch/qwen3-0.6B"
BACKUP_URL_ENV = "QWEN3_BACKUP_URL"
TIMEOUT_ENV = "QWEN3_DOWNLOAD_TIMEOUT"
KINDS = ("base", "reasoning")
RECORD_VERSION = 2
LOCK_NAME = ".download.lock"

# What the content checks expect. None: the book's QWEN_CONFIG_06_B (tests
# put a tiny config here).
MODEL_CONFIG: Mapping[str, Any] | None = None
TOKENIZER_VOCAB = 151_643  # BPE vocabulary; the added tokens follow it
ADDED_TOKENS = SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS  # ids 151643 onwards

_CHUNK = 1 << 16  # small reads: a dropped connection loses at most this much
_DEFAULT_TIMEOUT = 10.0  # seconds of silence before a try fails
_MAX_STALLS = 3  # tries in a row that bring no new bytes end a source
_MAX_REQUESTS = 60  # hard cap on GETs for one file from one source
_BACKOFF = 1.0  # first pause between tries in seconds; doubles, up to 30 s
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")

_HINTS = """\
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
  * Slow network: allow more seconds of silence, e.g. QWEN3_DOWNLOAD_TIMEOUT=60.
  * The official checkpoints (Qwen/Qwen3-0.6B-Base, Qwen/Qwen3-0.6B) are also on
    ModelScope (modelscope.cn); they use Hugging Face key names and must be
    converted to the book's format before `Qwen3Model` can load them.
  * Offline testing only: QWEN3_STANDIN=1 writes stand-ins instead, i.e. the real
    tokenizer and RANDOM weights of the real shape (gibberish text, NOT the model)."""


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
    from utils.standin import is_standin, print_standin_banner

    paths = [Path(model)] + ([] if tokenizer is None else [Path(tokenizer)])
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"file not found: {path}")
    standin = is_standin(paths[0])
    if standin:
        print_standin_banner()
    return paths[0], (paths[1] if tokenizer is not None else None), standin


class DownloadError(RuntimeError):
    """No source could deliver a file. `str()` is the whole message: each URL
    tried with its error, then `hint` (what to try)."""

    def __init__(self, name: str, attempts: list[tuple[str, str]]) -> None:
        self.name = name
        self.attempts = list(attempts)
        self.hint = _HINTS
        tried = "\n".join(f"  - {url}\n      {err}" for url, err in attempts)
        super().__init__(
            f"Could not download {name} from any source. Tried:\n{tried}\n{_HINTS}"
        )


class IntegrityError(OSError):
    """A downloaded file is not what its source announced or not the book's file."""


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
    from utils import standin

    if standin.standin_enabled():
        return _provide_standins(
            Path(out_dir), kind, tok_name, None if tokenizer_only else model_name
        )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for legacy in out.glob(".hub-staging-*"):  # left by earlier versions
        shutil.rmtree(legacy, ignore_errors=True)
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
    backup = (backup_url or os.environ.get(BACKUP_URL_ENV) or BACKUP_URL).rstrip("/")
    names = [tok_name] if tokenizer_only else [tok_name, model_name]
    for name in names:
        _ensure_file(out, name, endpoint, backup)
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
# Stand-ins
# --------------------------------------------------------------------------


def _provide_standins(
    out: Path, kind: str, tok_name: str, model_name: str | None
) -> Qwen3Files:
    from utils import standin

    standin.print_standin_banner()
    folder = standin.standin_files_dir()
    paths = [folder / tok_name] + ([] if model_name is None else [folder / model_name])
    for path in paths:
        if path.is_file() and standin.sidecar_path(path).is_file():
            continue  # already a stand-in
        standin.refuse_to_replace_real(path)
        _record_path(path).unlink(missing_ok=True)  # never leave a "verified" mark
        if path.suffix == ".pth":
            standin.write_standin_weights(path, kind)
        else:
            standin.write_standin_tokenizer(path, kind)
    print(
        f"Stand-in files in {folder}/ (no download: QWEN3_STANDIN is set; "
        f"nothing in {out}/ was touched)"
    )
    return Qwen3Files(
        tokenizer=paths[0], model=paths[1] if model_name else None, standin=True
    )


# --------------------------------------------------------------------------
# Content checks
# --------------------------------------------------------------------------


def _sniff(raw: bytes) -> str | None:
    """Name what a server sent instead of the file, if it is recognisable."""
    head = raw[:2048].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "an HTML page (a proxy, captive portal or login page?)"
    if head.startswith(b"<?xml") or head.startswith(b"<error"):
        return "an XML error message"
    if head.startswith(b"{"):
        try:
            data = json.loads(raw[:100_000].decode("utf-8", "replace"))
        except ValueError:
            return None
        if isinstance(data, dict) and ("error" in data or "message" in data):
            detail = str(data.get("error") or data.get("message"))[:120]
            return f"a JSON error message ({detail})"
    return None


def check_checkpoint(
    path: str | os.PathLike, cfg: Mapping[str, Any] | None = None
) -> str:
    """Raise `IntegrityError` unless `path` is a PyTorch zip checkpoint that
    loads with `weights_only=True` into exactly the keys and shapes of
    `Qwen3Model(cfg)` (default `QWEN_CONFIG_06_B`). Memory-mapped: cheap."""
    import zipfile

    import torch
    from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B, Qwen3Model

    from utils.standin import MARK_KEY

    path = Path(path)
    if not zipfile.is_zipfile(path):
        with path.open("rb") as f:
            what = _sniff(f.read(100_000))
        raise IntegrityError(
            f"got {what} instead of the weights"
            if what
            else f"not a PyTorch zip checkpoint ({path.stat().st_size} bytes; "
            "truncated or damaged download)"
        )
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - any failure means: not the file
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise IntegrityError(
            f"does not load with torch.load(weights_only=True): "
            f"{type(exc).__name__}: {first}"
        ) from None
    if not isinstance(sd, Mapping):
        raise IntegrityError(f"holds a {type(sd).__name__}, not a state dict")
    meta = getattr(sd, "_metadata", None)
    if isinstance(meta, Mapping) and MARK_KEY in meta:
        raise IntegrityError("is an offline stand-in, not the real weights")
    cfg = dict(QWEN_CONFIG_06_B if cfg is None else cfg)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Qwen3Model(cfg).state_dict().items()}
    got = {k: tuple(getattr(v, "shape", ())) for k, v in sd.items()}
    problems = [f"missing {k}" for k in expected if k not in got]
    problems += [f"unexpected {k}" for k in got if k not in expected]
    problems += [
        f"{k} has shape {got[k]}, expected {shape}"
        for k, shape in expected.items()
        if k in got and got[k] != shape
    ]
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise IntegrityError(
            f"not the Qwen3 0.6B weights: {'; '.join(problems[:3])}{more}"
        )
    return f"{len(expected)} tensors with the keys and shapes of Qwen3Model"


def check_tokenizer(path: str | os.PathLike) -> str:
    """Raise `IntegrityError` unless `path` is a tokenizer JSON with the Qwen3
    vocabulary size and the 26 added tokens at their ids."""
    raw = Path(path).read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        what = _sniff(raw)
        raise IntegrityError(
            f"got {what} instead of the tokenizer"
            if what
            else f"not valid JSON ({len(raw)} bytes; truncated or damaged download)"
        ) from None
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict):
        what = _sniff(raw)
        raise IntegrityError(
            f"got {what} instead of the tokenizer"
            if what
            else "JSON without a model vocabulary: not a tokenizer.json file"
        )
    if len(vocab) != TOKENIZER_VOCAB:
        raise IntegrityError(
            f"vocabulary has {len(vocab):,} entries, Qwen3 has {TOKENIZER_VOCAB:,}"
        )
    added = {
        t.get("id"): t.get("content")
        for t in data.get("added_tokens") or []
        if isinstance(t, dict)
    }
    expected = {TOKENIZER_VOCAB + i: tok for i, tok in enumerate(ADDED_TOKENS)}
    if added != expected:
        wrong = sorted(
            i for i in expected.keys() | added.keys() if added.get(i) != expected.get(i)
        )
        raise IntegrityError(
            f"added tokens differ from Qwen3's (first difference at id {wrong[0]})"
        )
    return f"{len(vocab):,} + {len(added)} added tokens"


def check_content(path: str | os.PathLike, name: str | None = None) -> str:
    """Run the content check that fits the file (weights or tokenizer), as
    told by `name` (default: the file's own name)."""
    if (name or Path(path).name).endswith(".pth"):
        return check_checkpoint(path, MODEL_CONFIG)
    return check_tokenizer(path)


# --------------------------------------------------------------------------
# Verification records
# --------------------------------------------------------------------------


def _record_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.verified.json")


def _stat_fields(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(_record_path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("file") != path.name:
        return None
    if not isinstance(record.get("sha256"), str):
        return None
    return record


def is_verified(path: str | os.PathLike) -> bool:
    """True if `path` is a real (not stand-in) file whose content was checked.

    No request is made. The record must match the file's size; if its
    modification or change time differs too (copied, edited, restored, or a
    record from elsewhere), the sha256 and the content are checked again
    before the file is trusted, and the record is renewed.
    """
    from utils.standin import is_standin

    path = Path(path)
    record = _read_record(path)
    if record is None or not path.is_file() or is_standin(path):
        return False
    now = _stat_fields(path)
    if record.get("size") != now["size"]:
        return False
    if record.get("version") == RECORD_VERSION and all(
        record.get(k) == v for k, v in now.items()
    ):
        return True
    print(f"{path}: changed since it was verified; checking it again")
    if _hash_file(path)["sha256"] != record["sha256"]:
        return False
    try:
        content = check_content(path)
    except IntegrityError:
        return False
    with contextlib.suppress(OSError):  # a read-only folder still verifies
        _write_record(path, {**record, "content": content})
    return True


def _write_record(path: Path, info: Mapping[str, Any]) -> None:
    data = {
        **info,
        "version": RECORD_VERSION,
        "file": path.name,
        **_stat_fields(path),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_text(_record_path(path), json.dumps(data, indent=2) + "\n")


def _hash_file(path: Path) -> dict[str, str]:
    """sha256, sha1 and git-blob sha1 of a file, in one pass."""
    size = path.stat().st_size
    sha256, sha1 = hashlib.sha256(), hashlib.sha1()
    git = hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            sha256.update(chunk)
            sha1.update(chunk)
            git.update(chunk)
    return {
        "sha256": sha256.hexdigest(),
        "sha1": sha1.hexdigest(),
        "git": git.hexdigest(),
    }


def _install(staged: Path, dest: Path, source: str, check: str, sha256: str) -> None:
    """Check the content of a downloaded file, then move it into place, drop
    any stand-in mark and write the record. Raises `IntegrityError` first if
    the content is not the book's file (nothing is installed then)."""
    from utils.standin import sidecar_path

    content = check_content(staged, dest.name)
    _record_path(dest).unlink(missing_ok=True)
    atomic_move(staged, dest)
    sidecar_path(dest).unlink(missing_ok=True)
    _write_record(
        dest, {"sha256": sha256, "checked": check, "source": source, "content": content}
    )


def install_file(staged: Path, dest: Path, source: str, check: str) -> None:
    """Check a file obtained another way (e.g. converted from the official
    checkpoints), move it to `dest` and record it as verified."""
    _install(staged, dest, source, check, _hash_file(staged)["sha256"])


def _size_str(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


@contextlib.contextmanager
def _exclusive(out: Path, name: str) -> Iterator[None]:
    """Hold the folder's lock file `.download.lock` (waits, saying so once,
    while another process downloads into `out`). It stays: deleting a lock
    file another process waits on would break the lock."""
    from filelock import FileLock, Timeout

    lock = FileLock(out / LOCK_NAME)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"{out / name}: another process is downloading into {out}; waiting")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _ensure_file(out: Path, name: str, endpoint: str, backup: str) -> None:
    dest = out / name
    if is_verified(dest):
        print(f"{dest}: already downloaded and verified")
        return
    with _exclusive(out, name):
        if is_verified(dest):  # another process finished it meanwhile
            print(f"{dest}: downloaded and verified by another process")
            return
        for stale in out.glob(temp_name_pattern(dest)):
            stale.unlink(missing_ok=True)
        _download(dest, endpoint, backup)


def _download(dest: Path, endpoint: str, backup: str) -> None:
    name = dest.name
    timeout = download_timeout()
    sources = [
        ("Hugging Face Hub", f"{endpoint}/{REPO_ID}/resolve/main/{name}", _from_hub),
        ("backup mirror", f"{backup}/{name}", _from_backup),
    ]
    attempts: list[tuple[str, str]] = []
    for label, url, fetch in sources:
        if attempts:
            print(f"{name}: trying the {label} ({url})")
        try:
            check = fetch(url, dest, endpoint, timeout)
        except Exception as exc:  # noqa: BLE001 - each source's error is reported
            message = f"{type(exc).__name__}: {exc}".strip()
            attempts.append((url, message.replace("\n", " ")[:500]))
            print(f"{name}: {label} failed: {attempts[-1][1][:200]}")
            continue
        size = _size_str(dest.stat().st_size)
        print(f"Saved {dest} ({size}, {check}) from the {label}: {url}")
        return
    raise DownloadError(name, attempts)


# --------------------------------------------------------------------------
# Source 1: Hugging Face Hub
# --------------------------------------------------------------------------


@contextlib.contextmanager
def _xet_setting_from_env() -> Iterator[None]:
    """Apply `HF_HUB_DISABLE_XET` as set now: huggingface_hub reads it only
    when first imported. Left alone when the variable is unset."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_DISABLE_XET")
    if value is None:
        yield
        return
    before = constants.HF_HUB_DISABLE_XET
    constants.HF_HUB_DISABLE_XET = value.strip().upper() in {"1", "ON", "YES", "TRUE"}
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_XET = before


def _bounded_bar() -> type:
    """A huggingface_hub progress bar class that ends a transfer whose server
    ignores HTTP Range and keeps dropping the connection: the library would
    restart from byte 0 for as long as some bytes arrive each time."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    class BoundedBar(hub_tqdm):
        restarts = 0

        def update(self, n: float | None = 1) -> bool | None:
            if n is not None and n < 0:  # the library rewinds: a restart
                self.restarts += 1
                if self.restarts >= _MAX_STALLS:
                    raise IntegrityError(
                        f"the server ignores HTTP Range and dropped the "
                        f"connection {self.restarts + 1} times; gave up"
                    )
            return super().update(n)

    return BoundedBar


def _from_hub(url: str, dest: Path, endpoint: str, timeout: float) -> str:
    """Fetch `dest.name` with huggingface_hub into `.<name>.hub/` beside it,
    check it against the size and ETag the Hub announced, then install it.

    Within a call the library resumes dropped connections itself. A file it
    finished stays in the staging folder until installed, so a run stopped
    before that reuses it without a new transfer (huggingface_hub discards a
    partial transfer, so across runs a file restarts from its first byte).
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download

    meta = get_hf_file_metadata(url, endpoint=endpoint, timeout=timeout)
    staging = dest.with_name(f".{dest.name}.hub")
    for leftover in staging.rglob("*.incomplete"):  # from a killed run
        leftover.unlink(missing_ok=True)
    try:
        with _xet_setting_from_env():
            staged = Path(
                hf_hub_download(
                    REPO_ID,
                    dest.name,
                    revision="main",
                    local_dir=staging,
                    endpoint=endpoint,
                    etag_timeout=timeout,
                    tqdm_class=_bounded_bar(),
                )
            )
    except BaseException:
        if not (staging / dest.name).is_file():  # nothing worth keeping
            shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        size = staged.stat().st_size
        if meta.size is not None and size != meta.size:
            raise IntegrityError(f"got {size} bytes, the Hub announced {meta.size}")
        hashes = _hash_file(staged)
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
    finally:  # installed, or not worth keeping: either way start clean
        shutil.rmtree(staging, ignore_errors=True)
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
        total, sha1 = _fetch_resumable(url, part, timeout)
        return _check_and_install(part, dest, url, total, sha1)
    except IntegrityError:
        part.unlink(missing_ok=True)
        if not resumed:
            raise
    total, sha1 = _fetch_resumable(url, part, timeout)
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
    hashes = _hash_file(part)
    if sha1 is not None and hashes["sha1"] != sha1:
        raise IntegrityError(f"content sha1 {hashes['sha1']} != announced {sha1}")
    check = "sha1 verified" if sha1 else "content checked (no hash announced)"
    _install(part, dest, url, check, hashes["sha256"])
    return check


def _fetch_resumable(
    url: str, part: Path, timeout: float
) -> tuple[int | None, str | None]:
    """Append the rest of `url` to `part`; retry dropped connections from where
    they stopped, with exponential backoff. Gives up after `_MAX_STALLS` tries
    in a row that bring no byte beyond the most the file ever had, or after
    `_MAX_REQUESTS` requests. Returns (total size, announced sha1)."""
    import requests
    from tqdm.auto import tqdm

    stalls = requests_made = 0
    best = part.stat().st_size if part.is_file() else 0
    bar = None
    try:
        while True:
            have = part.stat().st_size if part.is_file() else 0
            headers = {"Accept-Encoding": "identity"}
            if have:
                headers["Range"] = f"bytes={have}-"
            requests_made += 1
            try:
                with requests.get(
                    url, headers=headers, stream=True, timeout=(timeout, timeout)
                ) as r:
                    if r.status_code == 416:  # part is not a prefix of the file
                        part.unlink(missing_ok=True)
                        best = 0
                        raise requests.exceptions.ConnectionError("416 on resume")
                    r.raise_for_status()
                    total, mode = _plan_write(r, have)
                    sha1 = _announced_sha1(r.headers)
                    start = have if mode == "ab" else 0
                    if bar is None:
                        bar = tqdm(
                            total=total, initial=start, unit="B", unit_scale=True,
                            unit_divisor=1024, desc=part.name.removesuffix(".part"),
                        )  # fmt: skip
                    else:
                        bar.reset(total=total)
                        bar.update(start)
                    with part.open(mode) as f:
                        for chunk in r.iter_content(_CHUNK):
                            f.write(chunk)
                            bar.update(len(chunk))
                    return total, sha1
            except (
                requests.exceptions.ConnectionError,
                requests.exceptions.ChunkedEncodingError,
                requests.exceptions.Timeout,
            ):
                now = part.stat().st_size if part.is_file() else 0
                stalls = 0 if now > best else stalls + 1
                best = max(best, now)
                if stalls >= _MAX_STALLS or requests_made >= _MAX_REQUESTS:
                    raise
                time.sleep(min(_BACKOFF * 2 ** max(stalls - 1, 0), 30.0))
    finally:
        if bar is not None:
            bar.close()


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
