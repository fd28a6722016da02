"""download_qwen3_small against loopback servers playing the Hub and the mirror."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import huggingface_hub.constants
import huggingface_hub.file_download
import pytest

from tests.fake_hosts import (
    HUB_PREFIX,
    MIRROR_PREFIX,
    FakeHost,
    Seen,
    serve_like_b2,
    serve_like_hub,
)
from utils import standin
from utils.download import (
    KINDS,
    DownloadError,
    Qwen3Files,
    download_qwen3_small,
    is_verified,
)

TOK, MODEL = "tokenizer-base.json", "qwen3-0.6B-base.pth"


@pytest.fixture
def payloads() -> dict[str, bytes]:
    """Random stand-ins for the two files, a few hundred kB each."""
    return {TOK: os.urandom(200_000), MODEL: os.urandom(600_003)}


@pytest.fixture
def hosts(monkeypatch: pytest.MonkeyPatch, payloads: dict[str, bytes]):
    """Hub (+ its CDN) and mirror, both serving `payloads`; real mode, no xet."""
    monkeypatch.delenv("QWEN3_STANDIN", raising=False)

    def no_xet(*args, **kwargs):
        raise AssertionError("plain HTTP servers must not trigger a xet download")

    monkeypatch.setattr(huggingface_hub.file_download, "xet_get", no_xet)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with FakeHost() as hub, FakeHost() as cdn, FakeHost() as mirror:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("QWEN3_BACKUP_URL", mirror.url + MIRROR_PREFIX.rstrip("/"))
        for name, data in payloads.items():
            serve_like_hub(hub, cdn, name, data)
            serve_like_b2(mirror, name, data, large=name.endswith(".pth"))
        yield hub, cdn, mirror


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def assert_real(files: Qwen3Files, payloads: dict[str, bytes]) -> None:
    assert not files.standin
    for path in files:
        assert path.read_bytes() == payloads[path.name]
        assert is_verified(path)
        assert not standin.is_standin(path)
        assert not path.with_name(path.name + ".part").exists()


def leftovers(folder: Path) -> list[str]:
    """Anything in `folder` apart from finished files and their records."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if not (p.name in (TOK, MODEL) or p.name.endswith(".verified.json"))
    )


def test_primary_success(hosts, payloads, tmp_path, capsys, monkeypatch):
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
    assert f"Saved {tmp_path / MODEL}" in captured.out
    assert f"from the Hugging Face Hub: {hub.url}" in captured.out
    assert "100%" in captured.err  # the hub client's progress bars


def test_verified_files_make_no_request(hosts, payloads, tmp_path, capsys):
    download_qwen3_small("base", out_dir=tmp_path)
    before = [len(h.seen()) for h in hosts]
    files = download_qwen3_small("base", out_dir=tmp_path)
    download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert [len(h.seen()) for h in hosts] == before
    assert_real(files, payloads)
    assert "already downloaded and verified" in capsys.readouterr().out


def test_tokenizer_only_and_reasoning_names(hosts, tmp_path):
    hub, cdn, mirror = hosts
    data = b'{"model": "reasoning"}'
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
    assert "backup mirror" in captured.out and mirror.url in captured.out
    assert "100%" in captured.err  # tqdm progress bar
    record = json.loads((tmp_path / f".{MODEL}.verified.json").read_text())
    assert record["checked"] == "sha1 verified"  # from x-bz-info-large_file_sha1


def test_backup_resumes_part_file_from_earlier_call(hosts, payloads, tmp_path):
    hub, cdn, mirror = hosts
    hub.resources.clear()
    (tmp_path / f"{TOK}.part").write_bytes(payloads[TOK][:70_000])
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert_real(files, payloads)
    assert [g.headers.get("range") for g in mirror.seen("GET", TOK)] == ["bytes=70000-"]


def test_backup_restarts_when_server_ignores_range(hosts, payloads, tmp_path):
    hub, cdn, mirror = hosts
    hub.resources.clear()
    mirror.resources[MIRROR_PREFIX + TOK].honour_range = False
    (tmp_path / f"{TOK}.part").write_bytes(payloads[TOK][:70_000])
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert_real(files, payloads)  # not 70 kB of prefix + the whole file again
    # restarted on the 200 itself, not after a failed size check and a new GET
    assert range_starts(mirror.seen("GET", TOK)) == [70_000]


