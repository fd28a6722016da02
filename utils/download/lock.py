"""One lock per model file, with a wait that ends.

Why: two processes (the English and the Chinese notebook, a command beside
them) may want the same file in the same folder; one downloads, the other
waits and then uses it. The lock is per file (`.<name>.lock` beside it), so
a process that needs only the tokenizer does not wait for another's 1.5 GB
of weights. The holder writes its process id into the lock file and touches
it every second from a thread; a waiter watches that and the holder's
working files (`.part`, the Hub staging folder, temporary copies) and gives
up, naming the holder and what to do, once neither has changed for
`patience()` seconds: a holder stopped with Ctrl-Z (SIGSTOP) must not keep
the other waiting forever (a hung transfer ends by the download's own
watchdog). A failed
holder removes its lock file; filelock re-checks after locking that the
file it locked is still the one at that path, so a waiter tries again.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from utils import linksafe
from utils.log import get_logger

__all__ = ["HolderStuckError", "held", "lock_path", "patience"]

log = get_logger("utils.download")  # one name for the package's lines

PATIENCE = 60.0  # seconds without a sign of life of the holder before giving up
BEAT = 1.0  # seconds between the holder's signs of life
_POLL = 0.5  # seconds between looks at the holder's progress


class HolderStuckError(TimeoutError):
    """Another process holds a file's lock and has made no progress."""


def lock_path(folder: Path, name: str) -> Path:
    """The lock file of `folder/name`: `.<name>.lock` beside it."""
    return folder / f".{name}.lock"


def patience() -> float:
    """Seconds a waiter accepts without a sign of life of the holder (module
    setting `PATIENCE`: many of its beats, so a busy machine that runs the
    holder late is no reason to give up)."""
    return PATIENCE


@contextlib.contextmanager
def held(
    folder: Path, name: str, progress: Callable[[], object] = lambda: None
) -> Iterator[None]:
    """Hold the lock of `folder/name`, waiting (said once) while another
    process holds it and `progress()` (a fingerprint of its working files)
    or its beat keeps changing; `HolderStuckError` after `patience()`
    seconds without a change. After a failure inside the block the lock
    file goes; a folder removed meanwhile is made again; a link planted at
    the lock's name is removed first (filelock refuses to open one)."""
    path = lock_path(folder, name)
    lock = _acquire(folder, name, lambda: (_beat_time(path), progress()))
    with contextlib.suppress(OSError):  # then waiters cannot name us
        _write_pid(path)
    done = threading.Event()
    beating = threading.Thread(target=_beat, args=(path, done), daemon=True)
    beating.start()
    try:
        yield
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        done.set()
        beating.join()
        with contextlib.suppress(OSError):
            _write_pid(path, "")
        lock.release()


def _beat(path: Path, done: threading.Event) -> None:
    """Touch the held lock file every `BEAT` seconds: a sign of life that a
    stopped (or frozen) process does not give, whatever its work shows on
    disk (a hash, a Xet transfer, a copy)."""
    nofollow = os.utime in os.supports_follow_symlinks
    while not done.wait(BEAT):
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=not nofollow)


def _beat_time(path: Path) -> int | None:
    with contextlib.suppress(OSError):
        return os.lstat(path).st_mtime_ns
    return None


def _acquire(folder: Path, name: str, progress: Callable[[], object]) -> object:
    from filelock import FileLock, Timeout

    path = lock_path(folder, name)
    said, races = False, 0
    seen, since = progress(), time.monotonic()
    while True:
        lock = FileLock(path)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            linksafe.clear_planted(path)
            lock.acquire(timeout=_POLL if said else 0)
            return lock
        except Timeout:
            now = progress()
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > patience():
                raise HolderStuckError(_stuck_text(folder / name, path)) from None
            if not said:
                log.info(f"{folder / name}: {_holder(path)} is getting it; waiting")
            said = True
        except (FileNotFoundError, FileExistsError):
            # A failed run removed the empty folder while we (or filelock's
            # poll loop, which makes the folder again) looked at it: pathlib's
            # mkdir(exist_ok=True) then says "exists" for a folder now gone.
            races += 1
            if races > 20 or (folder.exists() and not folder.is_dir()):
                raise
            time.sleep(0.01 * races)


def _write_pid(path: Path, text: str | None = None) -> None:
    """Write this process's id (or `text`) into the held lock file, never
    through a link."""
    flags = os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n" if text is None else text)


def _holder_pid(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def _holder(path: Path) -> str:
    pid = _holder_pid(path)
    return "another process" if pid is None else f"process {pid}"


def _stuck_text(dest: Path, path: Path) -> str:
    pid = _holder_pid(path)
    who = _holder(path)
    state = " (it is stopped)" if pid is not None and _stopped(pid) else ""
    what = (
        f"resume it (`kill -CONT {pid}`, or `fg` in its terminal) or end it "
        f"(`kill {pid}`)"
        if pid is not None
        else f"end the process that holds {path}"
    )
    return (
        f"{dest}: {who}{state} holds its lock and has made no progress for "
        f"{patience():g} s; {what}, then run this again"
    )


def _stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (Linux's /proc; False elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["T"]
