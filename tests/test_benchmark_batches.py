"""utils.benchmark.batches: decode speed and memory per mode and batch size."""

from __future__ import annotations

import pytest
import torch

import utils.benchmark.batches as batches
import utils.fast.build as build
from tests.tiny import tiny_config, tiny_state_dict
from utils.models import load_book_model

CFG = tiny_config(context_length=512, dtype=torch.bfloat16)


def test_sizes_are_parsed_and_bad_ones_named():
    assert batches.parse_sizes("8, 1,4,4") == [1, 4, 8]
    for bad in ("", "0", "a", "1,300"):
        with pytest.raises(ValueError, match="--batch-size takes sizes"):
            batches.parse_sizes(bad)


def test_every_mode_and_size_gets_a_row_of_the_table():
    modes = ["kv_cache", "book_batched"]
    if build.unsupported_reason() is None:
        modes += ["fast_native", "fast_native_int8"]
    book = load_book_model(tiny_state_dict(0, CFG), cfg=CFG)
    said = []
    rows = batches.batch_rows(book, modes, [1, 3], torch.tensor([[1, 2, 3, 4]]), 4,
                              say=said.append)  # fmt: skip
    assert [(r["mode"], r["batch_size"]) for r in rows] == [
        (m, s) for m in modes for s in (1, 3)
    ]
    for r in rows:
        assert r["total_tokens_per_sec"] == pytest.approx(
            r["tokens_per_sec_per_sequence"] * r["batch_size"]
        )
        assert r["peak_mem_bytes"] > 0
    assert [r["vs_batch_1"] for r in rows[::2]] == [1.0] * len(modes)
    assert len(said) == len(rows) and "batch of 3" in said[1]
    table = batches.format_batch_table(rows)
    assert max(map(len, table.splitlines())) <= 80
    assert book.tok_emb.weight.dtype == torch.bfloat16  # the book model as it was
    with pytest.raises(ValueError, match="no batch mode"):
        batches.batch_rows(book, ["nope"], [1], torch.tensor([[1, 2]]), 3)


def test_a_batch_decodes_every_row_after_its_first_token():
    def stream(model, ids, n):
        for _ in range(n):
            yield torch.zeros(ids.shape[0], 1)

    seconds, tokens = batches.time_batch(None, stream, torch.zeros(4, 2), 5)
    assert tokens == 4 * 4 and seconds >= 0
    with pytest.raises(ValueError, match="two new tokens"):
        batches.time_batch(None, stream, torch.zeros(4, 2), 1)


def test_the_command_measures_batches_and_refuses_what_does_not_apply(
    capsys, tmp_path, monkeypatch
):
    from utils.benchmark import main, runner

    seen = {}

    def fake_rows(book, modes, sizes, ids, n, say, standin):
        seen.update(modes=modes, sizes=sizes, n=n)
        return [{"mode": m, "batch_size": s, "total_tokens_per_sec": 2.0 * s,
                 "tokens_per_sec_per_sequence": 2.0, "peak_mem_bytes": 2**30,
                 "vs_batch_1": float(s), "standin": True}
                for m in modes for s in sizes]  # fmt: skip

    monkeypatch.setattr(runner, "batch_rows", fake_rows)
    monkeypatch.setattr(runner, "_weights", lambda *a: (
        tiny_state_dict(0, CFG), None, True))  # fmt: skip
    monkeypatch.setattr(runner, "prompt_token_ids",
                        lambda *a: torch.tensor([[1, 2, 3]]))  # fmt: skip
    import utils.models as models

    real = models.load_book_model

    def tiny_load(sd, dev, dtype, cfg):
        return real(sd, dev, dtype, CFG)

    monkeypatch.setattr(models, "load_book_model", tiny_load)
    out = tmp_path / "b.json"
    argv = ["--batch-size", "4,1", "--modes", "kv_cache,book_batched",
            "--max-new-tokens", "3", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert seen == {"modes": ["kv_cache", "book_batched"], "sizes": [1, 4], "n": 3}
    table = capsys.readouterr().out
    assert (
        "total tok/s" in table and "book_batched" in table and "--verbose" not in table
    )
    rows = __import__("json").loads(out.read_text())
    assert {"mode", "batch_size", "total_tokens_per_sec",
            "tokens_per_sec_per_sequence"} <= set(rows[0])  # fmt: skip
    bad_args = [(["--batch-size", "0"], "--batch-size takes"),
                (["--batch-size", "2", "--modes", "fast"], "--modes takes"),
                (["--batch-size", "2", "--plot", "x.png"], "--plot")]  # fmt: skip
    for bad, words in bad_args:
        assert main(bad) == 2 and words in capsys.readouterr().err
