"""utils.download_lock: one lock per model file, and a wait that ends when
the holder makes no progress (stopped with SIGSTOP, hung), naming it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.download_helpers import MODEL, TOK
from utils import linksafe
from utils.download import lock as download_lock
from utils.download.fetch import download_qwen3_small

# the tiny content checks and a store of each test's own (conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_expectations", "store")

REPO = Path(__file__).resolve().parents[1]

HOLDER = """
    import sys, time
    from pathlib import Path
    from utils import linksafe
    from utils.download import lock as download_lock
    folder, name, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    with download_lock.held(folder, name):
        print("held", flush=True)
        for _ in range(steps):  # a download that makes progress
            time.sleep(0.2)
            with (folder / (name + ".part")).open("ab") as part:
                part.write(b"x")
        time.sleep(3600 if steps == 0 else -steps if steps < 0 else 0)
"""


@pytest.fixture
def holder():
    """Start a process that holds the lock of folder/name (`steps` bytes of
    progress, 0: none, ever; -n: none, for n seconds, then it is done); it
    is ended afterwards."""
    started: list[subprocess.Popen] = []

    def start(folder: Path, name: str, steps: int = 0) -> subprocess.Popen:
        code = textwrap.dedent(HOLDER)
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(folder), name, str(steps)],
            cwd=REPO, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in started:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def in_thread(fn, seconds: float = 60.0):
    """Run `fn` in a thread; its result or exception (a wait that does not
    end fails the test instead of hanging it)."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the wait did not end"
    return out


def test_a_stopped_holder_ends_the_wait_naming_it(tmp_path, holder, monkeypatch):
    monkeypatch.setattr(download_lock, "PATIENCE", 1.0)
    proc = holder(tmp_path, TOK, steps=1000)
    proc.send_signal(signal.SIGSTOP)

    def wait() -> None:
        with download_lock.held(tmp_path, TOK):
            pass

    error = in_thread(wait)["error"]
    assert isinstance(error, download_lock.HolderStuckError)
    text = str(error)
    assert text.startswith(
        f"{tmp_path / TOK}: process {proc.pid} (it is stopped) holds its lock "
        "and has made no progress for 1 s"
    )
    assert f"kill -CONT {proc.pid}" in text and f"kill {proc.pid}" in text


def test_a_holder_that_makes_progress_is_waited_for(tmp_path, holder, monkeypatch):
    """Longer than the patience in all, but never that long without a new
    byte in its `.part`: the waiter gets the lock once it is done."""
    monkeypatch.setattr(download_lock, "PATIENCE", 1.0)
    holder(tmp_path, TOK, steps=15)
    seen: list[int] = []

    def progress() -> int:
        seen.append(1)
        return linksafe.part_size(tmp_path / (TOK + ".part"))

    def wait() -> int:
        with download_lock.held(tmp_path, TOK, progress):
            return (tmp_path / (TOK + ".part")).stat().st_size

    assert in_thread(wait) == {"result": 15}
    assert len(seen) > 4  # it did wait, more than the patience


def test_a_running_holder_that_writes_nothing_is_waited_for(
    tmp_path, holder, monkeypatch
):
    """Hashing, checking or a Xet transfer show nothing on disk for a while:
    the holder's beat (its lock file touched each second) keeps the waiter
    waiting, longer than its patience in all."""
    monkeypatch.setattr(download_lock, "PATIENCE", 5.0)
    holder(tmp_path, TOK, steps=-10)

    def wait() -> bool:
        with download_lock.held(tmp_path, TOK):
            return True

    assert in_thread(wait) == {"result": True}


def test_the_tokenizer_does_not_wait_for_the_weights(
    hosts, payloads, store, holder, monkeypatch
):
    """The lock is per file: a process that needs only the tokenizer gets it
    while another holds the weights' lock (one that never moves)."""
    monkeypatch.setattr(download_lock, "PATIENCE", 1.0)
    holder(store, MODEL)
    out = in_thread(
        lambda: download_qwen3_small("base", tokenizer_only=True, out_dir=None)
    )
    assert "error" not in out, out
    assert out["result"].tokenizer.read_bytes() == payloads[TOK]


def test_a_download_behind_a_stopped_holder_fails_in_one_line(
    hosts, store, holder, monkeypatch
):
    monkeypatch.setattr(download_lock, "PATIENCE", 1.0)
    proc = holder(store, TOK)
    proc.send_signal(signal.SIGSTOP)
    out = in_thread(
        lambda: download_qwen3_small("base", tokenizer_only=True, out_dir=None)
    )
    assert isinstance(out["error"], download_lock.HolderStuckError)
    assert f"process {proc.pid}" in str(out["error"]) and "\n" not in str(out["error"])
