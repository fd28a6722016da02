"""Write-then-rename helpers: a file appears complete or not at all, with
the modes the umask gives; an export killed midway is cleaned up next time."""

import os
import socket
import stat

import pytest

from utils import fileio
from utils.fileio import (
    atomic_folder,
    atomic_move,
    atomic_output,
    atomic_place,
    atomic_write_bytes,
    atomic_write_text,
    file_mode,
    folder_mode,
    refuse_link,
    temp_name_pattern,
)

GONE_PID = 2**30  # above any pid_max: no such process


@pytest.fixture(params=[0o022, 0o077, 0o002], ids=lambda m: f"umask{m:03o}")
def umask(request):
    """Run the test under this umask (the process's: put back afterwards)."""
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_write_replaces_whole_file(tmp_path):
    path = tmp_path / "sub" / "f.json"
    atomic_write_text(path, "first")
    atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert sorted(p.name for p in path.parent.iterdir()) == ["f.json"]
    assert oct(mode(path)) == oct(file_mode())


def test_the_umask_is_read_without_being_changed(umask):
    assert fileio.umask() == umask and os.umask(umask) == umask
    assert file_mode() == 0o666 & ~umask and folder_mode() == 0o777 & ~umask


def test_written_and_moved_files_follow_the_umask(tmp_path, umask):
    """0644 under 022, 0600 under 077, 0664 under 002: as `cp` makes them,
    whatever mode the file was written with (mkstemp gives 0600)."""
    wanted = 0o666 & ~umask
    assert mode(atomic_write_text(tmp_path / "a.json", "{}")) == wanted
    staged = tmp_path / "b.part"
    staged.write_bytes(b"x")
    staged.chmod(0o600)
    assert mode(atomic_move(staged, tmp_path / "b")) == wanted
    with atomic_output(tmp_path / "c") as tmp:
        tmp.write_bytes(b"x")
        assert mode(tmp) == wanted  # already while it is written
    assert mode(tmp_path / "c") == wanted


def test_a_folder_and_everything_in_it_follow_the_umask(tmp_path, umask):
    target = tmp_path / "out"
    with atomic_folder(target) as tmp:
        assert mode(tmp) == 0o700  # nobody reads a half-made folder
        (tmp / "private.bin").write_bytes(b"x")
        (tmp / "private.bin").chmod(0o600)  # as safetensors writes
        (tmp / "sub").mkdir(mode=0o700)
        (tmp / "sub" / "f").write_text("y")
        (tmp / "link").symlink_to(tmp_path / "elsewhere")
    assert mode(target) == mode(target / "sub") == 0o777 & ~umask
    for name in ("private.bin", "sub/f"):
        assert mode(target / name) == 0o666 & ~umask, name
    assert (target / "link").is_symlink()


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


def test_a_link_is_refused_never_replaced_nor_written_through(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("theirs")
    link = tmp_path / "out"
    link.symlink_to(elsewhere)
    for call in (lambda: refuse_link(link), lambda: atomic_folder(link).__enter__()):
        with pytest.raises(FileExistsError, match="is a symbolic link") as info:
            call()
        assert len(str(info.value).splitlines()) == 1
    assert link.is_symlink() and os.readlink(link) == str(elsewhere)
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out"]


def leftover(parent, name, kind="tmp", host=None, pid=GONE_PID):
    host = fileio._host() if host is None else host
    path = parent / f".{name}.{kind}-{host}-{pid}-0123abcd"
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"half")
    return path


@pytest.mark.skipif(os.name != "posix", reason="POSIX: pids and owners")
def test_only_provably_stale_temporaries_are_removed(tmp_path, capsys):
    """A killed export's temporary (this host, a process that is gone, this
    user's own folder) goes; a live process's, another host's, a link, a
    name of another pattern and another user's folder stay."""
    stale = leftover(tmp_path, "hf")
    kept = [
        leftover(tmp_path, "hf", pid=os.getppid()),  # alive
        leftover(tmp_path, "hf", pid=os.getpid()),  # this process
        leftover(tmp_path, "hf", host=socket.gethostname() + "x"),
        leftover(tmp_path, "hf2"),  # another folder's
    ]
    old = leftover(tmp_path, "hf", kind="old")  # kept while "hf" is not there
    target = tmp_path / "victim"
    target.mkdir()
    (target / "keep.txt").write_text("theirs")
    link = tmp_path / f".hf.tmp-{fileio._host()}-{GONE_PID}-89abcdef"
    link.symlink_to(target)
    if os.geteuid() == 0:  # another user's folder of the same pattern
        other = leftover(tmp_path, "hf", pid=GONE_PID - 1)
        os.chown(other, 65534, 65534)
        kept.append(other)
    with atomic_folder(tmp_path / "hf") as tmp:
        (tmp / "config.json").write_text("{}")
    assert not os.path.lexists(stale)
    assert all(p.is_dir() for p in kept) and link.is_symlink() and old.is_dir()
    assert (target / "keep.txt").read_text() == "theirs"
    assert f"removed {stale}" in capsys.readouterr().err
    # once "hf" exists, a stale `.old-` of it (the replaced folder) goes too
    with atomic_folder(tmp_path / "hf") as tmp:
        (tmp / "config.json").write_text("{}")
    assert not os.path.lexists(old)
    assert all(p.is_dir() for p in kept) and link.is_symlink()
