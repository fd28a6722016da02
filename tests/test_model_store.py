"""One verified copy per user: the model store (utils.model_store) that
download_qwen3_small fetches into and places files from, and the commands'
default that finds it. Loopback servers only (tests/fake_hosts.py)."""

from __future__ import annotations

import argparse
import errno
import json
import os
from pathlib import Path

import pytest

from tests.download_helpers import (
    MODEL,
    TOK,
    VOCAB,
    assert_real,
    flip_byte_keep_mtime,
    said,
)
from tests.fake_hosts import fake_tokenizer_json
from utils import linksafe
from utils.download import provenance
from utils.download import sources as download_sources
from utils.download import store as model_store
from utils.download.fetch import download_qwen3_small
from utils.download.provenance import is_verified

# the tiny content checks and a store of each test's own (conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_expectations", "store")


def requests_made(hosts) -> int:
    return sum(len(h.seen()) for h in hosts)


def fallback_lines(err: str) -> list[str]:
    return [x for x in said(err) if "cannot keep the model files" in x]


# --------------------------------------------------------------------------
# One copy, many folders
# --------------------------------------------------------------------------


def test_a_second_folder_makes_no_request_and_shares_the_bytes(
    hosts, payloads, tmp_path, store, capsys
):
    first = download_qwen3_small("base", out_dir=tmp_path / "en" / "qwen3")
    made = requests_made(hosts)
    assert made > 0
    second = download_qwen3_small("base", out_dir=tmp_path / "zh" / "qwen3")
    assert requests_made(hosts) == made  # not one request
    assert_real(first, payloads)
    assert_real(second, payloads)
    for name, a, b in zip((TOK, MODEL), first, second, strict=True):
        assert os.path.samefile(a, b) and os.path.samefile(a, store / name)
        assert (store / name).stat().st_nlink == 3  # one copy on the disk
        record = json.loads(provenance.record_path(b).read_text())
        assert record["store"] == str(store / name)
    err = capsys.readouterr().err
    assert f"{second.model}: linked from the verified copy in {store}/" in err


def test_linking_another_folder_does_not_make_the_first_look_changed(
    hosts, payloads, tmp_path, monkeypatch
):
    """A new link moves the change time the names share; the first folder's
    files stay verified without being hashed again."""
    first = download_qwen3_small("base", out_dir=tmp_path / "a")
    second = download_qwen3_small("base", out_dir=tmp_path / "b")
    assert os.path.samefile(first.model, second.model)
    hashed: list[Path] = []
    real_hash = provenance.hash_file
    monkeypatch.setattr(
        provenance, "hash_file", lambda p: hashed.append(Path(p)) or real_hash(p)
    )
    assert all(is_verified(p) for p in first)
    assert hashed == []


def test_where_links_fail_a_checked_copy_is_placed(
    hosts, payloads, tmp_path, store, monkeypatch, capsys
):
    download_qwen3_small("base", out_dir=tmp_path / "a")
    made = requests_made(hosts)

    def no_links(src, dst, *args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(dst))

    monkeypatch.setattr(model_store.os, "link", no_links)
    files = download_qwen3_small("base", out_dir=tmp_path / "b")
    assert requests_made(hosts) == made
    assert_real(files, payloads)
    for name, path in zip((TOK, MODEL), files, strict=True):
        assert not os.path.samefile(path, store / name)
        assert "store" not in json.loads(provenance.record_path(path).read_text())
    assert f"{files.model}: copied from the verified copy" in capsys.readouterr().err


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["022", "077"])
def test_stored_and_placed_files_and_records_follow_the_umask(
    hosts, tmp_path, store, monkeypatch, umask
):
    """As `cp` and huggingface_hub make files: 0644 under 022, 0600 under
    077, for the store's files and records, linked or copied out."""
    import stat

    def no_links(src, dst, *args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(dst))

    old = os.umask(umask)
    try:
        linked = download_qwen3_small("base", out_dir=tmp_path / "a")
        monkeypatch.setattr(model_store.os, "link", no_links)
        copied = download_qwen3_small("base", out_dir=tmp_path / "b")
    finally:
        os.umask(old)
    files = [store / TOK, store / MODEL, *linked, *copied]
    for path in files + [provenance.record_path(f) for f in files]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


@pytest.mark.parametrize("damage", ["flipped byte", "forged record"])
def test_a_damaged_stored_copy_is_downloaded_again_never_linked(
    hosts, payloads, tmp_path, store, damage
):
    hub, cdn, mirror = hosts
    download_qwen3_small("base", out_dir=None)  # into the store only
    gets = len(cdn.seen("GET", MODEL))
    stored = store / MODEL
    damaged_inode = stored.stat().st_ino
    if damage == "flipped byte":
        flip_byte_keep_mtime(stored)
    else:
        # as in test_download: another hash, and times of another file
        record = json.loads(provenance.record_path(stored).read_text())
        record.update(sha256="0" * 64, ctime_ns=1)
        provenance.record_path(stored).write_text(json.dumps(record))
    files = download_qwen3_small("base", out_dir=tmp_path / "b")
    assert len(cdn.seen("GET", MODEL)) == gets + 1
    assert_real(files, payloads)
    assert files.model.stat().st_ino != damaged_inode
    assert os.path.samefile(files.model, stored) and is_verified(stored)


def test_standins_never_enter_the_store(hosts, tmp_path, store, standin_env):
    for out_dir in (tmp_path / "qwen3", None):
        files = download_qwen3_small("base", out_dir=out_dir)
        assert files.standin and files.model.parent == standin_env
    assert list(store.iterdir()) == []
    assert all(not h.seen() for h in hosts)


def test_a_verified_file_of_the_readers_own_is_kept(hosts, payloads, tmp_path, store):
    """A verified tokenizer the reader made (e.g. imported from ModelScope)
    stays as it is, although the store holds another verified one."""
    download_qwen3_small("base", tokenizer_only=True, out_dir=None)
    made = requests_made(hosts)
    out = tmp_path / "qwen3"
    out.mkdir()
    own = out / "own.json"
    own.write_bytes(fake_tokenizer_json(VOCAB, salt="mine"))
    sha = provenance.hash_file(own)["sha256"]
    download_sources.install(own, out / TOK, "imported", "content checked", sha)
    inode = (out / TOK).stat().st_ino
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=out)
    assert requests_made(hosts) == made
    assert files.tokenizer.stat().st_ino == inode
    assert files.tokenizer.read_bytes() == fake_tokenizer_json(VOCAB, salt="mine")


def test_xdg_cache_home_is_where_the_store_is(hosts, payloads, tmp_path, monkeypatch):
    monkeypatch.delenv(model_store.STORE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    files = download_qwen3_small("base", out_dir=None)
    assert files.model == tmp_path / "xdg" / "qwen3-ch02" / "models" / MODEL
    assert_real(files, payloads)


# --------------------------------------------------------------------------
# A store that cannot keep the files
# --------------------------------------------------------------------------


def refuse_writes_in(monkeypatch, folder: Path, code: int) -> None:
    """Every open for writing under `folder` fails with `code` (as on a
    read-only or full disk); reads and other folders work."""
    real_open = os.open
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def guarded(path, flags, *args, **kwargs):
        if str(path).startswith(str(folder)) and flags & writing:
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded)


def full_part_files_in(monkeypatch, folder: Path) -> None:
    """A `.part` under `folder` takes no byte: its first write fails with
    ENOSPC, as on a full disk."""
    real = linksafe.open_part

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def open_part(part, append):
        f = real(part, append)
        return Full(f) if str(part).startswith(str(folder)) else f

    monkeypatch.setattr(linksafe, "open_part", open_part)


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_store_that_refuses_falls_back_to_the_folder(
    hosts, payloads, tmp_path, store, monkeypatch, capsys, fault
):
    hub, cdn, mirror = hosts
    if fault == "read-only":
        refuse_writes_in(monkeypatch, store, errno.EROFS)
        why = "read-only file system"
    else:
        hub.resources.clear()  # the mirror writes `.part` files
        full_part_files_in(monkeypatch, store)
        why = "no space left on the disk"
    out = tmp_path / "qwen3"
    files = download_qwen3_small("base", out_dir=out)
    assert_real(files, payloads)
    assert files.model == out / MODEL
    assert not (store / MODEL).exists() and not (store / TOK).exists()
    assert fallback_lines(capsys.readouterr().err) == [
        f"{store}: cannot keep the model files there ({why}); "
        f"downloading into {out} instead"
    ]


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0,
    reason="a folder's mode does not stop root from writing",
)
def test_a_read_only_store_by_its_mode_falls_back(
    hosts, payloads, tmp_path, store, capsys
):
    store.chmod(0o555)
    try:
        files = download_qwen3_small("base", out_dir=tmp_path / "qwen3")
    finally:
        store.chmod(0o755)
    assert_real(files, payloads)
    [line] = fallback_lines(capsys.readouterr().err)
    assert "(permission denied)" in line


def test_without_a_folder_a_refusing_store_is_one_clear_error(
    hosts, store, monkeypatch
):
    refuse_writes_in(monkeypatch, store, errno.EROFS)
    with pytest.raises(model_store.StoreUnusableError) as err:
        download_qwen3_small("base", out_dir=None)
    message = str(err.value)
    assert message.startswith(f"cannot keep the model files in {store} (read-only")
    assert model_store.STORE_ENV in message and "--out-dir" in message


# --------------------------------------------------------------------------
# The commands find the store
# --------------------------------------------------------------------------


