"""download_qwen3_small against loopback servers playing the Hub and the mirror."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import huggingface_hub.constants
import huggingface_hub.file_download
import pytest

from tests.download_helpers import (
    MODEL,
    TINY,
    TOK,
    VOCAB,
    assert_real,
    child_env,
    failed_lines,
    flip_byte_keep_mtime,
    run_child,
    said,
    source_lines,
)
from tests.fake_hosts import (
    HUB_PREFIX,
    MIRROR_PREFIX,
    FakeHost,
    Seen,
    SilentHost,
    fake_checkpoint,
    fake_tokenizer_json,
    serve_like_b2,
    serve_like_hub,
)
from tests.tiny import tiny_config
from utils.download import fetch as download
from utils.download import provenance, standin
from utils.download import sources as download_sources
from utils.download import watch as http_watch
from utils.download.fetch import KINDS, DownloadError, Qwen3Files, download_qwen3_small
from utils.download.lock import lock_path
from utils.download.provenance import is_verified

# the tiny content checks and a store of each test's own (conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_expectations", "store")


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def leftovers(folder: Path) -> list[str]:
    """Anything in `folder` apart from finished files and their records."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if not (p.name in (TOK, MODEL) or p.name.endswith((".verified.json", ".lock")))
    )


def test_primary_success(hosts, payloads, tmp_path, capsys, monkeypatch, store):
    hub, cdn, mirror = hosts
    monkeypatch.setenv("TQDM_POSITION", "-1")  # hub bars on although stderr is no TTY
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert files == Qwen3Files(tmp_path / TOK, tmp_path / MODEL, standin=False)
    assert list(files) == [tmp_path / TOK, tmp_path / MODEL]
    assert_real(files, payloads)
    assert mirror.seen() == []
    assert cdn.seen("GET", MODEL) and hub.seen("GET", TOK)
    assert leftovers(tmp_path) == []  # no staging folder, no .part
    record = json.loads((tmp_path / f".{MODEL}.verified.json").read_text())
    assert record["size"] == len(payloads[MODEL])
    assert record["source"] == hub.url + HUB_PREFIX + MODEL
    captured = capsys.readouterr()
    assert f"Saved {store / MODEL}" in captured.err and captured.out == ""
    linked = f"{tmp_path / MODEL}: linked from the verified copy in {store}/"
    assert linked in captured.err
    assert f"from the Hugging Face Hub: {hub.url}" in captured.err
    assert "100%" in captured.err  # the hub client's progress bars


def test_verified_files_make_no_request(hosts, payloads, tmp_path, capsys):
    download_qwen3_small("base", out_dir=tmp_path)
    before = [len(h.seen()) for h in hosts]
    files = download_qwen3_small("base", out_dir=tmp_path)
    download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert [len(h.seen()) for h in hosts] == before
    assert_real(files, payloads)
    captured = capsys.readouterr()
    assert "already downloaded and verified" in captured.err and captured.out == ""


def test_tokenizer_only_and_reasoning_names(hosts, tmp_path):
    hub, cdn, mirror = hosts
    data = fake_tokenizer_json(VOCAB, salt="r")
    serve_like_hub(hub, cdn, "tokenizer-reasoning.json", data)
    files = download_qwen3_small("reasoning", tokenizer_only=True, out_dir=tmp_path)
    assert files.model is None and list(files) == [files.tokenizer]
    assert files.tokenizer == tmp_path / "tokenizer-reasoning.json"
    assert files.tokenizer.read_bytes() == data
    assert not hub.seen(contains=MODEL) and not cdn.seen(contains="reasoning.pth")


def test_bad_kind_lists_valid_kinds(tmp_path):
    with pytest.raises(ValueError) as err:
        download_qwen3_small("instruct", out_dir=tmp_path)
    assert all(repr(k) in str(err.value) for k in KINDS)
    assert not any(tmp_path.iterdir())


def range_starts(seen: list[Seen]) -> list[int | None]:
    """Where each request asked the body to start (None: no Range header)."""
    starts = []
    for r in seen:
        value = r.headers.get("range")
        starts.append(None if value is None else int(value[6:].split("-")[0]))
    return starts


def test_hub_resumes_dropped_connection(hosts, payloads, tmp_path, monkeypatch):
    hub, cdn, mirror = hosts
    # The hub client keeps up to 10 MB in memory; read in small pieces instead,
    # as it effectively does deep into a 1.4 GB file.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
    cdn.resources[f"/cdn/{MODEL}"].drop_after = [250_000]
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    first, second = range_starts(cdn.seen("GET", MODEL))
    assert first is None and 0 < second <= 250_000
    assert mirror.seen() == []


def test_backup_resumes_dropped_connection(hosts, payloads, tmp_path, capsys):
    hub, cdn, mirror = hosts
    hub.resources.clear()  # the repo is missing on this endpoint: 404
    mirror.resources[MIRROR_PREFIX + MODEL].drop_after = [123_456]
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    first, second = range_starts(mirror.seen("GET", MODEL))
    assert first is None and 0 < second <= 123_456
    captured = capsys.readouterr()
    assert "backup mirror" in captured.err and mirror.url in captured.err
    assert "100%" in captured.err  # tqdm progress bar
    record = json.loads((tmp_path / f".{MODEL}.verified.json").read_text())
    assert record["checked"] == "sha1 verified"  # from x-bz-info-large_file_sha1


def test_backup_resumes_part_file_from_earlier_call(hosts, payloads, tmp_path, store):
    hub, cdn, mirror = hosts
    hub.resources.clear()
    (store / f"{TOK}.part").write_bytes(payloads[TOK][:70_000])
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert_real(files, payloads)
    assert [g.headers.get("range") for g in mirror.seen("GET", TOK)] == ["bytes=70000-"]


def test_backup_restarts_when_server_ignores_range(hosts, payloads, tmp_path, store):
    hub, cdn, mirror = hosts
    hub.resources.clear()
    mirror.resources[MIRROR_PREFIX + TOK].honour_range = False
    (store / f"{TOK}.part").write_bytes(payloads[TOK][:70_000])
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert_real(files, payloads)  # not 70 kB of prefix + the whole file again
    # restarted on the 200 itself, not after a failed size check and a new GET
    assert range_starts(mirror.seen("GET", TOK)) == [70_000]


