"""What an interrupted or refused download leaves behind: the Hub's partial
file is resumed by the next run (HTTP Range); a full disk leaves no partial
file in the store that keeps it full. Loopback hosts (tests/fake_hosts.py),
a tmpfs for the full disk (root only)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.download_helpers import MODEL, TOK, assert_real, child_env, run_child
from tests.fake_hosts import HUB_PREFIX
from utils.download import sources as download_sources
from utils.download.fetch import download_qwen3_small

# the tiny content checks and a store of each test's own (conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_expectations", "store")


def partials(folder: Path) -> list[Path]:
    return sorted(folder.glob(f".{MODEL}.hub/*.incomplete"))


def wait_for_bytes(folder: Path, child: subprocess.Popen) -> int:
    """Bytes of the child's partial weights once some have arrived."""
    for _ in range(600):
        found = partials(folder)
        if found and found[0].stat().st_size > 0:
            return found[0].stat().st_size
        assert child.poll() is None, child.communicate()[0]
        time.sleep(0.02)
    raise AssertionError("no partial file appeared")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill", "ctrl-c"])
def test_an_interrupted_hub_download_resumes_with_range(
    hosts, payloads, store, tmp_path, how
):
    hub, cdn, mirror = hosts
    sent = cdn.resources[f"/cdn/{MODEL}"]
    sent.delay = 1.0  # a slow link: interrupted midway, even on a busy machine
    child = run_child(tmp_path / "out", child_env(hub, mirror))
    wait_for_bytes(store, child)
    child.send_signal(how)
    child.communicate(timeout=60)
    kept = partials(store)
    assert len(kept) == 1 and 0 < kept[0].stat().st_size < len(payloads[MODEL])
    have = kept[0].stat().st_size
    sent.delay = 0.0
    before = len(cdn.seen("GET", MODEL))
    files = download_qwen3_small("base", out_dir=tmp_path / "out")
    assert_real(files, payloads)
    [again] = cdn.seen("GET", MODEL)[before:]
    assert again.headers.get("range") == f"bytes={have}-"
    assert partials(store) == [] and mirror.seen() == []


def test_a_partial_of_another_version_is_not_resumed(hosts, payloads, store, tmp_path):
    """The partial's name carries the ETag: bytes of an older file go."""
    hub, cdn, mirror = hosts
    staging = download_sources.staging_path(store / MODEL)
    staging.mkdir()
    (staging / f"{MODEL}.{'0' * 64}.incomplete").write_bytes(b"old bytes")
    files = download_qwen3_small("base", out_dir=tmp_path / "out")
    assert_real(files, payloads)
    assert all("range" not in seen.headers for seen in cdn.seen("GET", MODEL))


# --------------------------------------------------------------------------
# A full disk
# --------------------------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0, reason="needs root (a tmpfs)"
)


@pytest.fixture
def small_disk(tmpfs):
    """A 512 kB tmpfs (root only; unmounted afterwards)."""
    return tmpfs("512k", name="small")


@needs_root
@pytest.mark.parametrize("source", ["hub", "mirror"])
def test_a_full_store_keeps_no_partial_file(
    hosts, payloads, tmp_path, small_disk, monkeypatch, capsys, source
):
    """The weights (0.8 MB) do not fit the store's disk: the fallback into
    the reader's folder works, and no partial file is left in the store."""
    hub, cdn, mirror = hosts
    if source == "mirror":
        hub.resources.pop(HUB_PREFIX + MODEL)
    monkeypatch.setenv("QWEN3_MODEL_STORE", str(small_disk / "models"))
    files = download_qwen3_small("base", out_dir=tmp_path / "out")
    assert_real(files, payloads)
    assert files.model == tmp_path / "out" / MODEL
    left = sorted(p.name for p in (small_disk / "models").iterdir())
    assert [n for n in left if MODEL in n] == [], left
    assert TOK in left  # the tokenizer fitted and stays
    assert "no space left on the disk" in capsys.readouterr().err
