"""The one streaming loop: same ids as the generators, text without broken
characters, unknown ids shown and passed over, stop/Ctrl-C, a monotonic clock
read after the device finished, and statistics that never raise."""

from __future__ import annotations

import time

import pytest
import torch

from tests._view_fixtures import (
    unknown_id_model,
)
from utils import device, streaming
from utils.generation import generate_text_basic_stream_cache
from utils.qwen3_tokenizer import TOKENIZER_VOCAB_SIZE
from utils.streaming import (
    GreedyStreamer,
    Utf8StreamDecoder,
    decode_bytes,
    stream_generation,
)

PROMPT = "Explain large language models."


class Scripted:
    """A streamer that yields fixed ids (and may raise after some)."""

    def __init__(self, ids, raise_after=None):
        self.ids, self.raise_after = list(ids), raise_after

    def stream(self, ids, n, eos, **kwargs):
        for i, token_id in enumerate(self.ids[:n]):
            if i == self.raise_after:
                raise KeyboardInterrupt
            yield token_id


def test_ids_text_and_writes_match_the_generator(tok, model):
    pieces: list[str] = []
    seen: list[int] = []
    result = stream_generation(
        GreedyStreamer(model),
        tok,
        tok.encode(PROMPT),
        9,
        write=pieces.append,
        on_token=seen.append,
    )
    ids = torch.tensor([tok.encode(PROMPT)])
    expected = [int(t) for t in generate_text_basic_stream_cache(model, ids, 9)]
    assert result.token_ids == seen == expected
    assert "".join(pieces) == result.text == decode_bytes(tok, expected)
    assert all(pieces)  # empty pieces are not written
    assert result.elapsed_s > 0 and result.tokens_per_sec > 0
    assert not result.interrupted and not result.stopped and result.stats is None


def test_time_starts_after_the_stream_is_set_up(tok):
    class SlowSetUp(Scripted):
        def stream(self, ids, n, eos, **kwargs):
            time.sleep(0.5)  # like building the fast path the first time
            return super().stream(ids, n, eos, **kwargs)

    result = stream_generation(SlowSetUp([11, 12, 13]), tok, [1, 2], 3)
    assert result.token_ids == [11, 12, 13]
    assert 0 < result.elapsed_s < 0.25


def test_invalid_input_raises_before_generating(tok, model):
    with pytest.raises(ValueError, match="empty"):
        stream_generation(GreedyStreamer(model), tok, [], 5)
    with pytest.raises(ValueError, match="context length"):
        stream_generation(GreedyStreamer(model), tok, [1, 2], 10_000)
    with pytest.raises(ValueError, match="stats"):
        stream_generation(GreedyStreamer(model), tok, [1, 2], 1, stats="loud")


def test_unknown_ids_are_shown_and_generation_goes_on(tok):
    result = stream_generation(
        GreedyStreamer(unknown_id_model()), tok, tok.encode(PROMPT), 6
    )
    assert len(result.token_ids) == 6
    assert all(i >= TOKENIZER_VOCAB_SIZE for i in result.token_ids)
    assert result.text == "".join(f"<unk:{i}>" for i in result.token_ids)


def test_unknown_id_ends_a_held_back_character(tok):
    # A token that holds only part of a character, then an unknown id
    ids = tok.encode("👩‍👩‍👧")
    cut = next(i for i in ids if "\ufffd" in tok.decode([i]))
    known = tok.encode("ok")
    stream = [*known, cut, 151_700, *known]
    dec = Utf8StreamDecoder(tok)
    text = "".join(dec.feed(i) for i in stream) + dec.flush()
    assert text.startswith("ok\\x") and "<unk:151700>ok" in text
    assert "\ufffd" not in text
    assert decode_bytes(tok, stream) == text


def test_should_stop_and_ctrl_c_keep_the_text(tok):
    ids = tok.encode(" one two three four five")
    count = 0

    def stop_after_two():
        nonlocal count
        count += 1
        return count >= 2

    result = stream_generation(Scripted(ids), tok, [1], 5, should_stop=stop_after_two)
    assert result.stopped and result.token_ids == ids[:2]
    result = stream_generation(Scripted(ids, raise_after=3), tok, [1], 5)
    assert result.interrupted and result.token_ids == ids[:3]
    assert result.text == decode_bytes(tok, ids[:3])


def test_clock_is_read_after_the_device_synchronised(tok, monkeypatch):
    events: list[str] = []
    clock = iter([100.0, 100.0, 100.0])  # start, first token, end

    def fake_clock():
        events.append("clock")
        return next(clock)

    monkeypatch.setattr(streaming.time, "perf_counter", fake_clock)
    monkeypatch.setattr(device, "synchronize", lambda d: events.append(f"sync {d}"))
    ids = tok.encode(" a b c")
    result = stream_generation(Scripted(ids), tok, [1], 3, device=torch.device("cpu"))
    assert events == ["clock", "clock", "sync cpu", "clock"]
    # No elapsed time: the speed is 0, nothing raises
    assert result.elapsed_s == 0.0 and result.tokens_per_sec == 0.0


