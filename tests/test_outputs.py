"""Files a command writes (utils.outputs) on a full disk: said before the
run where the disk is full already, and one line naming the file where it
fills up during the run; never a bare `OSError: [Errno 28]`."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.tiny import tiny_run
from utils.benchmark import outputs
from utils.benchmark import runner as benchmark
from utils.errors import UsageError

NO_SPACE = os.strerror(errno.ENOSPC)


@pytest.fixture(scope="module")
def rows():
    return tiny_run(["kv_cache"], max_new_tokens=2, repeats=1)


@pytest.fixture
def disk(tmpfs):
    """A 64 KiB tmpfs of this test's own (root only; skipped elsewhere)."""
    return tmpfs("64k")


def fill(folder: Path) -> Path:
    """Write into `folder` until its file system is full."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(1024))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("python -m utils.benchmark: error: ")
    return err[0]


@pytest.mark.parametrize("flag", ["--json", "--csv", "--plot"])
def test_a_full_disk_is_said_before_any_mode_runs(flag, disk, monkeypatch, capsys):
    """An empty file can still be made on a full disk: the probe writes a
    block, so the check fails there, not the write after the run."""
    fill(disk)
    ran = []
    monkeypatch.setattr(benchmark, "run_benchmark", lambda **kw: ran.append(1))
    assert benchmark.main([flag, str(disk / "out.png")]) == 2
    line = one_error_line(capsys)
    assert f"{flag} {disk / 'out.png'}: cannot write into {disk} ({NO_SPACE})" in line
    assert "free some space" in line and not ran
    assert [p.name for p in disk.iterdir()] == ["filler"]


@pytest.mark.parametrize("flag", ["--json", "--csv", "--plot"])
def test_a_disk_that_fills_during_the_run_names_the_file(
    flag, rows, disk, monkeypatch, capsys
):
    """The table is printed; the file that could not be written is named in
    one line (exit status 2), an old file there is kept, nothing is left."""
    target = disk / "out.png"
    target.write_bytes(b"old")

    def run_that_fills_the_disk(**kwargs):
        fill(disk)
        return rows

    monkeypatch.setattr(benchmark, "run_benchmark", run_that_fills_the_disk)
    assert benchmark.main([flag, str(target)]) == 2
    out, err = capsys.readouterr()
    assert any(line.startswith("kv_cache ") for line in out.splitlines())
    lines = [x for x in err.splitlines() if x.startswith("python -m utils.benchmark")]
    assert lines == [
        f"python -m utils.benchmark: error: {flag} {target}: could not write it "
        f"({NO_SPACE}); free some space there or name a file on another disk, "
        "then run again (a file there is left as it was)"
    ]
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "out.png"]


def test_a_failed_write_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """Where no tmpfs can be mounted: the same, with ENOSPC injected."""
    target = tmp_path / "r.json"
    target.write_text("old")

    def full(self, data):
        raise OSError(errno.ENOSPC, NO_SPACE)

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(UsageError) as info:
        outputs.write_output(target, b"[]", "--json")
    assert str(info.value).startswith(
        f"--json {target}: could not write it ({NO_SPACE}); free some space"
    )
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary
