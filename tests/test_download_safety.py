"""download_qwen3_small where the folder or the servers are hostile or odd:
links planted under the download's working names, timeouts that are not
numbers, a file in place of the folder, headers that trickle in and stop,
JSON nested to exhaust the parser, a CDN with a wrong Content-Length, short
rate limits. Loopback servers only (tests/fake_hosts.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.download_helpers import MODEL, TOK, assert_real, failed_lines, said
from tests.fake_hosts import MIRROR_PREFIX
from utils.download import fetch as download
from utils.download import lock as download_lock
from utils.download import sources as download_sources
from utils.download.fetch import DownloadError, download_qwen3_small

# the tiny content checks and a store of each test's own (conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_expectations", "store")


def tree(folder: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every entry under `folder` (links not followed): bytes (None for a
    folder) and mode."""
    found = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
        found[str(path.relative_to(folder))] = (data, stat.S_IMODE(st.st_mode))
    return found


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A folder of someone else's: a 29-byte file of mode 0600, an empty
    one, and a folder with a partial transfer in it."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "secret").write_bytes(b"twenty-nine bytes of secrets")
    (folder / "secret").chmod(0o600)
    (folder / "empty").write_bytes(b"")
    (folder / "empty").chmod(0o600)
    (folder / "cache").mkdir()
    (folder / "cache" / "x.incomplete").write_bytes(b"someone's partial file")
    return folder


def lines_naming(err: str, path: Path) -> list[str]:
    return [line for line in said(err) if str(path) in line]


@pytest.fixture(params=["store", "out"])
def where(request, tmp_path, store) -> tuple[Path, Path]:
    """(the reader's folder, the folder to plant in): the model store, where
    the download writes its working files, or the reader's folder, where
    they may be left from before the store (removed when files are placed)."""
    out = tmp_path / "qwen3"
    out.mkdir()
    return out, (store if request.param == "store" else out)


# --------------------------------------------------------------------------
# Links planted under the download's working names
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", [TOK, MODEL])
@pytest.mark.parametrize("target", ["secret", "empty", "missing", "hardlink"])
def test_a_planted_part_file_is_never_written_through(
    hosts, payloads, where, elsewhere, capsys, name, target
):
    """`<name>.part` a link to another file (with bytes, empty, or not there
    yet) or a second name of it: the mirror's resumable download leaves the
    other file as it was and installs a plain file of its own."""
    hub, cdn, mirror = hosts
    hub.resources.clear()  # the mirror writes `.part`
    out, folder = where
    part = folder / f"{name}.part"
    if target == "hardlink":
        os.link(elsewhere / "secret", part)
    else:
        part.symlink_to(elsewhere / target)
    before = tree(elsewhere)
    files = download_qwen3_small("base", out_dir=out)
    assert_real(files, payloads)
    assert tree(elsewhere) == before  # bytes, modes, nothing added
    assert not (folder / name).is_symlink() and not os.path.lexists(part)
    assert (elsewhere / "secret").stat().st_nlink == 1
    [line] = lines_naming(capsys.readouterr().err, part)
    assert "removed" in line and "not touched" in line


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_in_place_of_the_part_file_is_removed(hosts, payloads, where, capsys):
    """A FIFO at `<name>.part` would block the open for writing forever
    (nobody reads it); it is removed with one line instead."""
    import signal

    hub, cdn, mirror = hosts
    hub.resources.clear()
    out, folder = where
    part = folder / f"{TOK}.part"
    os.mkfifo(part)

    def hung(signum, frame):
        raise TimeoutError("the download blocked on the FIFO")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)  # a hang fails the test instead of the run
    try:
        files = download_qwen3_small("base", tokenizer_only=True, out_dir=out)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert_real(files, payloads)
    [line] = lines_naming(capsys.readouterr().err, part)
    assert "not a plain file" in line


def test_a_planted_hub_staging_link_is_not_followed(
    hosts, payloads, where, elsewhere, capsys
):
    """`.<name>.hub` a link to another folder: the Hub download neither
    writes `.cache/huggingface/` there nor deletes its `*.incomplete`."""
    out, folder = where
    staging = folder / f".{TOK}.hub"
    staging.symlink_to(elsewhere / "cache")
    before = tree(elsewhere)
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=out)
    assert_real(files, payloads)
    hub, cdn, mirror = hosts
    assert hub.seen("GET", TOK) and not mirror.seen()
    assert tree(elsewhere) == before
    assert not os.path.lexists(staging)
    [line] = lines_naming(capsys.readouterr().err, staging)
    assert "symbolic link" in line and str(elsewhere / "cache") in line


