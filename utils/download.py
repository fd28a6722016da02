"""Get the book's Qwen3 0.6B files: tokenizer JSON and `.pth` weights.

`download_qwen3_small` tries two sources, file by file:

1. the Hugging Face repo `rasbt/qwen3-from-scratch` through `huggingface_hub`
   (honours `HF_ENDPOINT`, read at call time, so mirrors work);
2. the book's backup mirror on Backblaze B2, over plain HTTPS with `requests`,
   resuming an interrupted download from `<name>.part` with HTTP Range.

A file only ever appears under its final name once it is complete and its size
and (when the source publishes one) its hash have been checked. A small record
`.<name>.verified.json` next to it lets later calls skip the network entirely.
With `QWEN3_STANDIN=1` no request is made: offline stand-ins are written instead
(see `utils.standin`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ID = "rasbt/qwen3-from-scratch"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
BACKUP_URL = "https://f001.backblazeb2.com/file/reasoning-from-scratch/qwen3-0.6B"
BACKUP_URL_ENV = "QWEN3_BACKUP_URL"
KINDS = ("base", "reasoning")
RECORD_VERSION = 1

_CHUNK = 1 << 16  # small reads: a dropped connection loses at most this much
_TIMEOUT = (15, 60)  # (connect, read) seconds for the backup mirror
_MAX_STALLED_TRIES = 3  # backup: give up after this many tries without progress
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")

_HINTS = """\
What you can try:
  * Behind a proxy: set HTTPS_PROXY / HTTP_PROXY. If your network inspects TLS
    (company certificate), point REQUESTS_CA_BUNDLE and SSL_CERT_FILE at a CA
    bundle that contains that certificate.
  * Hugging Face blocked or slow where you are (e.g. mainland China): set
    HF_ENDPOINT to a Hugging Face mirror, e.g. HF_ENDPOINT=https://hf-mirror.com
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


class DownloadError(RuntimeError):
    """No source could deliver a file; the message lists each URL tried."""

    def __init__(self, name: str, attempts: list[tuple[str, str]]) -> None:
        self.name = name
        self.attempts = list(attempts)
        tried = "\n".join(f"  - {url}\n      {err}" for url, err in attempts)
        super().__init__(
            f"Could not download {name} from any source. Tried:\n{tried}\n{_HINTS}"
        )


class IntegrityError(OSError):
    """A downloaded file does not match the size or hash its source announced."""


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
    """Make the Qwen3 0.6B tokenizer (and weights) for `kind` available in `out_dir`.

    kind: "base" or "reasoning". Files already present with a valid verification
    record are used without any network request. Otherwise the Hugging Face repo
    `rasbt/qwen3-from-scratch` is tried (at `HF_ENDPOINT` if set), then the book's
    backup mirror; `backup_url` (or env `QWEN3_BACKUP_URL`) replaces the mirror's
    base URL. With `QWEN3_STANDIN=1`, offline stand-ins are written instead (no
    network; returns `standin=True`; real files there are replaced by stand-ins).
    Raises `DownloadError`, listing each URL tried, if all sources fail.
    """
    tok_name, model_name = file_names(kind)
    from utils import standin  # imports torch: only when called

    out = Path(out_dir)
    names = [tok_name] if tokenizer_only else [tok_name, model_name]

    if standin.standin_enabled():
        return _write_standins(
            out, kind, tok_name, None if tokenizer_only else model_name
        )

    out.mkdir(parents=True, exist_ok=True)
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
    backup = (backup_url or os.environ.get(BACKUP_URL_ENV) or BACKUP_URL).rstrip("/")
    for name in names:
        _ensure_file(out, name, endpoint, backup)
    return Qwen3Files(
        tokenizer=out / tok_name,
        model=None if tokenizer_only else out / model_name,
        standin=False,
    )


# --------------------------------------------------------------------------
# Stand-ins
# --------------------------------------------------------------------------


def _write_standins(
    out: Path, kind: str, tok_name: str, model_name: str | None
) -> Qwen3Files:
    from utils import standin

    standin.print_standin_banner()
    tok = out / tok_name
    if not (tok.is_file() and standin.is_standin(tok)):
        _record_path(tok).unlink(missing_ok=True)  # never leave a "verified" mark
        standin.write_standin_tokenizer(tok, kind)
    model = None
    if model_name is not None:
        model = out / model_name
        if not (model.is_file() and standin.is_standin(model)):
            _record_path(model).unlink(missing_ok=True)
            standin.write_standin_weights(model, kind)
    print(f"Stand-in files in {out}/ (no download; QWEN3_STANDIN is set)")
    return Qwen3Files(tokenizer=tok, model=model, standin=True)


# --------------------------------------------------------------------------
# Verification records
# --------------------------------------------------------------------------


def _record_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.verified.json")


