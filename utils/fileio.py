"""Write-then-rename: files appear under their final name only when complete.

A reader who interrupts a notebook (or a full disk) must never leave a
half-written file behind under a name that later code trusts.

What appears gets the modes the reader's umask gives a new file, as `cp`
and huggingface_hub do (0666 & ~umask for a file, 0777 & ~umask for a
folder: 0644/0755 under the usual 022, 0600/0700 under 077), so a server
running as another user can read an exported model exactly when the reader
lets it. Folders meant to be private (the kernel cache, the tests' own
folders) are made private by their owners, not here.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from utils.log import get_logger

_STALE = re.compile(r"(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}")


def umask() -> int:
    """The process's umask. Read from /proc on Linux (nothing changed);
    elsewhere set and put back at once (the only portable way to read it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets under the umask (0666 & ~umask)."""
    return 0o666 & ~umask()


def folder_mode() -> int:
    """The mode a new folder gets under the umask (0777 & ~umask)."""
    return 0o777 & ~umask()


def _set_file_mode(path: Path, mode: int | None = None) -> None:
    """Give the regular file `path` (never a link) the umask's file mode."""
    if stat.S_ISREG(os.lstat(path).st_mode):
        os.chmod(path, file_mode() if mode is None else mode)


def temp_name_pattern(path: str | os.PathLike) -> str:
    """Glob pattern of the temporary files `atomic_*` use next to `path`."""
    return f".{Path(path).name}.*.tmp"


def _temp_beside(path: Path) -> Path:
    """A new empty file `.<name>.<random>.tmp` beside `path`, made with
    0666 so the kernel applies the umask (mkstemp's 0600 would stick)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    while True:
        name = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(name, flags, 0o666))
        except FileExistsError:
            continue
        return name


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block ends without an
    error it is renamed to `path`, otherwise removed."""
    path = Path(path)
    tmp = _temp_beside(path)
    try:
        yield tmp
        _set_file_mode(tmp)
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
    _set_file_mode(src)
    os.replace(src, dest)
    return dest


def refuse_link(path: str | os.PathLike) -> Path:
    """`path`, or FileExistsError (one line) when it is a symbolic link. A
    folder written atomically takes its name's place: a link there is the
    reader's (never replaced) and points at a folder that may be someone
    else's (never written through); naming the target is the reader's call."""
    path = Path(path)
    if path.is_symlink():
        raise FileExistsError(
            f"{path} is a symbolic link (to {os.readlink(path)}); a link is "
            "neither replaced nor written through: name the folder it points "
            "to, or a new name."
        )
    return path


@contextmanager
def atomic_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a new private folder beside `path`; when the block ends without
    an error, everything in it gets the umask's modes and it takes the place
    of `path` (what was there is removed, or put back if that move fails);
    otherwise it is removed: a failure leaves nothing behind. A link at
    `path` is refused (`refuse_link`). Temporaries a killed earlier run
    left beside `path` are removed first (`_remove_stale`)."""
    path = refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path)
    tmp = _new_folder(path.parent, f".{path.name}.tmp-")
    try:
        yield tmp
        _give_modes(tmp)
        _replace_folder(tmp, path)
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:40] or "host"


def _new_folder(parent: Path, prefix: str) -> Path:
    """A new folder `<prefix><host>-<pid>-<random>` in `parent`, mode 0700
    while it is written (nobody reads a half-made folder)."""
    while True:
        name = parent / f"{prefix}{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(name, 0o700)
        except FileExistsError:
            continue
        return name


def _give_modes(folder: Path) -> None:
    """The umask's modes for `folder` and everything in it (links skipped,
    never followed): writers such as safetensors make their files 0600."""
    files, folders = file_mode(), folder_mode()
    for root, dirs, names in os.walk(folder):
        for name in names:
            _set_file_mode(Path(root, name), files)
        for name in dirs:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), folders)
    os.chmod(folder, folders)


def _process_gone(pid: int) -> bool:
    """Whether no process `pid` exists here (signal 0 checks, sends nothing)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


def _remove_stale(path: Path) -> None:
    """Remove the temporaries an `atomic_folder` for `path` that was killed
    (SIGKILL, power loss) left beside it, and only what is provably such a
    leftover: named `.<name>.tmp-<host>-<pid>-<random>` (or `.old-...`,
    only once `path` is a folder again) with this host's name, a folder
    (not a link) owned by this user, whose process is gone. POSIX only:
    elsewhere asking whether a process lives can end it."""
    if os.name != "posix" or not path.parent.is_dir():
        return
    kinds = ["tmp"] + (["old"] if path.is_dir() and not path.is_symlink() else [])
    for kind in kinds:
        prefix = f".{path.name}.{kind}-"
        for entry in os.scandir(path.parent):
            found = entry.name.startswith(prefix) and _STALE.fullmatch(
                entry.name[len(prefix) :]
            )
            if not found or found["host"] != _host():
                continue
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            if _process_gone(int(found["pid"])):
                shutil.rmtree(entry.path, ignore_errors=True)
                get_logger(__name__).info(
                    f"removed {entry.path}, left by a run that was stopped "
                    f"(process {found['pid']} is gone)"
                )


def _replace_folder(src: Path, dest: Path) -> None:
    """Move the finished folder `src` to `dest`, replacing what is there
    (moved aside first, deleted once `src` is in place); a link at `dest`
    is refused, never replaced."""
    refuse_link(dest)
    if not os.path.lexists(dest):
        os.replace(src, dest)
        return
    if dest.is_dir() and not any(dest.iterdir()):
        dest.rmdir()
        os.replace(src, dest)
        return
    old = _new_folder(dest.parent, f".{dest.name}.old-")
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
