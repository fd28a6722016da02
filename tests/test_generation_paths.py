"""One registry of ways to generate (`utils.streaming.generation_paths`: the
book's `BOOK_PATHS`, then `utils.fast.PATHS`): the benchmark's modes, the
commands' switches and the panel's streamer all read it, so an entry added
or changed there reaches all three; none keeps a list of its own."""

from __future__ import annotations

import pytest
import torch

from utils import generation, streaming, widgets
from utils.benchmark import runner as benchmark
from utils.cli import commands as cli
from utils.generation import BookPath
from utils.streaming import GreedyStreamer, choose_path, get_generation_path

PROMPT = "Explain large language models."
CALLS: list[str] = []


class Recording(BookPath):
    """A book path that notes each stream it makes."""

    def stream(self, model, token_ids, max_new_tokens, eos_token_id=None):
        CALLS.append(self.name)
        return super().stream(model, token_ids, max_new_tokens, eos_token_id)


def _with_entries(monkeypatch, *extra: BookPath) -> None:
    """The book's paths with `kv_cache` recording its streams, plus `extra`."""
    paths = [Recording(p.name, p.summary, p.needs) for p in generation.BOOK_PATHS]
    monkeypatch.setattr(generation, "BOOK_PATHS", (*paths, *extra))
    CALLS.clear()


def _tiny_run(model, modes: list[str]) -> list[dict]:
    return benchmark.run_benchmark(
        modes=modes, dtype="float32", max_new_tokens=3, repeats=1,
        cfg=model.cfg, state_dict=model.state_dict(),
        token_ids=torch.tensor([[3, 1, 4, 1, 5]]), quiet=True,
        bandwidth_bytes=1 << 22,
    )  # fmt: skip


def test_an_added_entry_is_a_benchmark_mode_and_a_streamer_path(monkeypatch, model):
    again = Recording("kv_cache_again", "book KVCache, once more", frozenset({"cache"}))
    _with_entries(monkeypatch, again)
    names = benchmark.mode_names()
    # a book row: after the book's four, before the book package's optimized
    assert names.index("kv_cache_again") == names.index("optimized") - 1
    assert benchmark.get_mode("kv_cache_again").note == "book KVCache, once more"
    assert "kv_cache_again" in benchmark.default_modes(torch.device("cpu"))
    assert benchmark._check_modes(["kv_cache_again"]) == ["kv_cache_again"]
    (row,) = _tiny_run(model, ["kv_cache_again"])
    assert row["mode"] == "kv_cache_again" and row["note"] == again.summary
    assert CALLS and set(CALLS) == {"kv_cache_again"}
    # the streamer runs it by name, with the same tokens as the KV cache
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    want = list(GreedyStreamer(model).stream(ids, 5))
    assert list(GreedyStreamer(model).stream(ids, 5, path="kv_cache_again")) == want
    with pytest.raises(ValueError, match="choose from regular, .*kv_cache_again"):
        get_generation_path("kv_cache_twice")


def test_the_commands_and_the_panel_stream_from_the_registrys_entry(
    monkeypatch, tok, model, capsys
):
    """Swap the registry's kv_cache entry: the command line (no switches),
    the panel and the benchmark all stream from the new one."""
    _with_entries(monkeypatch)
    monkeypatch.setattr(
        cli, "load",
        lambda args, kind, **kw: cli.Loaded(
            tok, model, torch.device("cpu"), GreedyStreamer(model), True
        ),
    )  # fmt: skip
    assert cli.generate_main(["--prompt", PROMPT, "--max-new-tokens", "2"]) == 0
    assert CALLS == ["kv_cache"]
    widgets.generation_panel(model, tok, PROMPT, max_new_tokens=2, plain=True)
    widgets.generation_panel(model, tok, PROMPT, 2, plain=True, cache=False)
    assert CALLS == ["kv_cache", "kv_cache", "regular"]
    _tiny_run(model, ["kv_cache"])
    assert CALLS[3:] and set(CALLS[3:]) == {"kv_cache"}
    capsys.readouterr()


def test_switches_name_registry_entries():
    cpu = torch.device("cpu")
    assert choose_path(cpu).name == "kv_cache"
    assert choose_path(cpu, cache=False, compile=True).name == "regular_compiled"
    assert choose_path(cpu, compile=True).name == "kv_cache_compiled"
    assert choose_path(cpu, fast=True, compile=True).name == "fast_fastest"
    with pytest.raises(ValueError, match="int8 weights run on a CPU only"):
        choose_path(torch.device("cuda"), fast=True, int8=True)
    # what the registry says is what the benchmark's modes say
    for path in streaming.generation_paths():
        mode = benchmark.get_mode(path.name)
        assert mode.family == path.family and mode.note == path.summary
        assert (
            mode.cpu_only
            == ("cpu" in path.needs)
            == (path.unavailable("cuda") is not None)
        )
        assert mode.compiled == ("compile" in path.needs)
        assert mode.cache == ("cache" in path.needs) != mode.slow_on_cpu
