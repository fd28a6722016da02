"""The download's working files, never written through a link.

A download folder may be shared, world-writable, or unpacked from an archive
that ships symbolic links. A link planted under one of the names the
download works with (`<name>.part`, the Hub staging folder `.<name>.hub`,
a lock file `.<name>.lock`) would make a plain `open` append the weights
to the link's target, or make a cleanup recurse into and delete from the
folder it points to. So: such a link is removed (the link only, never its
target) with one line naming it; partial files are opened with `O_NOFOLLOW`
(and `O_EXCL` when new); a leftover folder is removed only when it is a real
folder (`shutil.rmtree` never follows the links inside one).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

from utils.log import get_logger

__all__ = [
    "clear_planted",
    "lexists",
    "open_part",
    "part_size",
    "prepare_folder",
    "remove_leftover",
    "untrusted_reason",
]

log = get_logger(__name__)

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a planted FIFO cannot block the open
_FLAGS = ("O_NOFOLLOW", "O_CLOEXEC")  # where the system has them
_BASE = os.O_WRONLY | _NONBLOCK | sum(getattr(os, flag, 0) for flag in _FLAGS)


def lexists(path: Path) -> bool:
    """Whether anything is at `path`, a dangling link included."""
    return os.path.lexists(path)


def _say_removed(path: Path, what: str) -> None:
    log.warning(
        f"{path}: removed {what} that the download did not make "
        "(it never writes through links; whatever it pointed to was not touched)"
    )


def clear_planted(path: Path) -> None:
    """Remove a symbolic link at `path` (the link, not its target), or a
    file there that is not a plain file of its own (a FIFO, a device, a hard
    link shared with another name), saying so in one line. A plain file or
    a real folder stays."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        path.unlink()
        _say_removed(path, f"a symbolic link (to {target})")
    elif stat.S_ISDIR(st.st_mode):
        return
    elif not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        path.unlink()
        _say_removed(path, "a file with other names, or not a plain file,")


def part_size(part: Path) -> int:
    """Bytes in the partial file `part` (0 if it is missing, or not a plain
    file)."""
    try:
        st = os.lstat(part)
    except FileNotFoundError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def open_part(part: Path, append: bool) -> BinaryIO:
    """Open the partial file `part` for writing without following a link:
    to append to it (it must be a plain file with one name), or new, made
    here with `O_EXCL` (an earlier one is removed first, never truncated in
    place, so a hard link elsewhere keeps its bytes)."""
    if append:
        fd = os.open(part, _BASE | os.O_APPEND)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise FileExistsError(f"{part} is not a plain file of its own")
    else:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
        fd = os.open(part, _BASE | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return os.fdopen(fd, "ab" if append else "wb")


def prepare_folder(folder: Path) -> None:
    """Make `folder` a real folder of this download's: a link there is
    removed (not followed), a folder holding links is discarded (what it
    held may have been planted), a file in its place is removed; then the
    folder is made if missing."""
    clear_planted(folder)
    if folder.is_dir() and _holds_links(folder):
        shutil.rmtree(folder)
        _say_removed(folder, "a folder holding symbolic links")
    elif lexists(folder) and not folder.is_dir():
        folder.unlink()
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o755)


def _holds_links(folder: Path) -> bool:
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            if os.path.islink(os.path.join(root, name)):
                return True
    return False


def remove_leftover(path: Path) -> None:
    """Remove what an earlier try left at `path`: a link (only the link),
    a file, or a real folder with everything in it (links inside it are
    removed, never followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


# --------------------------------------------------------------------------
# Folders another user could change
# --------------------------------------------------------------------------


def untrusted_reason(folder: str | os.PathLike) -> str | None:
    """Why a file in `folder` (which need not exist yet) could be swapped by
    another user, or None where it cannot: the one rule for every cache and
    store that later code loads, links or reuses.

    Each folder on the way down from `/` to `folder` (as written, and as its
    links resolve) must belong to this user or to root, and must not be
    writable by anyone else. A sticky folder writable by all (`/tmp`) is fine
    as long as the next folder in the path is this user's or root's: only
    its owner may rename or remove it there. A link on the way must belong
    to this user or root. None on systems without user ids (Windows)."""
    if not hasattr(os, "getuid"):
        return None
    path = Path(os.path.abspath(folder))
    for chain in (path, Path(os.path.realpath(path))):
        reason = _chain_reason(chain)
        if reason is not None:
            return reason
    return None


def _chain_reason(path: Path) -> str | None:
    """`untrusted_reason` for the components of one absolute path, from the
    root down to the deepest one that exists."""
    uid = os.getuid()
    above: tuple[Path, os.stat_result] | None = None  # the folder checked last
    for part in [*reversed(path.parents), path]:
        try:
            st = os.lstat(part)
        except (FileNotFoundError, NotADirectoryError):
            break  # made later, or a file in the way: said where it is made
        except OSError as exc:  # e.g. no permission to look
            return f"{part} cannot be examined ({exc.strerror})"
        if st.st_uid not in (0, uid):
            return f"{part} belongs to another user (uid {st.st_uid})"
        if above is not None and _others_may_write(above[1], child_ours=True):
            return _writable(*above)
        above = (part, st)
    if above is not None and _others_may_write(above[1], child_ours=False):
        return _writable(*above)
    return None


def _others_may_write(st: os.stat_result, child_ours: bool) -> bool:
    """Whether users other than this one may add, rename or remove entries
    of a folder with status `st` (a sticky folder protects entries that are
    this user's or root's, `child_ours`)."""
    if not stat.S_ISDIR(st.st_mode):
        return False
    if st.st_mode & stat.S_ISVTX and child_ours:
        return False
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and not _private_group(st.st_gid)


def _private_group(gid: int) -> bool:
    """Whether group `gid` is this user's own group with nobody else in it
    (the "user private group" many systems give each account)."""
    import grp
    import pwd

    try:
        user = pwd.getpwuid(os.getuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == os.getgid() and group.gr_name == user and set(group.gr_mem) <= {user}


def _writable(folder: Path, st: os.stat_result) -> str:
    return f"{folder} can be written by other users (mode {stat.S_IMODE(st.st_mode):o})"
