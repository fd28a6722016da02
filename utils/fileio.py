"""Write-then-rename: files appear under their final name only when complete.

A reader who interrupts a notebook (or a full disk) must never leave a
half-written file behind under a name that later code trusts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def temp_name_pattern(path: str | os.PathLike) -> str:
    """Glob pattern of the temporary files `atomic_*` use next to `path`."""
    return f".{Path(path).name}.*.tmp"


def _temp_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    return Path(name)


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends without an
    error it is renamed to `path`, otherwise removed."""
    path = Path(path)
    tmp = _temp_beside(path)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file and a rename."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` as UTF-8 to `path` through a temporary file and a rename."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_place(src: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Make `dest` show the content of `src` without copying where possible:
    a hard link, else a symbolic link, else a copy; then one rename."""
    src, dest = Path(src), Path(dest)
    tmp = _temp_beside(dest)
    tmp.unlink()
    try:
        try:
            os.link(src, tmp)
        except OSError:
            try:
                os.symlink(src.resolve(), tmp)
            except OSError:
                shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def atomic_move(src: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Move a finished file into place in one rename (same file system)."""
    src, dest = Path(src), Path(dest)
    os.chmod(src, 0o644)
    os.replace(src, dest)
    return dest


@contextmanager
def atomic_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a new temporary folder beside `path`; when the block ends
    without an error it takes the place of `path` (what was there is
    removed, or put back if that move fails), otherwise it is removed: a
    failure leaves nothing behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        _replace_folder(tmp, path)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)


def _replace_folder(src: Path, dest: Path) -> None:
    """Move the finished folder `src` to `dest`, replacing what is there
    (moved aside first, deleted once `src` is in place)."""
    if not os.path.lexists(dest):
        os.replace(src, dest)
        return
    if dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir()):
        dest.rmdir()
        os.replace(src, dest)
        return
    old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old."))
    old.rmdir()
    os.replace(dest, old)
    try:
        os.replace(src, dest)
    except BaseException:
        os.replace(old, dest)  # put the previous content back
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)
