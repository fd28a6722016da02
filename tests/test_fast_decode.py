"""utils.fast_decode must compute what the book's model computes.

Reference: `reasoning_from_scratch.ch02.generate_text_basic_stream_cache` and
the book's `Qwen3Model` on the same weights. Tiny configs for most checks; the
real 0.6B shape only where that shape is the point (float32 and bf16).
"""

from __future__ import annotations

import time

import pytest
import torch
from reasoning_from_scratch.ch02 import generate_text_basic_stream_cache as book_gen
from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B, KVCache, Qwen3Model
from tiny import (
    PROMPT,
    book_model,
    skip_if_inductor_cannot_build,
    tiny_config,
    tiny_state_dict,
    tokens,
)

from utils import cpu_matvec, fast_decode
from utils.fast_decode import (
    FastQwen3,
    _FallbackCompiled,
    cache_length_for,
    decode_one_token,
    generate,
    pick_faster,
    prefill,
)
from utils.quantize import (
    Int8Embedding,
    Int8Linear,
    int8_agreement,
    quantize_int8,
    quantize_weight,
)
from utils.standin import standin_state_dict, write_standin_weights

TINY = tiny_config(context_length=512)


def on_torchs_avx2_gemv() -> bool:
    """Whether torch's bf16 F.linear takes its AVX2 ATen path here (where
    the eager kernel must be in use), not oneDNN (AVX-512 BF16 CPUs)."""
    return (
        torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT")
        and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


@pytest.fixture(scope="module")
def tiny():
    book = book_model(tiny_state_dict(0, TINY), TINY)
    return book, FastQwen3.from_book_model(book)


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


def test_tiny_greedy_200_tokens_and_logits_match_book(tiny):
    book, fast = tiny
    want = tokens(book_gen(book, PROMPT, 200))
    got = tokens(generate(fast, PROMPT, 200))
    assert got == want
    assert len(set(want[0])) > 50  # the comparison is not a constant stream
    worst, _ = compare_logits(book, fast, PROMPT, 200)
    assert worst < 1e-4


def test_batch_of_two_matches_book(tiny):
    book, fast = tiny
    prompt = torch.tensor([[1, 5, 7, 9, 11, 300], [42, 17, 3, 99, 500, 8]])
    want = tokens(book_gen(book, prompt, 40))
    assert tokens(generate(fast, prompt, 40)) == want
    assert want[0] != want[1]


def test_reused_cache_does_not_leak_between_calls(tiny):
    book, fast = tiny
    long_prompt = torch.arange(1, 40).unsqueeze(0)
    list(generate(fast, long_prompt, 20))  # fills cache slots beyond PROMPT
    assert tokens(generate(fast, PROMPT, 30)) == tokens(book_gen(book, PROMPT, 30))


def test_state_dict_keys_and_weight_sharing(tiny):
    book, fast = tiny
    assert fast.state_dict().keys() == book.state_dict().keys()
    assert fast.tok_emb.weight.data_ptr() == book.tok_emb.weight.data_ptr()
    att_f, att_b = fast.trf_blocks[1].att, book.trf_blocks[1].att
    assert att_f.W_key.weight.data_ptr() == att_b.W_key.weight.data_ptr()


def test_load_state_dict_into_fresh_model_and_tied_head():
    sd = tiny_state_dict(3, TINY)
    book = book_model(sd, TINY)
    fast = FastQwen3(TINY)
    fast.load_state_dict(sd)
    assert tokens(generate(fast, PROMPT, 25)) == tokens(book_gen(book, PROMPT, 25))

    tied = {k: v for k, v in sd.items() if k != "out_head.weight"}
    fast_tied = FastQwen3.from_state_dict(TINY, tied)
    assert fast_tied.out_head.weight is fast_tied.tok_emb.weight


def test_cache_is_sized_to_the_request_not_the_context(tiny):
    _, fast = tiny
    list(generate(fast, PROMPT, 10))
    b, groups, length, head_dim = fast.cache_shape
    assert (b, groups, head_dim) == (1, TINY["n_kv_groups"], TINY["head_dim"])
    assert length == cache_length_for(PROMPT.shape[1] + 10, TINY["context_length"])
    assert PROMPT.shape[1] + 10 <= length < TINY["context_length"]
    assert cache_length_for(500, 512) == 512
    assert cache_length_for(512, 512) == 512


# ---------------------------------------------------------------------------
# Stopping rules and input validation
# ---------------------------------------------------------------------------


def test_stops_at_eos_and_never_yields_it(tiny):
    book, fast = tiny
    free = tokens(generate(fast, PROMPT, 60))[0]
    eos = free[7]
    first = free.index(eos)
    got = tokens(generate(fast, PROMPT, 60, eos_token_id=eos))
    assert got == ([free[:first]] if first > 0 else [])
    assert got == tokens(book_gen(book, PROMPT, 60, eos_token_id=eos))
    # EOS as the very first token: nothing at all is yielded
    assert tokens(generate(fast, PROMPT, 60, eos_token_id=free[0])) == []


def test_exactly_max_new_tokens_without_eos(tiny):
    _, fast = tiny
    free = tokens(generate(fast, PROMPT, 30))[0]
    unused = next(i for i in range(TINY["vocab_size"]) if i not in free)
    chunks = list(generate(fast, PROMPT, 30, eos_token_id=unused))
    assert len(chunks) == 30
    assert all(c.shape == (1, 1) for c in chunks)
    assert list(generate(fast, PROMPT, 0)) == []


def test_invalid_inputs_raise_at_call_time(tiny):
    book, fast = tiny
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


# ---------------------------------------------------------------------------
# Compiled decode step
# ---------------------------------------------------------------------------


def test_compiled_decode_gives_the_eager_tokens():
    sd = tiny_state_dict(1, TINY)
    eager = FastQwen3.from_state_dict(TINY, sd)
    compiled = FastQwen3.from_state_dict(TINY, sd).compile_decode()
    want = tokens(generate(eager, PROMPT, 40))
    assert tokens(generate(compiled, PROMPT, 40)) == want
    skip_if_inductor_cannot_build(compiled.decode_compiled())
    assert compiled.decode_compiled()  # it really ran compiled here


def test_block_scope_compiles_one_graph_for_all_layers():
    """scope="block": same tokens as eager, and one compiled graph serves
    every layer (what makes its compile short)."""
    import torch._dynamo.utils as dynamo_utils

    sd = tiny_state_dict(1, TINY)
    eager = FastQwen3.from_state_dict(TINY, sd)
    regional = FastQwen3.from_state_dict(TINY, sd).compile_decode(scope="block")
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


def test_compile_failure_falls_back_to_eager(tiny, capsys):
    _, fast = tiny
    want = tokens(generate(fast, PROMPT, 15))

    def broken(*args):
        raise RuntimeError("no C++ compiler found\nlong traceback")

    fast._decode_step = _FallbackCompiled(broken)
    try:
        assert tokens(generate(fast, PROMPT, 15)) == want
        out = capsys.readouterr().out
        assert out.count("torch.compile failed") == 1
        assert "no C++ compiler found" in out and "long traceback" not in out
        assert not fast.decode_compiled()
    finally:
        fast._decode_step = None


# ---------------------------------------------------------------------------
# Weight-only int8 (approximate)
# ---------------------------------------------------------------------------


def test_int8_linear_is_close_to_the_float_layer():
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 96, bias=False)
    q = Int8Linear.from_linear(lin)
    assert q.weight_int8.dtype == torch.int8 and q.scales.shape == (96,)
    x = torch.randn(3, 5, 256)
    ref = lin(x)
    rel = (q(x) - ref).norm() / ref.norm()
    assert rel < 0.01


