"""The book's generators in utils.generation: validation, EOS, equality with
the book's package, and cached == uncached."""

import math
import sys
import time

import pytest
import torch
from reasoning_from_scratch import ch02 as book
from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B, Qwen3Model

from tests.tiny import book_model, tiny_config
from utils import device
from utils.download.standin import standin_state_dict
from utils.generation import (
    generate_stats,
    generate_text_basic_stream,
    generate_text_basic_stream_cache,
)

TINY = tiny_config(vocab_size=512, context_length=128)
GENERATORS = [generate_text_basic_stream, generate_text_basic_stream_cache]


def run(gen, model, ids, n, eos=None) -> list[int]:
    return [t.item() for t in gen(model, ids, n, eos_token_id=eos)]


@pytest.fixture(scope="module")
def tiny_model() -> Qwen3Model:
    model = Qwen3Model(TINY)
    model.load_state_dict(standin_state_dict(TINY, seed=3))
    return model.eval()


@pytest.fixture
def prompt() -> torch.Tensor:
    return torch.tensor([[5, 17, 301, 42, 7, 99]])


@pytest.mark.parametrize("gen", GENERATORS)
def test_yields_exactly_max_new_tokens(gen, tiny_model, prompt):
    tokens = list(gen(tiny_model, prompt, 25))
    assert len(tokens) == 25
    assert all(t.shape == (1, 1) for t in tokens)
    assert run(gen, tiny_model, prompt, 0) == []


def test_cached_equals_uncached_tiny(tiny_model, prompt):
    plain = run(generate_text_basic_stream, tiny_model, prompt, 60)
    cached = run(generate_text_basic_stream_cache, tiny_model, prompt, 60)
    assert plain == cached
    assert len(set(plain)) > 5, "stand-in should not collapse to one token"


@pytest.mark.parametrize("gen", GENERATORS)
def test_stops_at_eos_and_never_yields_it(gen, tiny_model, prompt):
    full = run(gen, tiny_model, prompt, 30)
    # Use the 8th generated token as "EOS": generation must stop right before
    # its first occurrence.
    eos = full[7]
    stop = full.index(eos)
    out = run(gen, tiny_model, prompt, 30, eos=eos)
    assert out == full[:stop]
    assert eos not in out


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (generate_text_basic_stream, book.generate_text_basic_stream),
        (generate_text_basic_stream_cache, book.generate_text_basic_stream_cache),
    ],
)
def test_equal_to_book_package(ours, theirs, tiny_model, prompt):
    for eos in (None, run(ours, tiny_model, prompt, 12)[9]):
        mine = run(ours, tiny_model, prompt, 20, eos)
        ref = [t.item() for t in theirs(tiny_model, prompt, 20, eos_token_id=eos)]
        assert mine == ref


@pytest.mark.parametrize("gen", GENERATORS)
def test_input_validation(gen, tiny_model, prompt):
    with pytest.raises(ValueError, match="empty"):
        gen(tiny_model, torch.empty(1, 0, dtype=torch.long), 5)
    with pytest.raises(ValueError, match=">= 0"):
        gen(tiny_model, prompt, -1)
    with pytest.raises(ValueError, match="unsqueeze"):
        gen(tiny_model, prompt[0], 5)
    with pytest.raises(ValueError, match="context length"):
        gen(tiny_model, prompt, TINY["context_length"])
    # The limit itself is fine
    gen(tiny_model, prompt, TINY["context_length"] - prompt.shape[1])


def test_generate_stats_reports_speed_and_memory(capsys):
    out = torch.zeros(1, 50, dtype=torch.long)
    start = time.perf_counter()
    stats = generate_stats(out, None, start, start + 2.0)
    assert stats["num_tokens"] == 50
    assert stats["tokens_per_sec"] == pytest.approx(25.0)
    assert stats["peak_mem_bytes"] > 10 * 1024**2  # a Python process with torch
    printed = capsys.readouterr().out
    assert "25 tokens/sec" in printed
    assert "Time: 2.00 sec" in printed
    assert "GB" in printed