def test_a_link_inside_a_kept_staging_folder_is_not_followed(
    hosts, payloads, where, elsewhere
):
    """A staging folder left by an earlier run whose `.cache` is a link:
    discarded, never written or cleaned through."""
    out, folder = where
    staging = folder / f".{TOK}.hub"
    staging.mkdir(parents=True)
    (staging / ".cache").symlink_to(elsewhere / "cache")
    before = tree(elsewhere)
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=out)
    assert_real(files, payloads)
    assert tree(elsewhere) == before
    assert not os.path.lexists(staging)


def test_a_planted_lock_link_is_replaced_not_followed(
    hosts, payloads, where, elsewhere, capsys
):
    """A file's lock (`.<name>.lock`) a link: removed with one line, the
    download goes on
    (before, every run failed with "Too many levels of symbolic links")."""
    out, folder = where
    lock = download_lock.lock_path(folder, TOK)
    lock.symlink_to(elsewhere / "secret")
    before = tree(elsewhere)
    files = download_qwen3_small("base", out_dir=out)
    assert_real(files, payloads)
    assert tree(elsewhere) == before
    assert not lock.is_symlink()
    [line] = lines_naming(capsys.readouterr().err, lock)
    assert "removed a symbolic link" in line


# --------------------------------------------------------------------------
# QWEN3_DOWNLOAD_TIMEOUT
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, seconds, said_why",
    [
        ("60", 60.0, None),
        ("1", 1.0, None),
        ("3600", 3600.0, None),
        ("inf", 3600.0, "asks for no limit or more than 3600 s"),
        ("1e308", 3600.0, "asks for no limit or more than 3600 s"),
        ("0", 3600.0, "asks for no limit or more than 3600 s"),
        ("0.5", 1.0, "is less than 1 s"),
        ("abc", 10.0, "is not a number of seconds"),
        ("-5", 10.0, "is not a number of seconds"),
        ("nan", 10.0, "is not a number of seconds"),
    ],
)
def test_timeout_setting_is_bounded_and_says_so_once(
    monkeypatch, capsys, raw, seconds, said_why
):
    monkeypatch.setattr(download, "_MIN_TIMEOUT", 1.0)
    monkeypatch.setattr(download, "_timeouts_said", set())
    monkeypatch.setenv(download.TIMEOUT_ENV, raw)
    assert download.download_timeout() == seconds
    assert download.download_timeout() == seconds
    lines = said(capsys.readouterr().err)
    if said_why is None:
        assert lines == []
    else:
        assert lines == [
            f"{download.TIMEOUT_ENV}={raw} {said_why}; using {seconds:g} s"
        ]


def test_an_infinite_timeout_still_downloads(hosts, payloads, tmp_path, monkeypatch):
    """`inf` used to fail every try with "OverflowError: timestamp out of
    range for platform time_t"."""
    monkeypatch.setattr(download, "_timeouts_said", set())
    monkeypatch.setenv(download.TIMEOUT_ENV, "inf")
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)


# --------------------------------------------------------------------------
# A file where the folder should be
# --------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["itself", "above"])
def test_an_out_dir_that_is_a_file_gets_one_clear_line(
    hosts, tmp_path, monkeypatch, capsys, where
):
    from utils.cli import commands as cli

    plain = tmp_path / "qwen3"
    plain.write_text("not a folder")
    out = plain if where == "itself" else plain / "sub"
    with pytest.raises(ValueError) as err:
        download_qwen3_small("base", out_dir=out)
    message = str(err.value)
    assert f"{plain} is a file" in message and "choose another folder" in message
    assert "\n" not in message and "Errno" not in message
    assert plain.read_text() == "not a folder"
    assert all(not h.seen() for h in hosts)
    rc = cli.generate_main(["--prompt", "hi", "--device", "cpu", "--out-dir", str(out)])
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err_lines[-1] == f"qwen3-generate: error: {message}"


# --------------------------------------------------------------------------
# What a failed source says
# --------------------------------------------------------------------------


