"""Write-then-rename helpers: a file appears complete or not at all."""

import os

import pytest

from utils.fileio import (
    atomic_move,
    atomic_output,
    atomic_place,
    atomic_write_bytes,
    atomic_write_text,
    temp_name_pattern,
)


def test_write_replaces_whole_file(tmp_path):
    path = tmp_path / "sub" / "f.json"
    atomic_write_text(path, "first")
    atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.json"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_failure_keeps_old_content_and_leaves_no_temp(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_output(path) as tmp:
        tmp.write_bytes(b"half")
        assert list(tmp_path.glob(temp_name_pattern(path))) == [tmp]
        raise RuntimeError("disk full")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_place_links_and_falls_back(tmp_path, monkeypatch):
    src = tmp_path / "src.bin"
    src.write_bytes(b"data")
    linked = atomic_place(src, tmp_path / "a" / "linked.bin")
    assert linked.read_bytes() == b"data"
    assert os.path.samefile(src, linked)  # a hard link, no copy

    def no_link(*args, **kwargs):
        raise OSError("cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    symlinked = atomic_place(src, tmp_path / "b.bin")
    assert symlinked.is_symlink() and symlinked.read_bytes() == b"data"
    monkeypatch.setattr(os, "symlink", no_link)
    copied = atomic_place(src, tmp_path / "c.bin")
    assert not copied.is_symlink() and copied.read_bytes() == b"data"
    assert not list(tmp_path.glob(".*.tmp"))


def test_move(tmp_path):
    src = tmp_path / "x.part"
    src.write_bytes(b"done")
    dest = atomic_move(src, tmp_path / "x")
    assert dest.read_bytes() == b"done" and not src.exists()