def test_stale_part_file_is_discarded(hosts, payloads, tmp_path, store):
    """A .part that is not a prefix of the file fails the sha1 check after
    resuming; the download then starts over once and succeeds."""
    hub, cdn, mirror = hosts
    hub.resources.clear()
    (store / f"{TOK}.part").write_bytes(os.urandom(70_000))
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert_real(files, payloads)
    ranges = [g.headers.get("range") for g in mirror.seen("GET", TOK)]
    assert ranges == ["bytes=70000-", None]


@pytest.mark.parametrize("name", [TOK, MODEL])
def test_corrupt_hub_content_is_rejected(hosts, payloads, tmp_path, name):
    """Right size, wrong bytes: the ETag check (git blob id for the JSON,
    sha256 for the LFS weights) catches it and the mirror is used instead."""
    hub, cdn, mirror = hosts
    res = (
        hub.resources[HUB_PREFIX + name]
        if name == TOK
        else cdn.resources[f"/cdn/{name}"]
    )
    body = bytearray(payloads[name])
    body[len(body) // 2] ^= 1  # one flipped bit, same size
    res.body = bytes(body)
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert mirror.seen("GET", name) and not mirror.seen(
        "GET", TOK if name == MODEL else MODEL
    )
    assert json.loads((tmp_path / f".{name}.verified.json").read_text())[
        "source"
    ].startswith(mirror.url)


def test_hub_announcing_wrong_size_is_rejected(hosts, payloads, tmp_path):
    hub, cdn, mirror = hosts
    hub.resources[HUB_PREFIX + MODEL].headers["X-Linked-Size"] = "999999"
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert mirror.seen("GET", MODEL)


def test_truncated_file_without_record_is_replaced(hosts, payloads, tmp_path):
    hub, cdn, mirror = hosts
    (tmp_path / MODEL).write_bytes(payloads[MODEL][:1000])
    (tmp_path / TOK).write_bytes(payloads[TOK])  # complete but never verified
    assert not is_verified(tmp_path / MODEL) and not is_verified(tmp_path / TOK)
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert cdn.seen("GET", MODEL)


def test_file_shrunk_after_verification_is_downloaded_again(hosts, payloads, tmp_path):
    hub, cdn, mirror = hosts
    download_qwen3_small("base", out_dir=tmp_path)
    with (tmp_path / MODEL).open("r+b") as f:
        f.truncate(10)
    assert not is_verified(tmp_path / MODEL)
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert len(cdn.seen("GET", MODEL)) == 2


def test_everything_down_raises_one_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("QWEN3_STANDIN", raising=False)
    hub_url, mirror_url = closed_port_url(), closed_port_url() + "/qwen3"
    monkeypatch.setenv("HF_ENDPOINT", hub_url)
    with pytest.raises(DownloadError) as err:
        download_qwen3_small("base", out_dir=tmp_path, backup_url=mirror_url)
    assert isinstance(err.value, RuntimeError)
    message = str(err.value)
    assert f"{hub_url}/rasbt/qwen3-from-scratch/resolve/main/{TOK}" in message
    assert f"{mirror_url}/{TOK}" in message
    for hint in [
        "HTTPS_PROXY",
        "REQUESTS_CA_BUNDLE",
        "SSL_CERT_FILE",
        "HF_ENDPOINT",
        "ModelScope",
        "QWEN3_STANDIN=1",
        "RANDOM weights",
    ]:
        assert hint in message
    assert [url for url, _ in err.value.attempts] == [
        f"{hub_url}/rasbt/qwen3-from-scratch/resolve/main/{TOK}",
        f"{mirror_url}/{TOK}",
    ]
    assert leftovers(tmp_path) == [] and not (tmp_path / TOK).exists()


def test_lying_mirror_leaves_nothing_behind(hosts, payloads, tmp_path):
    """Hub down, mirror announces a sha1 the bytes do not have: error, and
    neither the final name nor a .part file remains."""
    hub, cdn, mirror = hosts
    hub.resources[HUB_PREFIX + TOK].status = 503
    mirror.resources[MIRROR_PREFIX + TOK].headers["x-bz-content-sha1"] = "0" * 40
    with pytest.raises(DownloadError, match="sha1"):
        download_qwen3_small("base", out_dir=tmp_path)
    assert leftovers(tmp_path) == [] and not (tmp_path / TOK).exists()


def test_standin_found_in_real_mode_is_replaced(hosts, payloads, tmp_path):
    for name in (TOK, MODEL):
        path = tmp_path / name
        path.write_bytes(b"x" * len(payloads[name]))  # same size as the real one
        provenance.sidecar_path(path).write_text('{"standin": true}')
        # even a verification record must not make a stand-in count as real
        (tmp_path / f".{name}.verified.json").write_text(
            json.dumps({"version": 1, "file": name, "size": len(payloads[name]),
                        "sha256": "0" * 64})
        )  # fmt: skip
        assert not is_verified(path)
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    sidecar = provenance.SIDECAR_SUFFIX
    assert not any(p.name.endswith(sidecar) for p in tmp_path.iterdir())


def test_standin_mode_makes_no_request(hosts, tmp_path, capsys, standin_env):
    out = tmp_path / "qwen3"
    first = download_qwen3_small("base", out_dir=out)
    files = download_qwen3_small("base", out_dir=out)  # cheap: already stand-ins
    assert first == files
    assert files == Qwen3Files(standin_env / TOK, standin_env / MODEL, standin=True)
    assert all(provenance.is_standin(p) and not is_verified(p) for p in files)
    assert provenance.checkpoint_is_marked(files.model)
    assert all(h.seen() == [] for h in hosts)
    captured = capsys.readouterr()
    assert captured.err.count(provenance.BANNER) == 2 and captured.out == ""
    assert not out.exists()  # the reader's folder is not even created


def test_standin_mode_builds_once(hosts, tmp_path, standin_env, tiny_standin_weights):
    download_qwen3_small("base", out_dir=tmp_path / "a")
    download_qwen3_small("base", out_dir=tmp_path / "b")
    assert tiny_standin_weights == [standin_env / MODEL]  # second call reused it


@pytest.mark.skipif(
    os.environ.get("QWEN3_REAL_DOWNLOAD") != "1",
    reason="downloads from the real hosts; set QWEN3_REAL_DOWNLOAD=1",
)
@pytest.mark.parametrize("source", ["hub", "backup"])
def test_real_tokenizer_download(monkeypatch, tmp_path, source):
    from reasoning_from_scratch.qwen3 import Qwen3Tokenizer

    monkeypatch.delenv("QWEN3_STANDIN", raising=False)
    if source == "backup":
        monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert is_verified(files.tokenizer) and not files.standin
    record = json.loads((tmp_path / f".{TOK}.verified.json").read_text())
    assert ("backblazeb2" in record["source"]) == (source == "backup")
    tok = Qwen3Tokenizer(tokenizer_file_path=files.tokenizer)
    ids = tok.encode("Hello, world!")
    assert tok.decode(ids) == "Hello, world!"
    assert tok.eos_token_id == 151643


# --------------------------------------------------------------------------
# Stand-ins never touch real files
# --------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_standin_call_leaves_real_downloads_alone(
    hosts, payloads, tmp_path, monkeypatch, capsys, tiny_standin_weights
):
    real = tmp_path / "qwen3"
    download_qwen3_small("base", out_dir=real)
    before = snapshot(real)
    assert is_verified(real / TOK) and is_verified(real / MODEL)
    monkeypatch.setenv("QWEN3_STANDIN", "1")
    monkeypatch.setenv(standin.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(standin.DIR_ENV, str(tmp_path / "standin-files"))
    files = download_qwen3_small("base", out_dir=real)
    assert files.standin and files.tokenizer.parent == tmp_path / "standin-files"
    assert provenance.is_standin(files.model) and provenance.is_standin(files.tokenizer)
    assert snapshot(real) == before  # byte for byte, nothing added or removed
    assert is_verified(real / TOK) and is_verified(real / MODEL)
    assert f"nothing in {real}/ was touched" in capsys.readouterr().err


def test_standin_default_folder_is_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(standin.DIR_ENV, raising=False)
    monkeypatch.setenv(standin.CACHE_ENV, str(tmp_path / "c"))
    assert standin.standin_files_dir() == tmp_path / "c" / "files"


def test_standin_refuses_to_replace_a_verified_file(
    hosts, payloads, tmp_path, monkeypatch, capsys, tiny_standin_weights
):
    """Even pointed at a folder of real downloads, stand-in mode refuses."""
    real = tmp_path / "qwen3"
    download_qwen3_small("base", out_dir=real)
    before = snapshot(real)
    capsys.readouterr()
    monkeypatch.setenv("QWEN3_STANDIN", "1")
    monkeypatch.setenv(standin.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(standin.DIR_ENV, str(real))
    with pytest.raises(FileExistsError, match="verified real file"):
        download_qwen3_small("base", out_dir=real)
    for write in (standin.write_standin_tokenizer, standin.write_standin_weights):
        name = TOK if write is standin.write_standin_tokenizer else MODEL
        with pytest.raises(FileExistsError):
            write(real / name, "base")
    assert snapshot(real) == before
    out = said(capsys.readouterr().err)
    refusals = [line for line in out if "will not replace" in line]
    assert len(refusals) == 3 and str(real / TOK) in refusals[0]


def test_copied_standin_checkpoint_is_still_recognised(tmp_path, monkeypatch):
    monkeypatch.setenv(standin.CACHE_ENV, str(tmp_path / "cache"))
    marked = standin.write_standin_weights(tmp_path / "a" / MODEL, "base", cfg=TINY)
    copy = tmp_path / "b" / MODEL
    copy.parent.mkdir()
    copy.write_bytes(marked.read_bytes())  # the sidecar stays behind
    assert not provenance.sidecar_path(copy).exists()
    assert provenance.is_standin(copy)
    plain = tmp_path / "plain.pth"
    plain.write_bytes(fake_checkpoint(TINY))
    assert not provenance.is_standin(plain)
    for junk in (b"", b"<html>portal</html>", b"PK\x03\x04 broken zip"):
        plain.write_bytes(junk)
        assert not provenance.is_standin(plain)


def test_copied_standin_prints_the_banner_in_cli_and_benchmark(
    tmp_path, monkeypatch, capsys
):
    import argparse

    from utils.benchmark import runner as benchmark
    from utils.cli import commands as cli

    monkeypatch.setenv(standin.CACHE_ENV, str(tmp_path / "cache"))
    marked = standin.write_standin_weights(tmp_path / "a" / MODEL, "base", cfg=TINY)
    copy = tmp_path / "b" / MODEL
    copy.parent.mkdir()
    copy.write_bytes(marked.read_bytes())
    tok = tmp_path / "b" / TOK
    tok.write_bytes(b"{}")
    args = argparse.Namespace(model_file=copy, tokenizer_file=tok, out_dir=tmp_path)
    assert cli._files(args, "base")[2] is True
    assert provenance.BANNER in capsys.readouterr().err
    _, _, is_standin = benchmark._weights(copy, tmp_path)
    assert is_standin and provenance.BANNER in capsys.readouterr().err


# --------------------------------------------------------------------------
# Content checks: nothing unverified is used
# --------------------------------------------------------------------------

PORTAL = b"<!DOCTYPE html><html><body>Please log in to the Wi-Fi</body></html>"


@pytest.mark.parametrize(
    "name, body, expected",
    [
        (MODEL, PORTAL * 50, "HTML page"),
        (TOK, PORTAL * 50, "HTML page"),
        (TOK, b'{"error": "quota exceeded"}', "JSON error message (quota exceeded)"),
        (MODEL, b'{"message": "Not found"}', "JSON error message"),
        (MODEL, "truncate", "truncated"),
        (TOK, "truncate", "truncated"),
        (MODEL, "wrong-shape", "not the Qwen3 0.6B weights"),
        (TOK, "wrong-vocab", "vocabulary has"),
    ],
)
def test_mirror_without_hash_sending_the_wrong_thing_is_rejected(
    hosts, payloads, tmp_path, name, body, expected
):
    """The Hub is down and the mirror announces no hash: the content check is
    all that stands between the reader and a bogus file."""
    hub, cdn, mirror = hosts
    hub.resources.clear()
    if body == "truncate":
        body = payloads[name][: len(payloads[name]) // 2]
    elif body == "wrong-shape":
        body = fake_checkpoint(tiny_config(emb_dim=32, head_dim=8))
    elif body == "wrong-vocab":
        body = fake_tokenizer_json(VOCAB - 1)
    mirror.resources[MIRROR_PREFIX + name] = download_res = serve_like_b2(
        mirror, name, body, large=True
    )
    download_res.headers.clear()  # no hash announced, like a proxy's answer
    with pytest.raises(DownloadError) as err:
        download_qwen3_small("base", out_dir=tmp_path)
    message = str(err.value)
    assert f"{mirror.url}{MIRROR_PREFIX}{name}" in message
    assert expected in message and "captive portal" in message
    assert not (tmp_path / name).exists()
    assert not (tmp_path / f".{name}.verified.json").exists()
    assert not (tmp_path / f"{name}.part").exists()


def test_hub_checkpoint_with_wrong_keys_is_rejected(hosts, payloads, tmp_path):
    """Right hash for what the Hub announced, but not the book's model."""
    hub, cdn, mirror = hosts
    serve_like_hub(hub, cdn, MODEL, fake_checkpoint(tiny_config(n_layers=1)))
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)  # from the mirror instead
    assert mirror.seen("GET", MODEL)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("name", [TOK, MODEL])
def test_flipped_byte_after_verification_is_caught(hosts, payloads, tmp_path, name):
    hub, cdn, mirror = hosts
    download_qwen3_small("base", out_dir=tmp_path)
    flip_byte_keep_mtime(tmp_path / name)
    assert not is_verified(tmp_path / name)
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)


def test_forged_or_old_records_lead_to_reverification(hosts, payloads, tmp_path):
    hub, cdn, mirror = hosts
    download_qwen3_small("base", out_dir=tmp_path)
    record_file = tmp_path / f".{MODEL}.verified.json"
    good = json.loads(record_file.read_text())
    # forged: right size and times, wrong hash, written after the fact
    record_file.write_text(json.dumps({**good, "sha256": "0" * 64, "ctime_ns": 1}))
    assert not is_verified(tmp_path / MODEL)
    # a record from the previous format (no times) with the right hash: the
    # file is hashed and checked again, then the record is renewed
    old = {k: good[k] for k in ("file", "size", "sha256")}
    record_file.write_text(json.dumps({**old, "version": 1}))
    gets = len(cdn.seen("GET"))
    assert is_verified(tmp_path / MODEL)
    renewed = json.loads(record_file.read_text())
    assert renewed["version"] == provenance.RECORD_VERSION and "mtime_ns" in renewed
    # touched (new time, same bytes): re-hashed, trusted, no download
    os.utime(tmp_path / MODEL)
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert len(cdn.seen("GET")) == gets


def test_record_for_a_real_stand_in_shaped_file_is_not_trusted(
    hosts, payloads, tmp_path, monkeypatch
):
    """A marked stand-in served as if real is refused by the content check."""
    hub, cdn, mirror = hosts
    monkeypatch.setenv(standin.CACHE_ENV, str(tmp_path / "cache"))
    fake = standin.write_standin_weights(tmp_path / "w" / MODEL, "base", cfg=TINY)
    serve_like_hub(hub, cdn, MODEL, fake.read_bytes())
    files = download_qwen3_small("base", out_dir=tmp_path / "out")
    assert_real(files, payloads)


# --------------------------------------------------------------------------
# Bounded retries and timeouts
# --------------------------------------------------------------------------


def test_server_ignoring_range_and_dropping_gives_up_after_few_requests(
    hosts, payloads, tmp_path
):
    hub, cdn, mirror = hosts
    hub.resources.clear()
    res = mirror.resources[MIRROR_PREFIX + TOK]
    res.honour_range = False
    res.drop_after = [50_000] * 1000
    with pytest.raises(DownloadError, match=TOK):
        download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    gets = len(mirror.seen("GET", TOK))
    assert 2 <= gets <= download_sources._MAX_STALLS + 1, gets
    assert not (tmp_path / TOK).exists()


def test_requests_are_capped_even_while_bytes_arrive(
    hosts, payloads, tmp_path, monkeypatch
):
    """A link that drops every few kB still makes progress; the cap ends it."""
    hub, cdn, mirror = hosts
    hub.resources.clear()
    monkeypatch.setattr(download_sources, "_MAX_REQUESTS", 2)
    # each try brings one 64 kB read before the drop
    mirror.resources[MIRROR_PREFIX + TOK].drop_after = [70_000] * 1000
    with pytest.raises(DownloadError):
        download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert len(mirror.seen("GET", TOK)) == 2


def test_backoff_doubles(hosts, tmp_path, monkeypatch):
    hub, cdn, mirror = hosts
    hub.resources.clear()
    pauses: list[float] = []
    monkeypatch.setattr(download_sources, "_BACKOFF", 1.0)
    monkeypatch.setattr(download_sources.time, "sleep", pauses.append)
    with SilentHost() as silent:
        monkeypatch.setenv(download.TIMEOUT_ENV, "0.2")
        with pytest.raises(DownloadError):
            download_qwen3_small(
                "base", tokenizer_only=True, out_dir=tmp_path, backup_url=silent.url
            )
    assert pauses == [1.0, 2.0]


@pytest.mark.parametrize("where", ["hub", "mirror", "both"])
def test_silent_hosts_fail_over_quickly(hosts, payloads, tmp_path, monkeypatch, where):
    """A host that accepts connections and never answers costs at most a few
    timeouts (QWEN3_DOWNLOAD_TIMEOUT; default 10 s: about 33 s per source)."""
    import time

    hub, cdn, mirror = hosts
    monkeypatch.setenv(download.TIMEOUT_ENV, "0.5")
    with SilentHost() as silent:
        if where in ("hub", "both"):
            monkeypatch.setenv("HF_ENDPOINT", silent.url)
        backup = silent.url if where in ("mirror", "both") else None
        start = time.monotonic()
        if where == "both":  # each source said to have timed out
            with pytest.raises(DownloadError) as err:
                download_qwen3_small(
                    "base", tokenizer_only=True, out_dir=tmp_path, backup_url=backup
                )
            assert [msg for _, msg in err.value.attempts] == [
                "timed out after 0.5 s (no answer from 127.0.0.1)"
            ] * 2
        else:
            files = download_qwen3_small(
                "base", tokenizer_only=True, out_dir=tmp_path, backup_url=backup
            )
            assert files.tokenizer.read_bytes() == payloads[TOK]
        elapsed = time.monotonic() - start
    assert elapsed < 8, elapsed


def test_timeout_setting(monkeypatch):
    monkeypatch.delenv(download.TIMEOUT_ENV, raising=False)
    assert download.download_timeout() == 10.0
    for value, expected in [("60", 60.0), ("0.5", 0.5), ("x", 10.0), ("-1", 10.0)]:
        monkeypatch.setenv(download.TIMEOUT_ENV, value)
        assert download.download_timeout() == expected


# --------------------------------------------------------------------------
# Two processes, one folder; the Hub path across runs; Xet
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_two_processes_share_one_folder(hosts, payloads, tmp_path):
    hub, cdn, mirror = hosts
    hub.resources[HUB_PREFIX + TOK].delay = 0.3  # slow: the runs overlap
    cdn.resources[f"/cdn/{MODEL}"].delay = 0.1
    env = child_env(hub, mirror)
    procs = [run_child(tmp_path, env) for _ in range(2)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("OK" in out for out in outs)
    assert any("waiting" in out for out in outs), outs
    files = Qwen3Files(tmp_path / TOK, tmp_path / MODEL, standin=False)
    assert_real(files, payloads)
    assert len(hub.seen("GET", TOK)) == 1 and len(cdn.seen("GET", MODEL)) == 1
    assert mirror.seen() == [] and leftovers(tmp_path) == []


@pytest.mark.slow
def test_hub_file_finished_before_a_kill_is_not_fetched_again(
    hosts, payloads, tmp_path, store
):
    """A run killed after the transfer (while checking the file) leaves the
    whole file as its partial in the staging folder; the next run installs
    it without a second transfer and leaves no staging folder behind."""
    hub, cdn, mirror = hosts
    child = run_child(tmp_path, child_env(hub, mirror), "die-after-transfer", "tok")
    out = child.communicate(timeout=240)[0]
    assert child.returncode == 3, out
    [kept] = (store / f".{TOK}.hub").glob(f"{TOK}.*.incomplete")
    assert kept.read_bytes() == payloads[TOK]
    stale = store / f".{TOK}.hub" / ".cache" / "x.incomplete"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"partial")  # what a kill mid-transfer leaves
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert files.tokenizer.read_bytes() == payloads[TOK]
    assert is_verified(files.tokenizer)
    assert len(hub.seen("GET", TOK)) == 1  # the body was sent once in all
    assert leftovers(tmp_path) == [] == leftovers(store)  # staging folder gone


def test_hub_failure_mid_transfer_leaves_nothing(hosts, payloads, tmp_path):
    hub, cdn, mirror = hosts
    cdn.resources[f"/cdn/{MODEL}"].status = 500
    mirror.resources.clear()
    with pytest.raises(DownloadError):
        download_qwen3_small("base", out_dir=tmp_path)
    assert leftovers(tmp_path) == []


def add_xet_headers(hub: FakeHost) -> None:
    hub.resources[HUB_PREFIX + MODEL].headers.update(
        {
            "X-Xet-Hash": "a" * 64,
            "X-Xet-Refresh-Route": f"/api/models/{download.REPO_ID}/xet-read-token",
        }
    )


@pytest.mark.parametrize("disable", [None, "1"])
def test_hf_hub_disable_xet_is_read_at_call_time(
    hosts, payloads, tmp_path, monkeypatch, disable
):
    """Set after huggingface_hub was imported, HF_HUB_DISABLE_XET=1 still
    turns Xet off; unset, the library's choice (Xet here) is left alone."""
    hub, cdn, mirror = hosts
    add_xet_headers(hub)
    used_xet = []

    def fake_xet_get(*, incomplete_path, **kwargs):
        used_xet.append(kwargs["xet_file_data"].file_hash)
        Path(incomplete_path).write_bytes(payloads[MODEL])

    monkeypatch.setattr(huggingface_hub.file_download, "xet_get", fake_xet_get)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", False)
    if disable:
        monkeypatch.setenv("HF_HUB_DISABLE_XET", disable)
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert mirror.seen() == []
    if disable:
        assert used_xet == [] and len(cdn.seen("GET", MODEL)) == 1
    else:
        assert used_xet == ["a" * 64] and cdn.seen("GET", MODEL) == []
    assert huggingface_hub.constants.HF_HUB_DISABLE_XET is False  # restored


def test_hub_server_ignoring_range_and_dropping_is_abandoned(
    hosts, payloads, tmp_path, monkeypatch
):
    """huggingface_hub restarts from byte 0 as long as some bytes arrive; the
    download gives up on the Hub after a few restarts and uses the mirror."""
    hub, cdn, mirror = hosts
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
    monkeypatch.setattr(huggingface_hub.file_download.time, "sleep", lambda s: None)
    res = cdn.resources[f"/cdn/{MODEL}"]
    res.honour_range = False
    res.drop_after = [300_000] * 1000
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert len(cdn.seen("GET", MODEL)) <= http_watch.MAX_RESTARTS + 1
    assert len(mirror.seen("GET", MODEL)) == 1


@pytest.mark.slow
def test_notebook_run_under_nbval_leaves_real_downloads_alone(
    hosts, payloads, tmp_path, tmp_path_factory
):
    """What a reader does: real files in `qwen3/` next to a notebook, then
    `uv run pytest` on it. The run (this repository's conftest, stand-ins
    on) must pass and leave every byte of that folder as it was."""
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    folder = tmp_path / "notebooks"
    folder.mkdir()
    notebook = root / "ch02" / "01_main-chapter-code" / "01_tokenizer.ipynb"
    shutil.copy(notebook, folder)
    real = folder / "qwen3"
    download_qwen3_small("base", out_dir=real)
    hub, cdn, mirror = hosts
    reasoning = fake_tokenizer_json(VOCAB, salt="r")
    serve_like_hub(hub, cdn, "tokenizer-reasoning.json", reasoning)
    download_qwen3_small("reasoning", tokenizer_only=True, out_dir=real)
    before = snapshot(real)
    assert len([p for p in real.iterdir() if is_verified(p)]) == 3
    env = {k: v for k, v in os.environ.items() if not k.startswith("QWEN3_")}
    env["PYTHONPATH"] = str(root)
    env["QWEN3_STANDIN_CACHE"] = str(tmp_path_factory.getbasetemp() / "nb-cache")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
         "-c", str(root / "pyproject.toml"), "--rootdir", str(root), "-q",
         str(folder / notebook.name)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "passed" in result.stdout
    assert snapshot(real) == before


# --------------------------------------------------------------------------
# Every wait bounded: slow-loris, rate limits, the Hub's timeout, leftovers
# --------------------------------------------------------------------------


@pytest.fixture
def quick_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stall rule at test scale: at least 1 kB in every second."""
    monkeypatch.setattr(http_watch, "_STALL_WINDOW", 1.0)
    monkeypatch.setattr(http_watch, "_STALL_MIN_BYTES", 1024)
    monkeypatch.setenv(download.TIMEOUT_ENV, "0.5")  # a byte every 0.1 s passes


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_slow_loris_on_the_hub_cdn_fails_over_to_the_mirror(
    hosts, payloads, tmp_path, capsys, quick_stall, phase
):
    """A CDN sending a byte every 0.1 s never trips a per-read timeout; the
    stall rule ends it after about a second and the mirror delivers."""
    import time

    hub, cdn, mirror = hosts
    res = cdn.resources[f"/cdn/{MODEL}"]
    res.trickle, res.trickle_headers, res.trickle_gets = 0.1, phase == "headers", 3
    start = time.monotonic()
    files = download_qwen3_small("base", out_dir=tmp_path)
    elapsed = time.monotonic() - start
    assert_real(files, payloads)
    assert mirror.seen("GET", MODEL) and len(cdn.seen("GET", MODEL)) == 1
    [failed] = [
        line
        for line in source_lines(capsys.readouterr().err, MODEL)
        if "failed" in line
    ]
    assert "Hugging Face Hub" in failed and "too slow" in failed
    assert " B/s" in failed and "1.0 kB per 1 s" in failed
    assert elapsed < 6, elapsed
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_slow_loris_on_the_mirror_ends_with_one_line(
    hosts, payloads, tmp_path, capsys, quick_stall, phase
):
    import time

    hub, cdn, mirror = hosts
    hub.resources.clear()
    res = mirror.resources[MIRROR_PREFIX + TOK]
    res.trickle, res.trickle_headers, res.trickle_gets = 0.1, phase == "headers", 3
    start = time.monotonic()
    with pytest.raises(DownloadError) as err:
        download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    elapsed = time.monotonic() - start
    assert elapsed < 6, elapsed
    assert len(mirror.seen("GET", TOK)) == 1  # no retry of a stalled source
    hub_failed, failed = failed_lines(capsys.readouterr().err, TOK)
    assert "HTTP 404" in hub_failed
    assert "backup mirror" in failed and "too slow" in failed and "B/s" in failed
    assert "too slow" in err.value.attempts[-1][1]
    assert not (tmp_path / TOK).exists()


def fake_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the sleeps huggingface_hub's HTTP retries ask for, without
    sleeping (only that module's `time` is replaced)."""
    import time as real_time
    import types

    import huggingface_hub.utils._http as hub_http

    sleeps: list[float] = []
    fake = types.SimpleNamespace(**vars(real_time))
    fake.sleep = sleeps.append
    monkeypatch.setattr(hub_http, "time", fake)
    return sleeps


def test_retry_after_an_hour_is_not_waited_for(
    hosts, payloads, tmp_path, capsys, monkeypatch
):
    hub, cdn, mirror = hosts
    sleeps = fake_sleeps(monkeypatch)
    res = cdn.resources[f"/cdn/{MODEL}"]
    res.status, res.headers["Retry-After"] = 429, "3600"
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)  # from the mirror
    assert mirror.seen("GET", MODEL)
    assert max(sleeps, default=0) <= download_sources._MAX_RATE_WAIT, sleeps
    assert len(cdn.seen("GET", MODEL)) == 1
    [failed] = [
        line
        for line in source_lines(capsys.readouterr().err, MODEL)
        if "failed" in line
    ]
    assert "HTTP 429" in failed and "asks to wait 3600 s" in failed
    assert "try again after" in failed


