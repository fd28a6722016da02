"""utils.provenance: records, stand-in markers and content checks, the one
home the download, the stand-in writers and the importer share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fake_hosts import fake_checkpoint, fake_tokenizer_json
from tests.import_graph import find_cycle, graph
from tests.tiny import tiny_config
from utils import models
from utils.download import provenance, standin
from utils.download.provenance import IntegrityError, check_checkpoint, check_tokenizer

TINY = tiny_config()
ROOT = Path(__file__).resolve().parents[1]
ROOM = {"utils.download.fetch", "utils.download.standin", "utils.download.provenance"}


def reachable(edges: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += edges.get(node, set())
    return seen


def test_the_download_room_has_no_import_cycle():
    """download -> standin -> provenance -> (fileio, models, tokenizer
    constants), imports inside functions included; nothing points back."""
    edges = {k: {m for m in v if m != "utils"} for k, v in graph().items()}
    room = reachable(edges, ROOM)
    assert find_cycle({k: edges[k] & room for k in room}) is None
    assert "utils.download.fetch" not in reachable(edges, {"utils.download.standin"})
    assert not reachable(edges, {"utils.download.provenance"}) & {
        "utils.download.fetch",
        "utils.download.standin",
    }


def test_the_notebooks_names_keep_working():
    from utils.download import (
        download_qwen3_small,  # noqa: F401
        print_standin_banner,
    )

    assert print_standin_banner is provenance.print_standin_banner


def test_importing_provenance_does_no_work():
    code = "import sys, utils.download.provenance; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True
    )
    assert out.stdout.strip() == "False", out.stderr


@pytest.fixture
def spied_loader(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Calls of utils.models' loader and shape check, by name."""
    calls: list[str] = []
    for name in ("read_checkpoint", "shape_problems"):
        real = getattr(models, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(models, name, spy)
    return calls


def test_checkpoint_check_uses_the_projects_loader(tmp_path, spied_loader):
    path = tmp_path / "w.pth"
    path.write_bytes(fake_checkpoint(TINY))
    assert "25 tensors" in check_checkpoint(path, TINY)
    assert spied_loader == ["read_checkpoint", "shape_problems"]
    other = tiny_config(emb_dim=32, head_dim=8)
    with pytest.raises(IntegrityError) as err:
        check_checkpoint(path, other)
    sd = torch.load(path, weights_only=True)
    expected = models.summarize_problems(models.shape_problems(sd, other))
    assert str(err.value) == f"not the Qwen3 0.6B weights: {expected}"


class Payload:
    """A picklable object that is not a tensor: weights_only refuses it."""


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"<!DOCTYPE html><html>log in</html>" * 30, "got an HTML page"),
        (b"x" * 5000, "the file is not a PyTorch zip checkpoint (5000 bytes;"),
        ("pickle", "the file does not load: it holds Python objects"),
        ("list", "the file holds a list, not weights"),
    ],
)
def test_checkpoint_check_says_what_the_file_is(tmp_path, content, expected):
    path = tmp_path / "w.pth"
    if content == "pickle":
        torch.save({"a": Payload()}, path)
    elif content == "list":
        torch.save([torch.zeros(1)], path)
    else:
        path.write_bytes(content)
    with pytest.raises(IntegrityError) as err:
        check_checkpoint(path, TINY)
    assert str(err.value).startswith(expected), str(err.value)
    assert str(tmp_path) not in str(err.value)  # no temp path in the line


def test_marked_standin_is_refused_and_recognised(tmp_path, monkeypatch):
    monkeypatch.setenv(standin.CACHE_ENV, str(tmp_path / "cache"))
    path = standin.write_standin_weights(tmp_path / "s.pth", "base", cfg=TINY)
    with pytest.raises(IntegrityError, match="stand-in"):
        check_checkpoint(path, TINY)
    provenance.sidecar_path(path).unlink()
    assert provenance.is_standin(path) and provenance.checkpoint_is_marked(path)
    for junk in (b"", b"PK\x03\x04 broken zip"):
        path.write_bytes(junk)
        assert not provenance.checkpoint_is_marked(path)


def test_tokenizer_check(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "TOKENIZER_VOCAB", 500)
    path = tmp_path / "t.json"
    path.write_bytes(fake_tokenizer_json(500))
    assert check_tokenizer(path) == "500 + 26 added tokens"
    path.write_bytes(fake_tokenizer_json(499))
    with pytest.raises(IntegrityError, match="vocabulary has 499 entries"):
        check_tokenizer(path)
    path.write_bytes(b'{"error": "quota exceeded"}')
    with pytest.raises(IntegrityError, match=r"JSON error message \(quota"):
        check_tokenizer(path)


def test_a_tokenizer_that_passed_is_checked_again_against_other_expectations(
    tmp_path, monkeypatch
):
    """Content that passed once passes again from memory, but only under the
    same expectations: the same bytes fail where Qwen3's size is expected."""
    path = tmp_path / "t.json"
    path.write_bytes(fake_tokenizer_json(500))
    with monkeypatch.context() as mp:
        mp.setattr(provenance, "TOKENIZER_VOCAB", 500)
        assert check_tokenizer(path) == check_tokenizer(path) == "500 + 26 added tokens"
    with pytest.raises(IntegrityError, match="vocabulary has 500 entries"):
        check_tokenizer(path)


def test_record_round_trip_and_a_changed_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(provenance, "TOKENIZER_VOCAB", 500)
    path = tmp_path / "tokenizer-base.json"
    path.write_bytes(fake_tokenizer_json(500))
    assert not provenance.is_verified(path)
    sha = provenance.hash_file(path)["sha256"]
    provenance.write_record(path, {"sha256": sha, "checked": "test"})
    assert provenance.read_record(path)["checked"] == "test"
    assert provenance.is_verified(path)
    os.utime(path)  # touched: hashed and checked again, then trusted
    assert provenance.is_verified(path)
    assert "checking it again" in capsys.readouterr().err
    with path.open("r+b") as f:  # same size, other bytes
        f.seek(10)
        f.write(b"#")
    os.utime(path, ns=(1, 1))
    assert not provenance.is_verified(path)
    record = json.loads(provenance.record_path(path).read_text())
    assert record["file"] == path.name and record["version"] == 2
