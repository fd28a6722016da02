"""One verified copy of each model file per user, shared by every folder.

Why: the English notebooks, the Chinese ones and the commands each asked
for the files in a folder of their own, so a reader downloaded the same
1.5 GB three times. Now `utils.download` fetches into this store
(`QWEN3_MODEL_STORE`, default `<cache>/models`, where `<cache>` is
`$XDG_CACHE_HOME/qwen3-ch02` or `~/.cache/qwen3-ch02`) and `place` puts a
verified file into the folder the reader asked for: a hard link where the
file system allows it (no second copy on disk), else a copy checked
against the stored file's sha256 while it is written. The verification
record goes with it; a linked file's record names the stored file, so a
link made later for another folder (which changes the shared file's
change time) does not make the others look modified.

Stand-ins never come here (stand-in mode returns before any download), and
only files that passed the download's checks are stored.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import utils.download.provenance as provenance
from utils import linksafe, settings
from utils.download.provenance import IntegrityError

__all__ = ["STORE_ENV", "StoreUnusableError", "place", "store_dir"]

STORE_ENV = "QWEN3_MODEL_STORE"

_CHUNK = 1 << 20


class StoreUnusableError(OSError):
    """The store cannot hold the files and no other folder was asked for."""


def store_dir() -> Path:
    """The store: `QWEN3_MODEL_STORE`, else `<cache>/models`."""
    root = settings.text(STORE_ENV)
    return Path(root).expanduser() if root else settings.cache_root() / "models"


def place(stored: Path, dest: Path) -> str:
    """Put the verified file `stored` at `dest` with a verification record
    beside it; "linked" (a hard link) or "copied" (where links fail, or the
    store is read-only, so its record cannot be renewed). The file appears
    under its name in one rename, replacing whatever was there (a link
    there is replaced, never written through). The caller holds the locks
    of both folders and has just checked `stored`."""
    record = provenance.read_record(stored)
    if record is None:
        raise IntegrityError(f"{stored} has no verification record")
    info = {
        k: record[k] for k in ("sha256", "checked", "source", "content") if k in record
    }
    tmp = _free_name(dest)
    try:
        linked = _link(stored, tmp)
        if not linked:
            _checked_copy(stored, tmp, record["sha256"])
        provenance.record_path(dest).unlink(missing_ok=True)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    provenance.sidecar_path(dest).unlink(missing_ok=True)
    if not linked:
        provenance.write_record(dest, info)
        return "copied"
    provenance.write_record(stored, info)  # its change time moved with the link
    provenance.write_record(dest, {**info, "store": str(stored)})
    return "linked"


def _free_name(dest: Path) -> Path:
    """A name beside `dest` that nothing has (the pattern the download's
    cleanup knows: `.<name>.*.tmp`)."""
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    os.unlink(name)
    return Path(name)


def _link(stored: Path, tmp: Path) -> bool:
    """Hard-link `stored` as `tmp`, if the store is writable (a link changes
    the stored file's change time, so its record must be renewed)."""
    if not os.access(stored.parent, os.W_OK):
        return False
    try:
        os.link(stored, tmp)
    except OSError:
        return False
    return True


def _checked_copy(stored: Path, tmp: Path, sha256: str) -> None:
    """Copy `stored` to the new file `tmp`, hashing as it goes; raise
    `IntegrityError` if the bytes are not the ones recorded."""
    digest = hashlib.sha256()
    with stored.open("rb") as src, linksafe.open_part(tmp, append=False) as out:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise IntegrityError(f"{stored} changed while it was copied; run again")
