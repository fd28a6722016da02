"""Stand-in weights: right shapes, deterministic, cached, and clearly marked."""

import json

import pytest
import torch
from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B, Qwen3Model

from tests.tiny import tiny_config
from utils.download import provenance, standin

TINY = tiny_config(
    vocab_size=300,
    context_length=64,
    emb_dim=32,
    hidden_dim=64,
    head_dim=8,
    rope_base=10_000.0,
    dtype=torch.bfloat16,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(standin.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_enabled_switch(monkeypatch):
    for value, expected in [("1", True), ("true", True), ("0", False), ("", False)]:
        monkeypatch.setenv(standin.STANDIN_ENV, value)
        assert standin.standin_enabled() is expected
    monkeypatch.delenv(standin.STANDIN_ENV)
    assert standin.standin_enabled() is False


def test_deterministic_and_kinds_differ():
    a = standin.standin_state_dict(TINY, seed=standin.SEEDS["base"])
    b = standin.standin_state_dict(TINY, seed=standin.SEEDS["base"])
    c = standin.standin_state_dict(TINY, seed=standin.SEEDS["reasoning"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["tok_emb.weight"], c["tok_emb.weight"])


def test_weights_load_into_book_model_and_are_marked(tmp_path, cache):
    path = standin.write_standin_weights(tmp_path / "w.pth", "base", cfg=TINY)
    model = Qwen3Model(TINY)
    result = model.load_state_dict(torch.load(path, weights_only=True))
    assert not result.missing_keys and not result.unexpected_keys
    assert provenance.is_standin(path)
    assert provenance.checkpoint_is_marked(path)
    record = json.loads(provenance.sidecar_path(path).read_text())
    assert record["standin"] is True and "NOT the real" in record["what"]
    # An ordinary checkpoint carries no mark
    plain = tmp_path / "plain.pth"
    torch.save(model.state_dict(), plain)
    assert not provenance.checkpoint_is_marked(plain)
    assert not provenance.is_standin(plain)


def test_bad_kind(tmp_path, cache):
    with pytest.raises(ValueError, match="base"):
        standin.write_standin_weights(tmp_path / "w.pth", "chat", cfg=TINY)


@pytest.mark.slow
def test_06b_build_is_cached(tmp_path, cache, monkeypatch):
    """The 0.6B build happens once; later calls only link the cached file."""
    calls = []
    real = standin.standin_state_dict

    def counting(cfg, seed):
        calls.append(seed)
        return real(cfg, seed)

    monkeypatch.setattr(standin, "standin_state_dict", counting)
    first = standin.write_standin_weights(tmp_path / "a" / "qwen3-0.6B-base.pth")
    second = standin.write_standin_weights(tmp_path / "b" / "qwen3-0.6B-base.pth")
    assert calls == [standin.SEEDS["base"]]
    assert first.stat().st_size == second.stat().st_size > 1_000_000_000
    assert provenance.is_standin(second) and provenance.checkpoint_is_marked(second)
    assert not list(second.parent.glob(".*tmp*")), "no temp files left behind"
    # Keys, shapes and dtype of the real 0.6B model
    with torch.device("meta"):
        ref = Qwen3Model(QWEN_CONFIG_06_B).state_dict()
    got = torch.load(second, weights_only=True, mmap=True)
    assert got.keys() == ref.keys()
    for key, tensor in ref.items():
        assert got[key].shape == tensor.shape, key
        assert got[key].dtype == tensor.dtype, key


def test_failed_save_leaves_nothing(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    target = tmp_path / "x.pth"
    with pytest.raises(OSError):
        standin.save_marked_state_dict({"a": torch.zeros(2)}, target, "note")
    assert list(tmp_path.iterdir()) == []


def test_a_stand_in_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    """Its files would be loaded as ours: one line naming the folder and the
    setting, before anything is written or read there."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(standin.DIR_ENV, str(shared / "files"))
    with pytest.raises(standin.StandinFolderError) as err:
        standin.provide_standins(tmp_path / "out", "base", ["tokenizer-base.json"])
    assert str(err.value).startswith(
        f"cannot use the stand-in files in {shared / 'files'}/: {shared} can be "
        "written by other users (mode 777)"
    )
    assert standin.DIR_ENV in str(err.value)
    assert list((shared / "files").iterdir()) == []


def test_a_read_only_home_names_the_stand_in_folder(tmp_path, tmpfs, monkeypatch):
    home = tmpfs("64k", "ro", name="home")
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CACHE_HOME", standin.DIR_ENV, standin.CACHE_ENV):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(standin.StandinFolderError) as err:
        standin.provide_standins(tmp_path / "out", "base", ["tokenizer-base.json"])
    assert str(err.value) == (
        f"cannot write the stand-in files in {standin.standin_files_dir()}/ "
        f"(Read-only file system): set {standin.DIR_ENV} to a folder you can "
        "write to"
    )
    assert str(standin.standin_files_dir()).startswith(str(home))


def test_the_banner_comes_with_weights_not_with_a_tokenizer(
    tmp_path, cache, monkeypatch
):
    """The "gibberish" banner warns about random weights; a cell that loads
    only the (real, rebuilt) tokenizer shows no banner."""
    from utils.download.fetch import download_qwen3_small

    shown = []
    monkeypatch.setattr(standin, "print_standin_banner", lambda: shown.append(1))
    monkeypatch.setenv(standin.STANDIN_ENV, "1")
    monkeypatch.setenv(standin.DIR_ENV, str(tmp_path / "files"))
    original = standin.write_standin_weights  # a tiny checkpoint will do
    monkeypatch.setattr(
        standin, "write_standin_weights", lambda p, kind: original(p, kind, cfg=TINY)
    )
    files = download_qwen3_small("base", tokenizer_only=True, out_dir=tmp_path / "q")
    assert files.standin and files.model is None
    assert shown == []
    standin.provide_standins(tmp_path / "q", "base", ["qwen3-0.6B-base.pth"])
    assert shown == [1]
