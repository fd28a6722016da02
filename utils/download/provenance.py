"""Where a Qwen3 file came from and whether it can be trusted.

Three things live here, used by the download, the stand-in writers, the
importer of official checkpoints and the commands:

* verification records: `.<name>.verified.json` beside a file holds its
  sha256, size and modification/change times once its content was checked,
  so later calls trust it without a network request (`is_verified`); a file
  whose times changed is hashed and checked again first, unless it is a
  hard link to the verified copy in the model store its record names;
* stand-in markers: the sidecar `<name>.STANDIN.json` and the mark inside a
  stand-in checkpoint, so a stand-in is recognised even when copied without
  its sidecar (`is_standin`), and the banner that says one is in use;
* content checks: the weights load with `weights_only=True` into exactly the
  keys and shapes of the book's model (through `utils.models`, the one
  loader and shape check); the tokenizer is JSON with the Qwen3 vocabulary
  and added tokens; a web page or error message sent instead is named.

Nothing here makes a request or writes a file other than a record or a
stand-in's sidecar.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from utils.fileio import atomic_write_bytes, atomic_write_text
from utils.log import get_logger
from utils.qwen3_tokenizer import (
    NON_SPECIAL_ADDED_TOKENS,
    NUM_BPE_TOKENS,
    SPECIAL_TOKENS,
)

RECORD_VERSION = 2
SIDECAR_SUFFIX = ".STANDIN.json"
MARK_KEY = "qwen3_standin"  # key in a stand-in checkpoint's `_metadata`

# What the content checks expect. None: the book's QWEN_CONFIG_06_B (tests
# put a tiny config here).
MODEL_CONFIG: Mapping[str, Any] | None = None


def model_config() -> Mapping[str, Any] | None:
    """The config the content checks expect now (None: the book's)."""
    return MODEL_CONFIG


TOKENIZER_VOCAB = NUM_BPE_TOKENS  # BPE vocabulary; the added tokens follow it
ADDED_TOKENS = SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS  # ids 151643 onwards

log = get_logger("utils.download")  # one name for the package's lines

BANNER = (
    "*** STAND-IN WEIGHTS: random Qwen3-0.6B-shaped weights, not the real "
    "model. Shapes, memory and speed are real; generated text is gibberish. ***"
)


class IntegrityError(OSError):
    """A file is not what its source announced, or not the book's file."""


# --------------------------------------------------------------------------
# Stand-in markers
# --------------------------------------------------------------------------


def sidecar_path(path: str | os.PathLike) -> Path:
    """The marker file that labels `path` as a stand-in."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def write_sidecar(path: str | os.PathLike, **info: Any) -> None:
    """Label `path` a stand-in: its sidecar, with `info` (kind, seed, ...)."""
    record = {
        "standin": True,
        "what": "Offline stand-in, NOT the real Qwen3 file. "
        "Unset QWEN3_STANDIN and download again to get the real one.",
        **info,
    }
    atomic_write_bytes(sidecar_path(path), json.dumps(record, indent=2).encode())


def standin_mark(note: str) -> OrderedDict[str, Any]:
    """The `_metadata` of a stand-in checkpoint: the mark it carries inside
    (`load_state_dict` ignores it), so a copy without its sidecar is known."""
    return OrderedDict({MARK_KEY: {"standin": True, "note": note}})


def checkpoint_is_marked(path: str | os.PathLike) -> bool:
    """Whether `path` is a PyTorch checkpoint carrying the stand-in mark.
    Cheap (memory-mapped, tensors are not read); False for any other file."""
    from utils.models import CheckpointError, read_checkpoint

    try:
        if not zipfile.is_zipfile(path):
            return False
        sd = read_checkpoint(path)
    except (CheckpointError, OSError):
        return False
    meta = getattr(sd, "_metadata", None) or {}
    mark = meta.get(MARK_KEY) if isinstance(meta, Mapping) else None
    return isinstance(mark, Mapping) and bool(mark.get("standin"))


def is_standin(path: str | os.PathLike) -> bool:
    """Whether `path` is a stand-in: its sidecar exists, or (for a checkpoint
    copied without its sidecar) the mark inside the file says so."""
    return sidecar_path(path).is_file() or checkpoint_is_marked(path)


def print_standin_banner() -> None:
    """Show the one-line warning that stand-in weights are in use (on
    stderr, like every diagnostic: stdout holds only the reader's answer)."""
    log.warning(BANNER)


# --------------------------------------------------------------------------
# Content checks
# --------------------------------------------------------------------------


def sniff(raw: bytes) -> str | None:
    """Name what a server sent instead of the file, if it is recognisable."""
    head = raw[:2048].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "an HTML page (a proxy, captive portal or login page?)"
    if head.startswith(b"<?xml") or head.startswith(b"<error"):
        return "an XML error message"
    if head.startswith(b"{"):
        try:
            data = json.loads(raw[:100_000].decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            return None
        if isinstance(data, dict) and ("error" in data or "message" in data):
            detail = str(data.get("error") or data.get("message"))[:120]
            return f"a JSON error message ({detail})"
    return None


def check_checkpoint(
    path: str | os.PathLike, cfg: Mapping[str, Any] | None = None
) -> str:
    """Raise `IntegrityError` unless `path` is a PyTorch checkpoint that
    loads with `weights_only=True` into exactly the keys and shapes of
    `Qwen3Model(cfg)` (default `QWEN_CONFIG_06_B`) and is no stand-in.
    Memory-mapped: cheap. Returns what was checked, in a few words."""
    from utils.models import (
        CheckpointError,
        read_checkpoint,
        shape_problems,
        summarize_problems,
    )

    path = Path(path)
    if not zipfile.is_zipfile(path):
        with path.open("rb") as f:
            what = sniff(f.read(100_000))
        if what:
            raise IntegrityError(f"got {what} instead of the weights")
    try:
        sd = read_checkpoint(path)
    except CheckpointError as exc:  # "<path> is ...", "<path>: <why>"
        rest = str(exc).removeprefix(str(path))
        detail = f"does not load:{rest[1:]}" if rest.startswith(":") else rest
        raise IntegrityError(f"the file {detail.strip()}") from None
    meta = getattr(sd, "_metadata", None)
    if isinstance(meta, Mapping) and MARK_KEY in meta:
        raise IntegrityError("is an offline stand-in, not the real weights")
    problems = shape_problems(sd, cfg)
    if problems:
        raise IntegrityError(
            f"not the Qwen3 0.6B weights: {summarize_problems(problems)}"
        )
    return f"{len(sd)} tensors with the keys and shapes of Qwen3Model"


def check_tokenizer(path: str | os.PathLike) -> str:
    """Raise `IntegrityError` unless `path` is a tokenizer JSON with the Qwen3
    vocabulary size and the 26 added tokens at their ids. Content that passed
    once in this process passes again without a second parse (an import or a
    download checks the same bytes more than once; parsing is the slow part)."""
    raw = Path(path).read_bytes()
    key = (hashlib.sha256(raw).hexdigest(), TOKENIZER_VOCAB, tuple(ADDED_TOKENS))
    if key not in _TOKENIZERS_PASSED:
        _TOKENIZERS_PASSED[key] = _parse_tokenizer(raw)
    return _TOKENIZERS_PASSED[key]


_TOKENIZERS_PASSED: dict[tuple, str] = {}  # (sha256, vocab, added) -> summary


def _parse_tokenizer(raw: bytes) -> str:
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise IntegrityError(
            f"JSON nested too deeply to be a tokenizer ({len(raw):,} bytes)"
        ) from None
    except ValueError:
        what = sniff(raw)
        raise IntegrityError(
            f"got {what} instead of the tokenizer"
            if what
            else f"not valid JSON ({len(raw)} bytes; truncated or damaged download)"
        ) from None
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict):
        what = sniff(raw)
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


def record_path(path: str | os.PathLike) -> Path:
    """Where the verification record of `path` lives."""
    path = Path(path)
    return path.with_name(f".{path.name}.verified.json")


def _stat_fields(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def read_record(path: str | os.PathLike) -> dict[str, Any] | None:
    """The record of `path` if it is one for this file name, else None."""
    path = Path(path)
    try:
        record = json.loads(record_path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("file") != path.name:
        return None
    if not isinstance(record.get("sha256"), str):
        return None
    return record


def write_record(path: str | os.PathLike, info: Mapping[str, Any]) -> None:
    """Record `path` (as it is on disk now) as checked, with `info`."""
    path = Path(path)
    data = {
        **info,
        "version": RECORD_VERSION,
        "file": path.name,
        **_stat_fields(path),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_text(record_path(path), json.dumps(data, indent=2) + "\n")


def hash_file(path: str | os.PathLike) -> dict[str, str]:
    """sha256, sha1 and git-blob sha1 of a file, in one pass."""
    path = Path(path)
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


def is_verified(path: str | os.PathLike) -> bool:
    """True if `path` is a real (not stand-in) file whose content was checked.

    No request is made. The record must match the file's size; if its
    modification or change time differs too (copied, edited, restored, or a
    record from elsewhere), the sha256 and the content are checked again
    before the file is trusted, and the record is renewed.
    """
    path = Path(path)
    record = read_record(path)
    if record is None or not path.is_file() or is_standin(path):
        return False
    now = _stat_fields(path)
    if record.get("size") != now["size"]:
        return False
    if record.get("version") == RECORD_VERSION and all(
        record.get(k) == v for k, v in now.items()
    ):
        return True
    if _linked_to_verified(path, record):
        return True
    log.info(f"{path}: changed since it was verified; checking it again")
    if hash_file(path)["sha256"] != record["sha256"]:
        return False
    try:
        content = check_content(path)
    except IntegrityError:
        return False
    with contextlib.suppress(OSError):  # a read-only folder still verifies
        write_record(path, {**record, "content": content})
    return True


def _linked_to_verified(path: Path, record: Mapping[str, Any]) -> bool:
    """Whether `path` is a hard link to the stored file its record names
    (key "store", see `utils.download.store`) and that file is verified with
    the same sha256. A link made for another folder moves the change time
    the two names share, which is no change to the bytes; a write through
    either name fails the stored file's own check."""
    store = record.get("store")
    if not isinstance(store, str):
        return False
    stored = Path(store)
    try:
        if stored == path or not os.path.samefile(path, stored):
            return False
    except OSError:
        return False
    other = read_record(stored)
    if other is None or "store" in other or other["sha256"] != record["sha256"]:
        return False
    return is_verified(stored)