@pytest.mark.parametrize("scripted", [[5, 6, 7], []], ids=["tokens", "none"])
def test_the_time_to_the_first_token_is_measured(tok, monkeypatch, scripted):
    """Read when the first id arrives (the prefill's end); without any
    token, the whole run's time."""
    clock = iter([100.0, 100.4, 101.0] if scripted else [100.0, 100.3])
    monkeypatch.setattr(streaming.time, "perf_counter", lambda: next(clock))
    result = stream_generation(Scripted(scripted), tok, [1], 3)
    assert result.token_ids == scripted
    if scripted:
        assert result.first_token_s == pytest.approx(0.4)
        assert result.elapsed_s == pytest.approx(1.0)
    else:
        assert result.first_token_s == result.elapsed_s == pytest.approx(0.3)


def test_stats_print_the_books_lines_even_without_elapsed_time(
    tok, monkeypatch, capsys
):
    ids = tok.encode(" a b")
    result = stream_generation(
        Scripted(ids), tok, [1], 5, write=lambda s: print(s, end=""), stats="print"
    )
    out = capsys.readouterr().out
    assert out.startswith(decode_bytes(tok, ids) + "\n\nTime: ")
    assert result.stats["num_tokens"] == len(ids)
    monkeypatch.setattr(streaming.time, "perf_counter", lambda: 5.0)
    stream_generation(Scripted(ids), tok, [1], 5, stats="print")
    assert "n/a tokens/sec" in capsys.readouterr().out
    stream_generation(Scripted([]), tok, [1], 5, stats="print")
    assert "No tokens generated" in capsys.readouterr().out
    quiet = stream_generation(Scripted(ids), tok, [1], 5, stats="quiet")
    assert capsys.readouterr().out == "" and quiet.stats["num_tokens"] == len(ids)


def test_cli_and_panel_all_use_the_one_loop(tok, model, monkeypatch, capsys):
    """qwen3-generate, the chat, the widget panel and its plain fallback."""
    import argparse

    from utils import widgets
    from utils.cli import commands as cli

    calls: list[str] = []
    real = streaming.stream_generation

    def counting(*args, **kwargs):
        calls.append(kwargs.get("stats"))
        return real(*args, **kwargs)

    monkeypatch.setattr(streaming, "stream_generation", counting)

    def fake_load(args: argparse.Namespace, kind: str, **kw):
        return cli.Loaded(tok, model, torch.device("cpu"), GreedyStreamer(model), True)

    monkeypatch.setattr(cli, "load", fake_load)
    assert cli.generate_main(["--prompt", PROMPT, "--max-new-tokens", "2"]) == 0
    session = cli.ChatSession(tok, GreedyStreamer(model), torch.device("cpu"), 256, 2)
    session.reply("Hi", lambda s: None)
    widgets.generation_panel(model, tok, PROMPT, max_new_tokens=2, plain=True)
    panel = widgets.generation_panel(model, tok, PROMPT, max_new_tokens=2, plain=False)
    panel.start()
    assert panel.wait(timeout=60) and panel.error is None
    capsys.readouterr()
    # the CLI prints the statistics itself, on stderr
    assert calls == ["quiet", None, "print", "quiet"]


@pytest.mark.slow
def test_fast_compile_without_the_native_step_compiles_the_block_once(
    tok, model, monkeypatch, capsys
):
    """fast + compile where the native step cannot run: the block is
    compiled once for every generation, said in one line, and the tokens
    stay the eager fast path's."""
    from utils.fast import FastQwen3

    ids = tok.encode(PROMPT)
    monkeypatch.setattr(FastQwen3, "native_unsupported_reason", lambda s: "test")
    eager = [
        int(t) for t in GreedyStreamer(model).stream(torch.tensor([ids]), 8, fast=True)
    ]
    compiles = []
    real = FastQwen3.compile_decode

    def spy(self, **kwargs):
        compiles.append(kwargs)
        return real(self, **kwargs)

    monkeypatch.setattr(FastQwen3, "compile_decode", spy)
    capsys.readouterr()
    streamer = GreedyStreamer(model)
    for _ in range(2):
        got = streamer.stream(torch.tensor([ids]), 8, compile=True, fast=True)
        assert [int(t) for t in got] == eager
    assert compiles == [{"scope": "block"}]
    fast = streamer.built_for("fast_fastest")  # the registry's path for the switches
    assert fast.compile_scope == "block" and fast.decode_compiled()
    err = capsys.readouterr().err
    assert err.count("the compiled block (native step off: test)") == 1


def test_compile_of_the_book_model_uses_the_books_setting(model, monkeypatch):
    """`qwen3-generate --compile` and the panel's torch.compile checkbox
    compile the book's model with `allow_unspec_int_on_nn_module` set (or
    the KV-cache model recompiles at every token)."""
    from utils.compile import BOOK_SETTING_MIN_TORCH, torch_version

    seen = []

    def spy(module, **kwargs):
        seen.append(torch._dynamo.config.allow_unspec_int_on_nn_module)
        return module  # run eagerly: only the setting matters here

    monkeypatch.setattr(torch, "compile", spy)
    with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=False):
        streamer = GreedyStreamer(model)
        got = list(streamer.stream(torch.tensor([[1, 2, 3]]), 3, compile=True))
    assert seen == [torch_version() >= BOOK_SETTING_MIN_TORCH]
    assert len(got) == 3
