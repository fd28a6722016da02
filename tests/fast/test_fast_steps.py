"""utils.fast.steps: every decode step computes what the book's model
computes and `generate` stops like the book's generator.

Reference: `reasoning_from_scratch.ch02.generate_text_basic_stream_cache` and
the book's `Qwen3Model` on the same weights. Tiny configs for most checks; the
real 0.6B shape only where that shape is the point (float32 and bf16).
"""

from __future__ import annotations

import platform

import pytest
import torch
from reasoning_from_scratch.ch02 import generate_text_basic_stream_cache as book_gen
from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B, KVCache
from torch.overrides import TorchFunctionMode

import utils.fast.steps as steps_mod
from tests.tiny import (
    PROMPT,
    book_model,
    fast_model,
    skip_if_inductor_cannot_build,
    tiny_config,
    tiny_state_dict,
    tokens,
)
from utils.download.standin import standin_state_dict, write_standin_weights
from utils.fast import (
    CompiledStep,
    FastQwen3,
    decode_one_token,
    generate,
    get_kernels,
    get_path,
    prefill,
    prefill_at,
)
from utils.fast.kernels import ATEN_AVX2, bf16_gemv_path
from utils.fast.model import greedy_step

TINY = tiny_config(context_length=512)
X86_64 = platform.machine().lower() in ("x86_64", "amd64")
# (rows, cols) of the 0.6B model's single-row products
SHAPES_06B = [(2048, 1024), (1024, 1024), (1024, 2048), (3072, 1024),
              (1024, 3072), (151936, 1024)]  # fmt: skip


def compare_logits(book, fast, prompt, steps):
    """Teacher-forced along the book's greedy tokens: max |logit difference|
    over prefill + `steps` decode steps, and the book's tokens."""
    cache = KVCache(n_layers=book.cfg["n_layers"])
    book.reset_kv_cache()
    fast.setup_cache(prompt.shape[0], prompt.shape[1] + steps + 1)
    with torch.inference_mode():
        ref = book(prompt, cache=cache)[:, -1]
        _, got = prefill(fast, prompt)
        worst = (ref - got).abs().max().item()
        pos = torch.tensor([prompt.shape[1]])
        seq = []
        for _ in range(steps):
            tok = ref.argmax(dim=-1, keepdim=True)
            seq.append(int(tok[0, 0]))
            ref = book(tok, cache=cache)[:, -1]
            _, got = decode_one_token(fast, tok, pos, int(pos) + 1)
            worst = max(worst, (ref - got).abs().max().item())
            pos = pos + 1
    return worst, seq


# ---------------------------------------------------------------------------
# Equality with the book
# ---------------------------------------------------------------------------