def test_quantize_weight_is_chunk_independent_and_keeps_temporaries_small():
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    w = (torch.randn(4096, 1024) * 0.05).to(torch.bfloat16)
    w[3] = 0  # an all-zero row keeps a tiny positive scale, not nan
    w[9, 5] = -7.0  # its absmax is negative
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        q, scales = quantize_weight(w)
    # no temporary larger than the int8 result (4 MB); a float32 copy of
    # the whole weight would be 16 MB and stay in the heap as peak memory
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert largest <= q.numel()
    ref = w.float()
    s = ref.abs().amax(dim=1).clamp(min=1e-12) / 127
    assert torch.equal(scales, s)
    assert torch.equal(q, torch.round(ref / s[:, None]).clamp(-127, 127).to(torch.int8))
    assert q[9, 5] == -127 and not q[3].any()
    for chunk in (1, 7, 5000):
        q2, s2 = quantize_weight(w, rows_per_chunk=chunk)
        assert torch.equal(q2, q) and torch.equal(s2, scales)


def test_int8_model_mostly_agrees_and_leaves_book_weights_alone(tiny):
    book, _ = tiny
    before = book.trf_blocks[0].ff.fc1.weight.clone()
    q = quantize_int8(FastQwen3.from_book_model(book))
    assert isinstance(q.trf_blocks[0].ff.fc1, Int8Linear)
    assert torch.equal(book.trf_blocks[0].ff.fc1.weight, before)
    # Teacher-forced top-1 agreement along the book's greedy tokens
    cache = KVCache(n_layers=TINY["n_layers"])
    book.reset_kv_cache()
    q.setup_cache(1, PROMPT.shape[1] + 60)
    agree = 0
    with torch.inference_mode():
        ref = book(PROMPT, cache=cache)[:, -1]
        tok, _ = prefill(q, PROMPT)
        pos = torch.tensor([PROMPT.shape[1]])
        for _ in range(60):
            want = ref.argmax(dim=-1, keepdim=True)
            agree += int(torch.equal(tok, want))
            ref = book(want, cache=cache)[:, -1]
            tok, _ = decode_one_token(q, want, pos, int(pos) + 1)
            pos = pos + 1
    assert agree >= 48  # most steps (80 %), not all: int8 is approximate
    assert len(tokens(generate(q, PROMPT, 20))[0]) == 20


# ---------------------------------------------------------------------------
# The real 0.6B shape (heavier: about 3 GB RAM, tens of seconds)
# ---------------------------------------------------------------------------


