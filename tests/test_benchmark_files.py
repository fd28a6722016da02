"""The benchmark's own files: `--model-path` with `--tokenizer-path`, so a
reader offline can pass both and nothing is downloaded."""

from __future__ import annotations

import pytest
import torch

import utils.download as download  # the door the benchmark calls through
from utils.benchmark import runner as benchmark


def offline(*args, **kwargs):
    raise AssertionError("nothing may be downloaded")


def test_model_and_tokenizer_paths_need_no_download(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "download_qwen3_small", offline)
    model = tmp_path / "weights" / "qwen3-0.6B-base.pth"
    model.parent.mkdir()
    torch.save({"w": torch.zeros(2)}, model)  # no tokenizer beside it
    tok = tmp_path / "elsewhere" / "tokenizer-base.json"
    tok.parent.mkdir()
    tok.write_text("{}")
    state_dict, tokenizer, standin = benchmark._weights(model, None, tok)
    assert tokenizer == tok and not standin and list(state_dict) == ["w"]


def test_a_missing_tokenizer_path_is_one_line_naming_both_options(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(download, "download_qwen3_small", offline)
    model = tmp_path / "qwen3-0.6B-base.pth"
    torch.save({"w": torch.zeros(2)}, model)
    with pytest.raises(ValueError) as err:
        benchmark._weights(model, None, tmp_path / "nope.json")
    text = str(err.value)
    assert text.startswith(f"file not found: {tmp_path / 'nope.json'}; ")
    assert "--model-path" in text and "--tokenizer-path" in text


def test_the_command_passes_the_tokenizer_path(monkeypatch, capsys):
    seen = {}

    def record(**kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(benchmark, "run_benchmark", record)
    argv = [
        "--model-path",
        "m.pth",
        "--tokenizer-path",
        "t.json",
        "--modes",
        "kv_cache",
    ]
    assert benchmark.main(argv) == 2
    assert seen["tokenizer_path"] == "t.json" and seen["model_path"] == "m.pth"
    assert "stop here" in capsys.readouterr().err