def test_rate_limit_with_both_sources_down_says_when_to_try_again(
    hosts, tmp_path, monkeypatch
):
    hub, cdn, mirror = hosts
    fake_sleeps(monkeypatch)
    for res in (
        cdn.resources[f"/cdn/{MODEL}"],
        mirror.resources[MIRROR_PREFIX + MODEL],
    ):
        res.status, res.headers["Retry-After"] = 429, "3600"
    with pytest.raises(DownloadError) as err:
        download_qwen3_small("base", out_dir=tmp_path)
    hub_says, mirror_says = (msg for _, msg in err.value.attempts)
    assert hub_says.startswith("127.0.0.1 is rate-limiting this machine (HTTP 429)")
    assert mirror_says.startswith("HTTP 429 Too Many Requests from 127.0.0.1; it ")
    for says in (hub_says, mirror_says):
        assert "asks to wait 3600 s; try again after" in says


def test_short_rate_limits_are_waited_for_within_the_allowance(
    hosts, payloads, tmp_path, monkeypatch
):
    """Retry-After: 2 is honoured (huggingface_hub sleeps 3 s) while the
    waits add up to at most `_MAX_RATE_WAIT`; the next one ends the Hub."""
    hub, cdn, mirror = hosts
    sleeps = fake_sleeps(monkeypatch)
    monkeypatch.setattr(download_sources, "_MAX_RATE_WAIT", 5.0)
    res = cdn.resources[f"/cdn/{MODEL}"]
    res.headers["Retry-After"] = "2"
    res.statuses = [429]
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert sleeps == [3.0] and not mirror.seen("GET", MODEL)  # the Hub, after 3 s

    res.statuses = [429, 429, 429]
    sleeps.clear()
    monkeypatch.setenv("QWEN3_MODEL_STORE", str(tmp_path / "another-store"))
    out = tmp_path / "second"
    files = download_qwen3_small("base", out_dir=out)
    assert_real(files, payloads)
    assert sleeps == [3.0, 3.0] and mirror.seen("GET", MODEL)  # 2 + 2 + 2 > 5