@pytest.mark.slow  # a notebook kernel
def test_a_cell_that_ends_with_generate_stats_shows_its_lines_once():
    """The book's Listing 2.3 cell ends with the call: Jupyter showed the
    returned dict under the printed lines (notebook 05). Now only the lines;
    the next cell still reads the dict."""
    import nbformat
    from nbclient import NotebookClient

    from tests.sigint_guard import execute_notebook

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import torch\nfrom utils.generation import generate_stats\n"
            "generate_stats(torch.zeros(1, 8), None, 0.0, 2.0)"
        ),
        nbformat.v4.new_code_cell("_['tokens_per_sec'], len(_)"),
    ]
    execute_notebook(NotebookClient(nb, timeout=120, kernel_name="python3"))
    first, second = (cell.outputs for cell in nb.cells)
    assert [o.output_type for o in first] == ["stream"]
    assert "Time: 2.00 sec\n4 tokens/sec" in first[0].text
    assert second[0].data["text/plain"] == "(4.0, 6)"


@pytest.mark.parametrize("elapsed", [0.0, -0.5])
def test_generate_stats_without_elapsed_time_prints_instead_of_raising(elapsed, capsys):
    # A run too short for the clock (or a wall clock that stepped back)
    out = torch.zeros(1, 3, dtype=torch.long)
    stats = generate_stats(out, None, 10.0, 10.0 + elapsed)
    assert stats["time_s"] == 0.0 and stats["num_tokens"] == 3
    assert math.isnan(stats["tokens_per_sec"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "Time: 0.00 sec"
    assert lines[1] == "n/a tokens/sec (too short to time)"
    assert lines[2].startswith("Peak process memory (RSS): ")


def test_process_memory_peak_on_windows_and_without_resource(monkeypatch):
    import psutil

    real = psutil.Process().memory_info()

    class Info:  # what psutil reports on Windows: the peak working set
        rss = real.rss
        peak_wset = real.rss * 2

    class FakeProcess:
        def memory_info(self):
            return Info()

    monkeypatch.setattr(psutil, "Process", FakeProcess)
    assert device.process_memory_bytes() == (real.rss, real.rss * 2)
    # Neither peak_wset nor `resource`: the current figure stands in
    del Info.peak_wset
    monkeypatch.setitem(sys.modules, "resource", None)
    assert device.process_memory_bytes() == (real.rss, real.rss)


@pytest.fixture(scope="module")
def standin_06b() -> Qwen3Model:
    sd = standin_state_dict(QWEN_CONFIG_06_B, seed=20250601)
    return book_model(sd, QWEN_CONFIG_06_B)  # no random init to overwrite


@pytest.mark.slow
def test_cached_equals_uncached_and_book_on_06b_standin(standin_06b):
    """Real shape, bf16: both generators and the book's agree token for token."""
    ids = torch.tensor([[840, 20772, 3460, 4128, 4119, 13]])
    n = 6
    cached = run(generate_text_basic_stream_cache, standin_06b, ids, n)
    plain = run(generate_text_basic_stream, standin_06b, ids, n)
    ref = [t.item() for t in book.generate_text_basic_stream_cache(standin_06b, ids, n)]
    assert cached == plain == ref
    assert len(set(cached)) > 3


def test_stats_lines_keep_the_books_whole_numbers_unless_asked():
    from utils.generation import stats_lines

    stats = {"time_s": 2.0, "tokens_per_sec": 1.87, "peak_mem_bytes": 2**30,
             "memory_kind": "Peak process memory (RSS)"}  # fmt: skip
    assert stats_lines(stats)[1] == "1 tokens/sec"  # the book's int()
    assert stats_lines(stats, decimal_below=10)[1] == "1.9 tokens/sec"
    assert stats_lines({**stats, "tokens_per_sec": 12.6}, decimal_below=10)[1] == (
        "12 tokens/sec"
    )


def test_the_books_batched_model_shares_the_weights_and_pads_on_the_left():
    from reasoning_from_scratch.ch02 import generate_text_basic_cache
    from reasoning_from_scratch.qwen3_batched import (
        generate_text_basic_batched_cache_stop,
    )

    from tests.tiny import tiny_config, tiny_state_dict
    from utils.models import batched_book_model, left_padded, load_book_model

    cfg = tiny_config(context_length=512)
    book = load_book_model(tiny_state_dict(0, cfg), cfg=cfg)
    batched = batched_book_model(book)
    assert batched.tok_emb.weight is book.tok_emb.weight
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
    ids, mask = left_padded(prompts, pad_id=0)
    assert ids.tolist()[1] == [0, 0, 0, 0, 9, 8, 7] and mask.sum().item() == 10
    got = generate_text_basic_batched_cache_stop(batched, ids, 8, attn_mask=mask)
    # float32: each row the tokens the row gets alone
    for row, prompt in zip(got.tolist(), prompts, strict=True):
        alone = generate_text_basic_cache(book, torch.tensor([prompt]), 8)
        assert row == alone[0].tolist()