def test_stale_part_file_is_discarded(hosts, payloads, tmp_path):
    """A .part that is not a prefix of the file fails the sha1 check after
    resuming; the download then starts over once and succeeds."""
    hub, cdn, mirror = hosts
    hub.resources.clear()
    (tmp_path / f"{TOK}.part").write_bytes(os.urandom(70_000))
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
    res.body = os.urandom(len(payloads[name]))
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
    assert list(tmp_path.iterdir()) == []


def test_lying_mirror_leaves_nothing_behind(hosts, payloads, tmp_path):
    """Hub down, mirror announces a sha1 the bytes do not have: error, and
    neither the final name nor a .part file remains."""
    hub, cdn, mirror = hosts
    hub.resources[HUB_PREFIX + TOK].status = 503
    mirror.resources[MIRROR_PREFIX + TOK].headers["x-bz-content-sha1"] = "0" * 40
    with pytest.raises(DownloadError, match="sha1"):
        download_qwen3_small("base", out_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_standin_found_in_real_mode_is_replaced(hosts, payloads, tmp_path):
    for name in (TOK, MODEL):
        path = tmp_path / name
        path.write_bytes(b"x" * len(payloads[name]))  # same size as the real one
        standin.sidecar_path(path).write_text('{"standin": true}')
        # even a verification record must not make a stand-in count as real
        (tmp_path / f".{name}.verified.json").write_text(
            json.dumps({"version": 1, "file": name, "size": len(payloads[name]),
                        "sha256": "0" * 64})
        )  # fmt: skip
        assert not is_verified(path)
    files = download_qwen3_small("base", out_dir=tmp_path)
    assert_real(files, payloads)
    assert not any(p.name.endswith(standin.SIDECAR_SUFFIX) for p in tmp_path.iterdir())


@pytest.fixture
def tiny_standin_weights(monkeypatch):
    """Build stand-in weights for a tiny config instead of the 0.6B shape."""
    from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B

    tiny = {**QWEN_CONFIG_06_B, "vocab_size": 1000, "emb_dim": 64, "hidden_dim": 128,
            "n_layers": 2, "n_heads": 2, "n_kv_groups": 1, "head_dim": 32}  # fmt: skip
    real = standin.write_standin_weights
    calls = []

    def write(path, kind="base", cfg=None):
        calls.append(Path(path))
        return real(path, kind, cfg=tiny)

    monkeypatch.setattr(standin, "write_standin_weights", write)
    # The exact tokenizer build takes ~20 s and is tested on its own; a small
    # JSON stands in for it here.
    qwen3_tokenizer = pytest.importorskip("utils.qwen3_tokenizer")
    monkeypatch.setattr(
        qwen3_tokenizer, "build_qwen3_tokenizer_json", lambda: '{"fake": true}'
    )
    return calls


def test_standin_mode_makes_no_request(
    hosts, tmp_path, monkeypatch, capsys, tiny_standin_weights
):
    monkeypatch.setenv("QWEN3_STANDIN", "1")
    monkeypatch.setenv("QWEN3_STANDIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "qwen3"
    first = download_qwen3_small("base", out_dir=out)
    files = download_qwen3_small("base", out_dir=out)  # cheap: already stand-ins
    assert first == files
    assert files == Qwen3Files(out / TOK, out / MODEL, standin=True)
    assert all(standin.is_standin(p) and not is_verified(p) for p in files)
    assert standin.checkpoint_is_marked(files.model)
    assert all(h.seen() == [] for h in hosts)
    assert capsys.readouterr().out.count(standin.BANNER) == 2  # once per call
    assert tiny_standin_weights == [out / MODEL]  # second call reused the files


def test_standin_mode_replaces_verified_real_files(
    hosts, payloads, tmp_path, monkeypatch, tiny_standin_weights
):
    download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert is_verified(tmp_path / TOK)
    monkeypatch.setenv("QWEN3_STANDIN", "1")
    monkeypatch.setenv("QWEN3_STANDIN_CACHE", str(tmp_path / "cache"))
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path)
    assert files.standin and standin.is_standin(files.tokenizer)
    assert not is_verified(files.tokenizer)
    assert not (tmp_path / f".{TOK}.verified.json").exists()
    assert files.tokenizer.read_bytes() != payloads[TOK]


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