def test_download_timeout_governs_the_hub_transfer(
    hosts, payloads, tmp_path, monkeypatch
):
    """QWEN3_DOWNLOAD_TIMEOUT reaches huggingface_hub's GET (it reads its
    own HF_HUB_DOWNLOAD_TIMEOUT once, at import)."""
    import time

    hub, cdn, mirror = hosts
    monkeypatch.setenv(download.TIMEOUT_ENV, "0.5")
    fake_sleeps(monkeypatch)
    monkeypatch.setattr(huggingface_hub.file_download.time, "sleep", lambda s: None)
    real = huggingface_hub.file_download.http_stream_backoff
    timeouts: list[float] = []

    def spy(*args, **kwargs):
        timeouts.append(kwargs["timeout"])
        if kwargs["timeout"] != 0.5:  # fail fast instead of 6 x 10 s
            raise RuntimeError(f"GET with timeout {kwargs['timeout']}")
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub.file_download, "http_stream_backoff", spy)
    with SilentHost() as silent:
        hub.resources[HUB_PREFIX + MODEL].redirect = f"{silent.url}/cdn/{MODEL}"
        start = time.monotonic()
        files = download_qwen3_small("base", out_dir=tmp_path)
        elapsed = time.monotonic() - start
    assert_real(files, payloads)  # from the mirror
    assert timeouts and set(timeouts) == {0.5}, timeouts
    assert elapsed < 8, elapsed
    assert huggingface_hub.constants.HF_HUB_DOWNLOAD_TIMEOUT == 10  # restored