class MatmulShapes(TorchFunctionMode):
    """Records the operand shapes of every `@` / `torch.matmul` call."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[tuple[int, ...], ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in ("matmul", "__matmul__"):
            self.shapes.append(tuple(tuple(a.shape) for a in args[:2]))
        return func(*args, **(kwargs or {}))


def test_eager_attention_multiplies_the_books_shapes(fast_tiny):
    """Eager attention runs the book's matmuls, shape for shape (one per
    query head, keys and values repeated per head), prefill and decode:
    oneDNN picks its kernel, and so its order of additions, by the shapes
    (with AMX, stacking the heads on the token axis changed bf16 bits)."""
    book, fast = fast_tiny
    assert TINY["n_heads"] > TINY["n_kv_groups"]  # grouped-query attention
    fast.setup_cache(1, PROMPT.shape[1] + 2)
    with torch.inference_mode():
        with MatmulShapes() as want:
            cache = KVCache(n_layers=book.cfg["n_layers"])
            book.reset_kv_cache()
            out = book(PROMPT, cache=cache)[:, -1]
            book(out.argmax(-1, keepdim=True), cache=cache)
        with MatmulShapes() as got:
            token, _ = prefill(fast, PROMPT)
            n = PROMPT.shape[1]
            decode_one_token(fast, token, torch.tensor([n]), n + 1)
    assert len(want.shapes) == 4 * TINY["n_layers"]
    assert got.shapes == want.shapes


def test_tiny_greedy_200_tokens_and_logits_match_book(fast_tiny):
    """The book's greedy tokens come from `compare_logits`, whose teacher
    forcing runs the steps of `book_gen` (prefill, then argmax fed back
    through the book's KV cache): a second 200-token book run would
    compute the same ids again (the suite's time budget)."""
    book, fast = fast_tiny
    worst, want = compare_logits(book, fast, PROMPT, 200)
    assert worst < 1e-4
    assert tokens(generate(fast, PROMPT, 200)) == [want]
    assert len(set(want)) > 50  # the comparison is not a constant stream


def test_batch_of_two_matches_book(fast_tiny):
    book, fast = fast_tiny
    prompt = torch.tensor([[1, 5, 7, 9, 11, 300], [42, 17, 3, 99, 500, 8]])
    want = tokens(book_gen(book, prompt, 40))
    assert tokens(generate(fast, prompt, 40)) == want
    assert want[0] != want[1]


def test_reused_cache_does_not_leak_between_calls(fast_tiny):
    book, fast = fast_tiny
    long_prompt = torch.arange(1, 40).unsqueeze(0)
    list(generate(fast, long_prompt, 20))  # fills cache slots beyond PROMPT
    assert tokens(generate(fast, PROMPT, 30)) == tokens(book_gen(book, PROMPT, 30))


def test_stops_at_eos_and_never_yields_it(fast_tiny):
    book, fast = fast_tiny
    free = tokens(generate(fast, PROMPT, 60))[0]
    eos = free[7]
    first = free.index(eos)
    got = tokens(generate(fast, PROMPT, 60, eos_token_id=eos))
    assert got == ([free[:first]] if first > 0 else [])
    assert got == tokens(book_gen(book, PROMPT, 60, eos_token_id=eos))
    # EOS as the very first token: nothing at all is yielded
    assert tokens(generate(fast, PROMPT, 60, eos_token_id=free[0])) == []


def test_exactly_max_new_tokens_without_eos(fast_tiny):
    _, fast = fast_tiny
    free = tokens(generate(fast, PROMPT, 30))[0]
    unused = next(i for i in range(TINY["vocab_size"]) if i not in free)
    chunks = list(generate(fast, PROMPT, 30, eos_token_id=unused))
    assert len(chunks) == 30
    assert all(c.shape == (1, 1) for c in chunks)
    assert list(generate(fast, PROMPT, 0)) == []


def test_invalid_inputs_raise_at_call_time(fast_tiny):
    book, fast = fast_tiny
    with pytest.raises(ValueError, match="empty"):
        generate(fast, torch.zeros(1, 0, dtype=torch.long), 5)
    with pytest.raises(ValueError, match=">= 0"):
        generate(fast, PROMPT, -1)
    with pytest.raises(ValueError, match="context length"):
        generate(fast, PROMPT, TINY["context_length"])
    with pytest.raises(ValueError, match="batch"):
        generate(fast, PROMPT[0], 5)
    with pytest.raises(TypeError, match="from_book_model"):
        generate(book, PROMPT, 5)


@pytest.mark.slow  # an inductor compile
def test_compiled_decode_gives_the_eager_tokens():
    sd = tiny_state_dict(1, TINY)
    eager = fast_model(TINY, sd)
    compiled = fast_model(TINY, sd).compile_decode()
    want = tokens(generate(eager, PROMPT, 40))
    assert tokens(generate(compiled, PROMPT, 40)) == want
    skip_if_inductor_cannot_build(compiled.decode_compiled())
    assert compiled.decode_compiled()  # it really ran compiled here


@pytest.mark.slow  # an inductor compile
def test_block_scope_compiles_one_graph_for_all_layers():
    """scope="block": same tokens as eager, and one compiled graph serves
    every layer (what makes its compile short)."""
    import torch._dynamo.utils as dynamo_utils

    sd = tiny_state_dict(1, TINY)
    eager = fast_model(TINY, sd)
    regional = fast_model(TINY, sd).compile_decode(scope="block")
    want = tokens(generate(eager, PROMPT, 20))
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    assert tokens(generate(regional, PROMPT, 20)) == want
    skip_if_inductor_cannot_build(regional.decode_compiled())
    assert regional.decode_compiled() and regional.compile_scope == "block"
    assert TINY["n_layers"] >= 2
    assert dynamo_utils.counters["stats"]["unique_graphs"] == 1
    with pytest.raises(ValueError, match="scope"):
        regional.compile_decode(scope="layer")


def test_compile_failure_falls_back_to_eager(fast_tiny, capsys):
    _, fast = fast_tiny
    want = tokens(generate(fast, PROMPT, 15))

    def broken(*args):
        raise RuntimeError("no C++ compiler found\nlong traceback")

    fast.decode_step = CompiledStep(broken)
    try:
        assert tokens(generate(fast, PROMPT, 15)) == want
        captured = capsys.readouterr()
        out = captured.err
        assert captured.out == "" and out.count("torch.compile failed") == 1
        assert "no C++ compiler found" in out and "long traceback" not in out
        assert not fast.decode_compiled()
    finally:
        fast.decode_step = steps_mod.EAGER


@pytest.mark.slow  # the 0.6B shape
def test_06b_float32_tokens_and_logits_match_book():
    cfg = {**QWEN_CONFIG_06_B, "dtype": torch.float32}
    book = book_model(standin_state_dict(cfg, 7), cfg)
    fast = FastQwen3.from_book_model(book)
    steps = 20  # float32 0.6B: 3 GB read per step, twice
    worst, seq = compare_logits(book, fast, PROMPT, steps)
    assert worst < 1e-4
    assert tokens(generate(fast, PROMPT, steps)) == [seq]
    assert len(set(seq)) > 5


def onednn_takes_bf16() -> bool:
    """Whether switching oneDNN off can change who computes a bf16 product
    here: only where its bf16 check passes (see `bf16_gemv_path`)."""
    available = torch.backends.mkldnn.is_available()
    return bool(available and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@pytest.mark.slow  # the 0.6B shape
@pytest.mark.skipif(not X86_64, reason="claimed (and measured) on x86-64 only")
@pytest.mark.parametrize("mkldnn", [True, False], ids=["as-is", "mkldnn-off"])
def test_06b_bf16_standin_tokens_and_logits_match_book(tmp_path, exact_calls, mkldnn):
    """Claimed on x86-64 CPUs: eager fast decoding gives the book's greedy
    tokens and logits bit for bit, whichever path torch takes, because its
    linear layers give F.linear's bits (the exact kernel only where torch
    runs the same sums: `bf16_gemv_path`) and the rest are the book's own
    operations. Also with oneDNN off, which on a CPU with AVX512-BF16
    moves torch (and so the kernel) to ATen's dot."""
    if not mkldnn and not onednn_takes_bf16():
        pytest.skip("oneDNN takes no bf16 product on this CPU: the as-is run")
    path = write_standin_weights(tmp_path / "x.pth")
    sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    book = book_model(sd, QWEN_CONFIG_06_B)  # no random init to overwrite
    fast = FastQwen3.from_book_model(book)
    prompt = torch.tensor([[9707, 11, 1246, 525, 498, 30]])  # any 6 token ids
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        want = tokens(book_gen(book, prompt, 16))  # every logit below is equal
        assert tokens(generate(fast, prompt, 16)) == want
        worst, _ = compare_logits(book, fast, prompt, 8)
        decided = any(bf16_gemv_path(r, c) == ATEN_AVX2 for r, c in SHAPES_06B)
    assert worst == 0
    if get_kernels() is not None:  # the kernel ran exactly where decided
        assert fast.out_head.use_kernel and bool(exact_calls) is decided


# ---------------------------------------------------------------------------
# The step protocol
# ---------------------------------------------------------------------------


def test_every_step_kind_computes_one_step_of_the_model(fast_tiny):
    """A compiled step (here: the uncompiled function, over the whole static
    cache) gives the eager step's token and logits up to float32 sums; one
    whose compile failed is the eager step, over the filled slots."""
    _, fast = fast_tiny
    fast.setup_cache(1, PROMPT.shape[1] + 2)
    tok, _ = prefill(fast, PROMPT)
    pos = torch.tensor([PROMPT.shape[1]])
    kv = PROMPT.shape[1] + 1
    with torch.inference_mode():
        want = steps_mod.EAGER(fast, tok, pos, kv)
        static = CompiledStep(greedy_step)(fast, tok, pos, kv)
        failed = CompiledStep(greedy_step)
        failed.failed = True
        fallback = failed(fast, tok, pos, kv)
    assert torch.equal(static[0], want[0])
    assert torch.allclose(static[1], want[1], rtol=0, atol=1e-5)
    assert torch.equal(fallback[0], want[0]) and torch.equal(fallback[1], want[1])
    assert [s.kind for s in (steps_mod.EAGER, failed)] == ["eager", "compiled"]
    fast.decode_step = CompiledStep(greedy_step)
    assert fast.decode_compiled()
    fast.on_layers_replaced()  # what quantize_int8 calls
    assert fast.decode_step.kind == "eager" and fast.compile_scope is None


def test_a_batch_stops_only_when_every_row_is_at_eos():
    from utils.fast.steps import _all_eos

    assert _all_eos(torch.tensor([[7], [7]]), 7)
    assert not _all_eos(torch.tensor([[7], [3]]), 7)
    assert not _all_eos(torch.tensor([[3]]), 7)


# ---------------------------------------------------------------------------
# A cache continued (a chat's next turn: generate(start=...))
# ---------------------------------------------------------------------------


def _continued(model, first_budget):
    """A first generation cut after 10 tokens, then a longer prompt that
    shares its first 15 ids (prompt and the 9 tokens that went in),
    continued from there: 20 tokens."""
    first = generate(model, PROMPT, first_budget)
    answer = [first.__next__() for _ in range(10)]
    first.close()
    extra = torch.arange(100, 160).unsqueeze(0)
    prompt = torch.cat([PROMPT, *answer[:9], extra], dim=1)
    n = PROMPT.shape[1] + 9
    return prompt, tokens(generate(model, prompt, 20, start=n))


@pytest.mark.parametrize("native", [False, True], ids=["eager", "native"])
def test_a_continued_cache_computes_what_a_roomy_one_does(fast_tiny, native):
    """The second generation must grow the first one's cache (64 slots):
    what it keeps is copied and the native step reads the new one, so the
    tokens are those of the same calls on a cache roomy from the start; on
    the eager path (float32), also those of a fresh prefill."""
    if native:
        if get_kernels() is None:
            pytest.skip("the native step needs the C kernels")
        cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
        sd = tiny_state_dict(0, cfg)
        models = [fast_model(cfg, sd) for _ in range(3)]
        assert all(m.use_native_step() for m in models)
    else:
        book = fast_tiny[0]
        models = [FastQwen3.from_book_model(book) for _ in range(3)]
    prompt, grown = _continued(models[0], 10)
    assert models[0].trf_blocks[0].att.k_cache.shape[2] == 128  # grew from 64
    _, roomy = _continued(models[1], 400)
    assert models[1].trf_blocks[0].att.k_cache.shape[2] == 448  # never grew
    assert grown == roomy and len(set(grown[0])) > 5
    if not native:
        assert grown == tokens(generate(models[2], prompt, 20))


def test_a_continued_cache_needs_one_and_a_start_inside_the_prompt(fast_tiny):
    _, fast = fast_tiny
    fast.release_cache()
    with pytest.raises(ValueError, match="no KV cache"):
        list(generate(fast, PROMPT, 3, start=2))
    with pytest.raises(ValueError, match="start must be in"):
        generate(fast, PROMPT, 3, start=PROMPT.shape[1])
    epoch = fast.cache_epoch
    list(generate(fast, PROMPT, 3))  # a fresh cache: the epoch counts it
    assert fast.cache_epoch == epoch + 1


# ---------------------------------------------------------------------------
# The fused prefill of the paths that are not exact (native, int8)


def _prefill_then_decode(model, prompt, start, steps=20):
    """(the prefill's logits, its token, `steps` greedy tokens after it)."""
    model.setup_cache(1, prompt.shape[1] + steps + 1)
    if start:
        prefill(model, prompt[:, :start])
        token, logits = prefill_at(model, prompt[:, start:], start)
    else:
        token, logits = prefill(model, prompt)
    first = int(token[0, 0])
    seq = [first]
    pos = prompt.shape[1]
    for i in range(steps):
        token, _ = decode_one_token(model, token, torch.tensor([pos + i]), pos + i + 1)
        seq.append(int(token[0, 0]))
    return logits, seq


@pytest.mark.parametrize("start", [0, 9], ids=["fresh", "continued"])
def test_a_fused_prefill_is_close_to_the_books_and_keeps_one_row(fast_tiny, start):
    """`use_fused_prefill`: one fused attention call per layer (no matmul of
    the book's shapes) and the output layer on the last row only; float32
    logits within 1e-4 of the book's prefill (its own order of sums) and the
    same greedy tokens after it, from position 0 and continuing a cache."""
    book, _ = fast_tiny
    exact, fused = (FastQwen3.from_book_model(book) for _ in range(2))
    fused.use_fused_prefill()
    prompt = (torch.arange(40) * 37 % 997 + 1).unsqueeze(0)
    want_logits, want = _prefill_then_decode(exact, prompt, start)
    with MatmulShapes() as calls:
        got_logits, got = _prefill_then_decode(fused, prompt, start, steps=0)
    assert calls.shapes == []  # no score matrices in the book's shapes
    assert (got_logits - want_logits).abs().max().item() < 1e-4
    assert _prefill_then_decode(fused, prompt, start)[1] == want
    assert len(set(want)) > 5
    with torch.inference_mode():
        fused.setup_cache(1, 48)
        out = fused(prompt, torch.arange(40), 40)
        assert out.shape == (1, 1, TINY["vocab_size"])  # the last row only
        assert exact(prompt, torch.arange(40), 40).shape[1] == 40
        assert fused(prompt[:, :1], torch.tensor([0]), 1).shape[1] == 1


@pytest.mark.parametrize(
    "name, fused",
    [("fast", False), ("fast_block_compiled", False), ("fast_native", True),
     ("fast_eager_int8", True), ("fast_fastest", True)],
)  # fmt: skip
def test_only_the_paths_that_are_not_exact_prefill_fused(fast_tiny, name, fused):
    model = get_path(name).build(fast_tiny[0])
    assert model.fused_prefill is fused
    assert all(b.att.fused is fused for b in model.trf_blocks)


def _prefill_rate_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "ch02/03_fast-decoding/prefill_rate.py"
    spec = importlib.util.spec_from_file_location("prefill_rate", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_prefill_rate_counts_the_products_a_prefill_needs(fast_tiny):
    """Every transformer layer's weights once per row, the output layer's
    once: counted from the model's own linear layers."""
    script = _prefill_rate_script()
    book = fast_tiny[0]
    in_blocks = sum(
        m.weight.numel()
        for m in book.trf_blocks.modules()
        if isinstance(m, torch.nn.Linear)
    )
    want = 7 * in_blocks + book.out_head.weight.numel()
    assert script.needed_multiply_adds(book.cfg, 7) == want
    assert script.needed_multiply_adds(QWEN_CONFIG_06_B, 1) == 440_401_920 + 155_582_464


def test_prefill_rate_times_each_mode_beside_a_product(fast_tiny, capsys):
    script = _prefill_rate_script()
    book = fast_tiny[0]
    models = {n: get_path(n).build(book) for n in ("fast", "fast_eager_int8")}
    ids = torch.arange(1, 25).unsqueeze(0)
    rows = script.side_by_side(models, book.cfg, ids, rounds=2)
    assert [r["mode"] for r in rows] == ["fast", "fast_eager_int8"]
    assert rows[0]["vs_first"] == 1.0
    for r in rows:
        assert r["tok_s"] == pytest.approx(24 / r["seconds"])
        assert r["gmacs"] > 0 and r["mm_gmacs"] > 0 and r["share"] > 0
    script.print_rows(rows, 24)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| mode | prefill of 24 tokens (s) |")
    assert out[2].startswith("| `fast` |") and out[2].endswith("| 1.00x |")


@pytest.mark.parametrize(
    "argv, message",
    [(["--prompt-tokens", "0"], "--prompt-tokens must be 1 to 8192"),
     (["--modes", "fast,nope"], "no decode path 'nope'")],
)  # fmt: skip
def test_prefill_rate_bad_arguments_get_one_line(argv, message, capsys):
    assert _prefill_rate_script().main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