def test_the_commands_default_finds_what_a_notebook_downloaded(
    hosts, payloads, tmp_path, store
):
    from utils.benchmark import runner as benchmark
    from utils.cli import commands as cli

    notebook = download_qwen3_small("base", out_dir=tmp_path / "nb" / "qwen3")
    made = requests_made(hosts)
    args = cli.generate_parser().parse_args(["--prompt", "hi"])
    assert args.out_dir is None
    tok, model, standin = cli._files(args, "base")
    assert (tok, model, standin) == (store / TOK, store / MODEL, False)
    assert os.path.samefile(model, notebook.model)
    assert benchmark.build_parser().parse_args([]).out_dir is None
    state_dict, tokenizer, standin = benchmark._weights(None, None)
    assert (tokenizer, standin) == (store / TOK, False) and state_dict
    explicit = argparse.Namespace(
        out_dir=tmp_path / "mine", model_file=None, tokenizer_file=None
    )
    assert cli._files(explicit, "base")[1] == tmp_path / "mine" / MODEL
    assert requests_made(hosts) == made  # not one request after the notebook


def test_the_documented_benchmark_run_writes_nothing_into_the_repository():
    """The benchmark page's command prints its table and writes no file
    (it wrote `results.json` into the repository root), and the model files
    it needs come from the store, not from a `qwen3/` in the repository."""
    import shlex

    from tests.markdown_text import ROOT, code_snippets
    from utils.benchmark import runner as benchmark

    runs = [
        line.split("python -m utils.benchmark", 1)[1]
        for line in code_snippets((ROOT / "docs" / "benchmark.md").read_text())
        if "python -m utils.benchmark --device" in line
    ]
    assert runs
    for run in runs:
        args = benchmark.build_parser().parse_args(shlex.split(run))
        assert (args.json, args.csv, args.plot, args.out_dir) == (None,) * 4, run


# --------------------------------------------------------------------------
# A store another user can write: never trusted
# --------------------------------------------------------------------------

NOBODY = 65534
needs_root = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0,
    reason="needs root (a folder of another user)",
)


def planted_store(tmp_path: Path, monkeypatch) -> tuple[Path, bytes]:
    """A store in a 0777 folder of uid 65534 holding that user's tokenizer
    with a record for it (its stat fields, as they would copy them)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, NOBODY, NOBODY)
    shared.chmod(0o777)
    store = shared / "models"
    store.mkdir()
    theirs = fake_tokenizer_json(VOCAB)
    theirs = theirs + b" " * 7  # other bytes that still pass the content check
    (store / TOK).write_bytes(theirs)
    provenance.write_record(
        store / TOK, {"sha256": provenance.hash_file(store / TOK)["sha256"]}
    )
    for path in store.iterdir():
        os.chown(path, NOBODY, NOBODY)
    os.chown(store, NOBODY, NOBODY)
    monkeypatch.setenv(model_store.STORE_ENV, str(store))
    return store, theirs


@needs_root
@pytest.mark.parametrize("links", [True, False], ids=["link", "copy"])
def test_a_store_another_user_can_write_is_not_used(
    hosts, payloads, tmp_path, monkeypatch, capsys, links
):
    store, theirs = planted_store(tmp_path, monkeypatch)
    assert is_verified(store / TOK)  # its record alone would pass it
    if not links:
        monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(OSError))
    out = tmp_path / "mine" / "qwen3"
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=out)
    assert files.tokenizer.read_bytes() == payloads[TOK] != theirs
    assert requests_made(hosts) > 0  # fetched, not taken from their store
    assert (store / TOK).read_bytes() == theirs  # theirs is left alone
    [line] = fallback_lines(capsys.readouterr().err)
    assert line.startswith(f"{store}: cannot keep the model files there (another ")
    assert f"{store.parent} belongs to another user (uid {NOBODY})" in line


@needs_root
def test_without_a_folder_a_store_another_user_can_write_is_one_clear_error(
    hosts, tmp_path, monkeypatch
):
    store, _ = planted_store(tmp_path, monkeypatch)
    with pytest.raises(model_store.StoreUnusableError) as err:
        download_qwen3_small("base", tokenizer_only=True, out_dir=None)
    message = str(err.value)
    assert message.startswith(f"cannot keep the model files in {store} (another")
    assert model_store.STORE_ENV in message and "\n" not in message
    assert requests_made(hosts) == 0


def test_a_folder_of_ours_that_others_can_write_is_refused(
    hosts, tmp_path, monkeypatch
):
    out = tmp_path / "class"
    out.mkdir()
    out.chmod(0o777)
    with pytest.raises(ValueError) as err:
        download_qwen3_small("base", tokenizer_only=True, out_dir=out / "qwen3")
    assert str(err.value).startswith(
        f"{out / 'qwen3'} cannot be trusted: {out} can be written by other users "
        "(mode 777)"
    )
    assert "--out-dir" in str(err.value) and requests_made(hosts) == 0
    assert list(out.iterdir()) == []  # the folder it made is gone again


def test_a_new_folder_under_a_sticky_shared_one_is_ours(
    hosts, payloads, tmp_path, monkeypatch
):
    """Like /tmp: anyone may add entries, only their owner may move them."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv(model_store.STORE_ENV, str(shared / "store"))
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=shared / "q")
    assert files.tokenizer.read_bytes() == payloads[TOK]
    assert (shared / "store" / TOK).is_file()