def test_headers_that_trickle_and_stop_are_too_slow(hosts, payloads, tmp_path, capsys):
    """A mirror that sends its headers a byte at a time and closes the
    connection half-way (before the stall window ends) gave an answer
    without a length or a body: "not valid JSON (0 bytes)". Now: too slow,
    and no empty `.part` left."""
    hub, cdn, mirror = hosts
    hub.resources.clear()
    res = mirror.resources[MIRROR_PREFIX + TOK]
    res.trickle, res.trickle_headers, res.trickle_for = 0.02, True, 1.2
    res.trickle_gets = 10
    with pytest.raises(DownloadError) as err:
        download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    says = err.value.attempts[-1][1]
    assert says.startswith("too slow: the answer's headers took"), says
    assert "JSON" not in says
    [failed] = [x for x in failed_lines(capsys.readouterr().err, TOK) if "mirror" in x]
    assert failed.endswith(says)
    assert not (tmp_path / TOK).exists() and not (tmp_path / f"{TOK}.part").exists()


def test_deeply_nested_json_is_rejected_in_one_line(hosts, payloads, tmp_path):
    """1 MB of `[` from a source that announces no hash: a clear rejection,
    not a RecursionError, and no 1 MB `.part` left behind."""
    hub, cdn, mirror = hosts
    hub.resources.clear()
    res = mirror.resources[MIRROR_PREFIX + TOK]
    res.data, res.headers = b"[" * 1_000_000, {}
    with pytest.raises(DownloadError) as err:
        download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    says = err.value.attempts[-1][1]
    assert "nested too deeply" in says and "Recursion" not in says
    assert not (tmp_path / f"{TOK}.part").exists() and not (tmp_path / TOK).exists()


def test_a_cdn_with_a_wrong_content_length_is_named(
    hosts, payloads, tmp_path, capsys, monkeypatch
):
    """The Hub's CDN announces more bytes than the file has and closes the
    connection after the real ones: the Hub source says so (it said "the
    server ignores HTTP Range") and the mirror delivers."""
    import huggingface_hub

    hub, cdn, mirror = hosts
    monkeypatch.setattr(huggingface_hub.file_download.time, "sleep", lambda s: None)
    res = cdn.resources[f"/cdn/{MODEL}"]
    res.length, res.honour_range = len(payloads[MODEL]) + 1000, False
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    [failed] = failed_lines(capsys.readouterr().err, MODEL)
    assert "Range" not in failed
    assert f"announced {len(payloads[MODEL]) + 1000:,} bytes (Content-Length)" in failed
    assert f"for a file of {len(payloads[MODEL]):,} bytes" in failed


def test_a_mirror_with_a_wrong_content_length_still_delivers(hosts, payloads, tmp_path):
    """The mirror announces 1000 bytes too many and closes after the real
    ones; the resume then answers 416 with the true size, which the `.part`
    already has: checked against the announced sha1 and installed."""
    hub, cdn, mirror = hosts
    hub.resources.clear()
    mirror.resources[MIRROR_PREFIX + MODEL].length = len(payloads[MODEL]) + 1000
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert len(mirror.seen("GET", MODEL)) == 2


def test_a_mirror_whose_length_is_always_wrong_is_named(hosts, payloads, tmp_path):
    hub, cdn, mirror = hosts
    hub.resources.clear()
    res = mirror.resources[MIRROR_PREFIX + TOK]
    res.length, res.honour_range = len(payloads[TOK]) + 1000, False
    with pytest.raises(DownloadError) as err:
        download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    says = err.value.attempts[-1][1]
    n = len(payloads[TOK])
    assert says == (
        f"the server announced {n + 1000:,} bytes (Content-Length) but each "
        f"answer ended after {n:,}; gave up after 3 tries"
    )


@pytest.mark.parametrize("wait", ["1", "3"])
def test_a_short_retry_after_on_the_mirror_is_waited_for(
    hosts, payloads, tmp_path, monkeypatch, capsys, wait
):
    hub, cdn, mirror = hosts
    hub.resources.clear()
    sleeps: list[float] = []
    monkeypatch.setattr(download_sources.time, "sleep", sleeps.append)
    res = mirror.resources[MIRROR_PREFIX + TOK]
    res.headers["Retry-After"], res.statuses = wait, [429]
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert_real(files, payloads)
    assert sleeps == [float(wait)] and len(mirror.seen("GET", TOK)) == 2
    assert f"the mirror asks to wait {wait} s (HTTP 429)" in capsys.readouterr().err


def test_nothing_goes_to_stdout(hosts, payloads, tmp_path, capsys):
    """Progress, "Saved ..." and "already downloaded" lines are diagnostics:
    stderr, so `qwen3-generate ... > answer.txt` keeps only the answer."""
    download_qwen3_small("base", out_dir=tmp_path)
    download_qwen3_small("base", out_dir=tmp_path)
    out, err = capsys.readouterr()
    assert out == "" and "Saved" in err and "already downloaded" in err