DISK_FULL_CHILD = """
import resource, signal, sys
from tests.tiny import tiny_config
from utils.download import fetch as download
from utils.download import provenance
provenance.MODEL_CONFIG = tiny_config()
provenance.TOKENIZER_VOCAB = int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes fail with EFBIG instead
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
download.download_qwen3_small("base", out_dir=sys.argv[1])
"""


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_FSIZE is POSIX")
def test_part_file_left_by_a_full_disk_goes_once_the_hub_delivers(
    hosts, payloads, tmp_path, monkeypatch, store
):
    import subprocess
    import sys

    hub, cdn, mirror = hosts
    limit = len(payloads[TOK]) + 100_000  # the tokenizer fits, the weights not
    assert limit < len(payloads[MODEL])
    env = child_env(hub, mirror)
    env["HF_ENDPOINT"] = closed_port_url()  # first run: the Hub is down
    proc = subprocess.run(
        [sys.executable, "-c", DISK_FULL_CHILD, str(tmp_path), str(VOCAB), str(limit)],
        env=env, cwd=Path(__file__).resolve().parents[1],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout + proc.stderr
    part = store / f"{MODEL}.part"
    assert 0 < part.stat().st_size <= limit  # kept: a resume can use it
    files = download_qwen3_small("base", out_dir=tmp_path)  # the Hub is up now
    assert_real(files, payloads)
    assert cdn.seen("GET", MODEL) and not part.exists()
    assert leftovers(tmp_path) == []
    [failed] = [line for line in failed_lines(proc.stderr, MODEL) if "mirror" in line]
    assert failed.endswith("failed: file too large for this system's file size limit")


def test_leftovers_beside_a_verified_file_go(hosts, payloads, tmp_path):
    download_qwen3_small("base", out_dir=tmp_path)
    (tmp_path / f"{MODEL}.part").write_bytes(b"x" * 1000)
    (tmp_path / f".{MODEL}.hub").mkdir()
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert leftovers(tmp_path) == []


# --------------------------------------------------------------------------
# The first failure a reader meets: what it says and what it leaves
# --------------------------------------------------------------------------


def test_source_lines_name_the_cause_in_a_few_words(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("QWEN3_STANDIN", raising=False)
    hub_url, mirror_url = closed_port_url(), closed_port_url()
    monkeypatch.setenv("HF_ENDPOINT", hub_url)
    with pytest.raises(DownloadError) as err:
        download_qwen3_small("base", out_dir=tmp_path, backup_url=mirror_url)
    hub_line, mirror_line = failed_lines(capsys.readouterr().err, TOK)
    host_port = hub_url.removeprefix("http://")
    assert hub_line == (
        f"{TOK}: Hugging Face Hub (HF_ENDPOINT={hub_url}) failed: "
        f"connection refused by {host_port}"
    )
    assert mirror_line.endswith(
        f"failed: connection refused by {mirror_url.removeprefix('http://')}"
    )
    assert [msg for _, msg in err.value.attempts] == [
        f"connection refused by {host_port}",
        f"connection refused by {mirror_url.removeprefix('http://')}",
    ]


def test_unresolvable_hosts_are_named(monkeypatch, tmp_path, capsys):
    import socket

    monkeypatch.delenv("QWEN3_STANDIN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)

    def no_dns(host, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(DownloadError) as err:
        download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert [msg for _, msg in err.value.attempts] == [
        "cannot resolve huggingface.co",
        "cannot resolve f001.backblazeb2.com",
    ]
    err = capsys.readouterr().err
    assert f"{TOK}: Hugging Face Hub (https://huggingface.co) failed: " in err


def test_hint_gives_the_import_command_for_the_folder_asked_for(monkeypatch, tmp_path):
    monkeypatch.delenv("QWEN3_STANDIN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    out = tmp_path / "notebooks" / "qwen3"
    with pytest.raises(DownloadError) as err:
        download_qwen3_small("base", out_dir=out, backup_url=closed_port_url())
    message = str(err.value)
    assert (
        "uv run python -m utils.hf_interop import-qwen3 FOLDER --kind base "
        f"--out-dir {out.absolute()}"
    ) in message
    assert "Qwen/Qwen3-0.6B-Base" in message
    assert "Notebook 01 also loads the reasoning tokenizer" in message
    assert "--kind reasoning" in message


def test_failed_download_leaves_no_folder_and_no_lock(monkeypatch, tmp_path):
    monkeypatch.delenv("QWEN3_STANDIN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    new = tmp_path / "a" / "qwen3"
    with pytest.raises(DownloadError):
        download_qwen3_small("base", out_dir=new, backup_url=closed_port_url())
    assert not (tmp_path / "a").exists()  # both folders this call made
    mine = tmp_path / "mine"
    mine.mkdir()  # the reader's own folder stays, without a lock file
    with pytest.raises(DownloadError):
        download_qwen3_small("base", out_dir=mine, backup_url=closed_port_url())
    assert mine.is_dir() and list(mine.iterdir()) == []


@pytest.mark.slow
def test_a_process_waiting_on_a_failed_download_carries_on(hosts, payloads, tmp_path):
    """The failing holder removes the lock file and its empty folder; a
    process that was waiting on the lock then takes it and downloads."""
    import signal

    hub, cdn, mirror = hosts
    out = tmp_path / "qwen3"
    out.mkdir()
    env = {**child_env(hub, mirror), "PYTHONUNBUFFERED": "1"}
    with pytest.raises(RuntimeError, match="holder fails"):
        with download._exclusive(out, TOK):
            child = run_child(out, env, what="tok")
            said = []  # its download's lines, then the wait on the folder
            while len(said) < 20 and "waiting" not in (said or [""])[-1]:
                said.append(child.stdout.readline())
            assert "waiting" in said[-1], said
            # Paused, so it cannot take the lock (and make a new lock file)
            # before the checks below; it carries on when continued.
            child.send_signal(signal.SIGSTOP)
            # kill() returns before the child has stopped (it may still run
            # on the other core for a moment): wait until it has.
            _, status = os.waitpid(child.pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status), status
            raise RuntimeError("holder fails")
    assert not lock_path(out, TOK).exists()
    out.rmdir()  # what download_qwen3_small does with a folder it made
    child.send_signal(signal.SIGCONT)
    rest = child.communicate(timeout=120)[0]
    assert child.returncode == 0, rest
    assert (out / TOK).read_bytes() == payloads[TOK] and is_verified(out / TOK)


def test_a_folder_removed_during_the_lock_wait_is_made_again(monkeypatch, tmp_path):
    """A failed run may remove the empty folder while filelock's poll loop
    makes it again; pathlib then raises FileExistsError for a folder that
    is gone. The wait carries on (checked by injecting that error)."""
    from filelock import FileLock

    out = tmp_path / "qwen3"
    real, calls = FileLock.acquire, []

    def racy(self, *args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            out.rmdir()
            raise FileExistsError(17, "File exists", str(out))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FileLock, "acquire", racy)
    with download._exclusive(out, TOK):
        assert out.is_dir() and lock_path(out, TOK).exists()
    assert len(calls) == 3


def test_a_file_in_place_of_the_folder_is_not_waited_on(tmp_path):
    out = tmp_path / "qwen3"
    out.write_text("not a folder")
    with pytest.raises(FileExistsError):
        with download._exclusive(out, TOK):
            pass


PLAIN_CHILD = """
import sys
from utils.download.fetch import download_qwen3_small
download_qwen3_small("base", out_dir=sys.argv[1])
"""


def offline_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QWEN3_")}
    env.update(
        QWEN3_MODEL_STORE=str(tmp_path / "store"),
        HF_ENDPOINT=closed_port_url(),
        QWEN3_BACKUP_URL=closed_port_url(),
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    return env


@pytest.mark.slow
def test_plain_python_shows_a_short_traceback(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", PLAIN_CHILD, str(tmp_path / "qwen3")],
        env=offline_env(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    err = proc.stderr
    assert err.count('  File "') <= 2, err  # the call and download_qwen3_small
    assert "During handling" not in err and "_ensure_file" not in err
    want = "utils.download.fetch.DownloadError: Could not download tokenizer-base.json"
    assert want in err
    assert "What you can try:" in err


@pytest.mark.slow
def test_ipython_shows_only_the_message(tmp_path):
    """IPython (and so Jupyter) honours `_render_traceback_`: the reader sees
    the message, not the frames."""
    import subprocess
    import sys

    code = PLAIN_CHILD.replace("sys.argv[1]", repr(str(tmp_path / "qwen3")))
    proc = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor",
         "--HistoryManager.enabled=False", "-c", code],
        env=offline_env(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    shown = proc.stdout + proc.stderr
    assert "DownloadError: Could not download tokenizer-base.json" in shown, shown
    assert "Traceback" not in shown and 'File "' not in shown, shown
    assert "What you can try:" in shown


# --------------------------------------------------------------------------
# Progress in a log: one line per phase
# --------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["hub", "mirror"])
def test_progress_without_a_terminal_is_one_line_per_phase(
    hosts, payloads, tmp_path, capsys, monkeypatch, source
):
    hub, cdn, mirror = hosts
    monkeypatch.setenv("TQDM_POSITION", "-1")  # hub bars on although no TTY
    if source == "mirror":
        hub.resources.clear()
    download_qwen3_small("base", out_dir=tmp_path)
    err = capsys.readouterr().err
    assert "\r" not in err  # no bar redrawn with carriage returns
    for name in (TOK, MODEL):
        lines = [x for x in said(err, "utils.download:") if x.startswith(name)]
        lines = [x for x in lines if "% of" in x or " downloading " in x]
        assert len(lines) == 2, err
        assert lines[0].startswith(f"{name}: downloading ")
        assert lines[1].startswith(f"{name}: 100% of ") and " s (" in lines[1]


def test_progress_on_a_terminal_stays_a_bar():
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = http_watch.progress_class(None)(total=1000, file=stream, desc="x.json")
    for _ in range(10):
        bar.update(100)
    bar.close()
    assert "\r" in stream.getvalue() and "downloading" not in stream.getvalue()
