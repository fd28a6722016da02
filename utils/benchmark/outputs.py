"""Files a command writes where the reader asked (`--json`, `--csv`, `--plot`).

Checked before minutes of work, so a bad path never costs a whole run:
`check_output_path` says in one line why a path cannot take the output,
after a real probe of its folder (a temporary file made and removed: the
permission bits say "writable" for root in /proc, and nothing there can be
created; one block written, so a full disk is said too). `write_output`
then writes (and a write that fails, on a disk that filled up meanwhile,
is one line naming the flag and the file):

* through to a character device or a FIFO the reader named, directly or by a
  symbolic link (`--json /dev/stdout`, a link to `/proc/self/fd/1`, a named
  pipe): the device stays what it is;
* a regular file (or a new name) is replaced atomically (`utils.fileio`);
* anything else (a link to a file, a folder, a socket) is refused: a path
  that is not a regular file is never replaced.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from utils.errors import UsageError
from utils.fileio import atomic_write_bytes

_PLOT_DEFAULT_FORMAT = "png"
_PROBE_BYTES = 4096  # one block: what a full disk refuses
_HINT = "name a file in a folder you can write to"
_HINTS = {
    errno.ENOSPC: "free some space there or name a file on another disk",
    getattr(errno, "EDQUOT", errno.ENOSPC): "free some of your disk quota "
    "or name a file on another disk",
    errno.EROFS: "name a file on a disk that is not read-only",
}


def _kind(path: Path, flag: str) -> str:
    """What `path` is for writing: "device" (a character device or FIFO,
    through links) or "file" (a regular file, or nothing yet); ValueError
    naming what else it is."""
    try:
        here = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # a new name
        return "file"
    if stat.S_ISLNK(here.st_mode):
        target = os.path.realpath(path)
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise ValueError(
                f"{flag} {path} is a symbolic link to {target}, which does not "
                "exist; name a regular file instead"
            ) from None
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            return "device"
        raise ValueError(
            f"{flag} {path} is a symbolic link (to {target}); it is not "
            "replaced: name the file itself, or a new name"
        )
    if stat.S_ISCHR(here.st_mode) or stat.S_ISFIFO(here.st_mode):
        return "device"
    if stat.S_ISDIR(here.st_mode):
        raise ValueError(f"{flag} {path} is a folder; give a file name")
    if not stat.S_ISREG(here.st_mode):
        raise ValueError(f"{flag} {path} is not a regular file; name a file")
    return "file"


def _probe_folder(path: Path, flag: str) -> None:
    """Make, fill with one block and remove a temporary file in the nearest
    existing folder of `path` (the folders below it are made when the file
    is written): a read-only folder and a full disk are said before a run."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: {folder} is a file, not a folder")
    name = None
    try:  # a full disk still makes an empty file: write a block too
        fd, name = tempfile.mkstemp(dir=folder, prefix=".probe-", suffix=".tmp")
        with os.fdopen(fd, "wb") as probe:
            probe.write(bytes(_PROBE_BYTES))
    except OSError as exc:
        raise ValueError(
            f"{flag} {path}: cannot write into {folder} ({exc.strerror}); "
            f"{_HINTS.get(exc.errno, _HINT)}"
        ) from None
    finally:
        if name is not None:
            os.unlink(name)


def _probe_device(path: Path, flag: str) -> None:
    """Open a character device for writing and close it; a FIFO is not
    opened (that would block for a reader, or end the reader's input)."""
    if stat.S_ISFIFO(os.stat(path).st_mode):
        if not os.access(path, os.W_OK):
            raise ValueError(f"{flag} {path}: the pipe cannot be written")
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NOCTTY))
    except OSError as exc:
        raise ValueError(
            f"{flag} {path}: cannot write to it ({exc.strerror})"
        ) from None


def check_output_path(path: str | os.PathLike, flag: str) -> Path:
    """Raise ValueError (one line, naming `flag`) unless `path` can take a
    command's output: a device or FIFO it writes through to, or a regular
    file or new name in a folder where a file can really be made."""
    path = Path(path)
    if _kind(path, flag) == "device":
        _probe_device(path, flag)
    else:
        _probe_folder(path, flag)
    return path


def plot_format(path: str | os.PathLike, flag: str = "--plot") -> str:
    """The image format `path`'s suffix names (png without one); ValueError
    listing matplotlib's formats when it has none of that name."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lower().lstrip(".")
    if not suffix:
        return _PLOT_DEFAULT_FORMAT
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise ValueError(
            f"{flag} {path}: matplotlib cannot write .{suffix} images; end the "
            f"name in one of: {', '.join('.' + f for f in sorted(formats))}"
        )
    return suffix


def write_output(path: str | os.PathLike, data: bytes, flag: str = "output") -> Path:
    """Write `data` through to a device or FIFO, or replace a regular file
    atomically; refuse any other kind of path (see the module docstring). A
    failed write (a full disk) is one `UsageError` line naming `flag` and
    the file."""
    path = Path(path)
    try:
        if _kind(path, flag) == "file":
            return atomic_write_bytes(path, data)
        _write_through(path, data)
    except OSError as exc:
        raise UsageError(
            f"{flag} {path}: could not write it ({exc.strerror or exc}); "
            f"{_HINTS.get(exc.errno, _HINT)}, then run again (a file there is "
            "left as it was)"
        ) from None
    return path


def _write_through(path: Path, data: bytes) -> None:
    """Write `data` to the device or FIFO at `path` (no rename)."""
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