def is_verified(path: str | os.PathLike) -> bool:
    """True if `path` is a real (not stand-in) file whose size matches the
    record written when it was downloaded and checked. Makes no request."""
    from utils.standin import is_standin

    path = Path(path)
    if not path.is_file() or is_standin(path):
        return False
    try:
        record = json.loads(_record_path(path).read_text())
        return (
            record.get("version") == RECORD_VERSION
            and record.get("file") == path.name
            and record.get("size") == path.stat().st_size
            and isinstance(record.get("sha256"), str)
        )
    except (OSError, ValueError, AttributeError):
        return False


def _hash_file(path: Path) -> dict[str, str]:
    """sha256, sha1 and git-blob sha1 of a file, in one pass."""
    size = path.stat().st_size
    sha256, sha1 = hashlib.sha256(), hashlib.sha1()
    git = hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            sha256.update(chunk)
            sha1.update(chunk)
            git.update(chunk)
    return {
        "sha256": sha256.hexdigest(),
        "sha1": sha1.hexdigest(),
        "git": git.hexdigest(),
    }


def _install(staged: Path, dest: Path, source: str, check: str, sha256: str) -> None:
    """Move a checked file into place, drop any stand-in mark, write the record."""
    from utils.standin import sidecar_path

    record = _record_path(dest)
    record.unlink(missing_ok=True)
    size = staged.stat().st_size
    os.chmod(staged, 0o644)
    os.replace(staged, dest)
    sidecar_path(dest).unlink(missing_ok=True)
    data = {
        "version": RECORD_VERSION,
        "file": dest.name,
        "size": size,
        "sha256": sha256,
        "checked": check,
        "source": source,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, record)


def _size_str(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _ensure_file(out: Path, name: str, endpoint: str, backup: str) -> None:
    dest = out / name
    if is_verified(dest):
        print(f"{dest}: already downloaded and verified")
        return
    sources = [
        ("Hugging Face Hub", f"{endpoint}/{REPO_ID}/resolve/main/{name}", _from_hub),
        ("backup mirror", f"{backup}/{name}", _from_backup),
    ]
    attempts: list[tuple[str, str]] = []
    for label, url, fetch in sources:
        if attempts:
            print(f"{name}: trying the {label} ({url})")
        try:
            check = fetch(url, dest, endpoint)
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


def _from_hub(url: str, dest: Path, endpoint: str) -> str:
    """Fetch `dest.name` with huggingface_hub into a private staging folder,
    check it against the size and ETag the Hub announced, then install it."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download

    meta = get_hf_file_metadata(url, endpoint=endpoint)
    staging = dest.parent / f".hub-staging-{os.getpid()}"
    try:
        staged = Path(
            hf_hub_download(
                REPO_ID,
                dest.name,
                revision="main",
                local_dir=staging,
                endpoint=endpoint,
                force_download=True,
            )
        )
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
        return check
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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


def _from_backup(url: str, dest: Path, endpoint: str) -> str:
    """Download `url` into `<name>.part` (resuming with Range), check size and
    announced sha1, then install it. A fresh start is tried once if a resumed
    file fails the check."""
    part = dest.with_name(dest.name + ".part")
    resumed = part.is_file() and part.stat().st_size > 0
    try:
        total, sha1 = _fetch_resumable(url, part)
        return _check_and_install(part, dest, url, total, sha1)
    except IntegrityError:
        part.unlink(missing_ok=True)
        if not resumed:
            raise
    total, sha1 = _fetch_resumable(url, part)
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
    check = "sha1 verified" if sha1 else "size verified (no hash announced)"
    _install(part, dest, url, check, hashes["sha256"])
    return check


def _fetch_resumable(url: str, part: Path) -> tuple[int | None, str | None]:
    """Append the rest of `url` to `part`; retry dropped connections from where
    they stopped. Returns (total size, announced sha1), either may be None."""
    import requests
    from tqdm.auto import tqdm

    stalled = 0
    bar = None
    try:
        while True:
            have = part.stat().st_size if part.is_file() else 0
            headers = {"Accept-Encoding": "identity"}
            if have:
                headers["Range"] = f"bytes={have}-"
            got = 0
            try:
                with requests.get(
                    url, headers=headers, stream=True, timeout=_TIMEOUT
                ) as r:
                    if r.status_code == 416:  # part is not a prefix of the file
                        part.unlink(missing_ok=True)
                        stalled += 1
                        if stalled >= _MAX_STALLED_TRIES:
                            r.raise_for_status()
                        continue
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
                            got += len(chunk)
                            bar.update(len(chunk))
                    return total, sha1
            except (
                requests.exceptions.ConnectionError,
                requests.exceptions.ChunkedEncodingError,
                requests.exceptions.Timeout,
            ):
                stalled = 0 if got else stalled + 1
                if stalled >= _MAX_STALLED_TRIES:
                    raise
                time.sleep(0.5 * stalled)
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