def test_06b_float32_tokens_and_logits_match_book():
    cfg = {**QWEN_CONFIG_06_B, "dtype": torch.float32}
    book = book_model(standin_state_dict(cfg, 7), cfg)
    fast = FastQwen3.from_book_model(book)
    steps = 20  # float32 0.6B: 3 GB read per step, twice
    worst, seq = compare_logits(book, fast, PROMPT, steps)
    assert worst < 1e-4
    assert tokens(generate(fast, PROMPT, steps)) == [seq]
    assert len(set(seq)) > 5


def test_06b_bf16_standin_first_50_tokens_match_book(tmp_path):
    """Exact where torch's bf16 kernels take their AVX2 path (the eager
    matrix-vector kernel is then in use and rounds like F.linear)."""
    path = write_standin_weights(tmp_path / "x.pth")
    sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    book = Qwen3Model(QWEN_CONFIG_06_B)
    book.load_state_dict(sd)
    del sd
    fast = FastQwen3.from_book_model(book)
    prompt = torch.tensor([[9707, 11, 1246, 525, 498, 30]])  # any 6 token ids
    want = tokens(book_gen(book, prompt, 50))
    got = tokens(generate(fast, prompt, 50))
    if not (
        on_torchs_avx2_gemv() and torch.backends.cpu.get_cpu_capability() == "AVX2"
    ):
        # Measured: with ATEN_CPU_CAPABILITY=default this comparison failed
        # (cause not yet isolated); the claim is made for the AVX2 path only
        pytest.xfail("exact equality is claimed on torch's AVX2 path only")
    assert got == want
    if cpu_matvec.get_kernels() is not None:
        assert fast.cpu_matvec_active() and cpu_matvec.kernel_rounds_like_torch()


def test_int8_agreement_figure_on_a_tiny_model():
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(4, cfg)
    ref = FastQwen3.from_state_dict(cfg, sd)
    same = int8_agreement(ref, FastQwen3.from_state_dict(cfg, sd), [PROMPT], 12)
    assert same["token_agreement"] == 1.0 and same["logits_max_rel_error"] == 0.0
    assert same["identical_continuations"] == 1.0 and same["steps"] == 12
    q = quantize_int8(FastQwen3.from_state_dict(cfg, sd))
    prompts = [PROMPT, torch.tensor([[42, 17, 3, 99]]), torch.tensor([[7, 8]])]
    got = int8_agreement(ref, q, prompts, 20)
    assert got["steps"] == 60
    assert 0.8 <= got["token_agreement"] <= 1.0
    assert 0.0 < got["logits_max_rel_error"] < 0.1


def test_quantize_releases_each_bf16_weight_and_keeps_old_imports(tmp_path):
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    path = tmp_path / "tiny.pth"
    torch.save(tiny_state_dict(5, cfg), path)
    bf16 = FastQwen3.from_checkpoint(path, cfg)
    q = FastQwen3.from_checkpoint(path, cfg, int8=True)
    linear_types = {
        type(m) for m in q.modules() if isinstance(m, (torch.nn.Linear, Int8Linear))
    }
    assert linear_types == {Int8Linear}
    # no bf16 matrix is left: an untied embedding gets its own int8 table
    assert isinstance(q.tok_emb, Int8Embedding)
    assert all(p.dim() < 2 for p in q.parameters())
    emb = bf16.tok_emb(PROMPT).float()
    got_emb = q.tok_emb(PROMPT)
    assert got_emb.dtype == torch.bfloat16
    assert (got_emb.float() - emb).abs().max() <= emb.abs().max() / 100
    # a tied one (as in Qwen3 0.6B) reads the head's int8 table
    tied = tiny_state_dict(5, cfg)
    del tied["out_head.weight"]
    t = quantize_int8(FastQwen3.from_state_dict(cfg, tied))
    assert t.tok_emb.weight_int8 is t.out_head.weight_int8
    assert torch.equal(t.tok_emb.weight_int8, q.tok_emb.weight_int8)
    got = int8_agreement(bf16, q, [PROMPT], 15)
    assert got["token_agreement"] >= 0.8
    assert fast_decode.quantize_int8 is quantize_int8  # moved, still importable
    assert fast_decode.Int8Linear is Int8Linear


def test_pick_faster_keeps_the_faster_step(monkeypatch):
    cfg = tiny_config(context_length=512)
    fast = FastQwen3.from_state_dict(cfg, tiny_state_dict(6, cfg))
    want = tokens(generate(fast, PROMPT, 12))

    def slow_step(*args):  # stands in for a compiled step that lost
        time.sleep(0.05)
        return fast_decode._decode_one_token_impl(*args)

    slow = _FallbackCompiled(slow_step)
    fast._decode_step = slow
    result = pick_faster(fast, PROMPT, steps=3)
    assert result["choice"] == "eager" and fast._decode_step is None
    assert result["compiled_s"] > result["eager_s"]
    fast.compile_decode()
    result = pick_faster(fast, PROMPT, steps=3)
    assert result["choice"] in ("eager", "compiled")
    assert (fast._decode_step is not None) == (result["choice"] == "compiled")
    assert tokens(generate(fast, PROMPT, 12)) == want
