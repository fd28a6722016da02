"""utils.fast.native: the whole decode step in one C call must compute what
the book's bf16 model computes (within bf16 rounding), for bf16 and int8
weights, and fall back to the eager step wherever it cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reasoning_from_scratch.ch02 import generate_text_basic_stream_cache as book_gen
from reasoning_from_scratch.qwen3 import KVCache

import utils.fast.build as build
from tests.tiny import (
    PROMPT,
    book_model,
    fast_model,
    tiny_config,
    tiny_state_dict,
    tokens,
)
from utils.fast import (
    FastQwen3,
    decode_one_token,
    generate,
    get_kernels,
    prefill,
    quantize_int8,
)
from utils.fast.native import NativeStep, unsupported_reason

BF16 = tiny_config(context_length=512, dtype=torch.bfloat16)
BONUS = Path(__file__).resolve().parents[2] / "ch02" / "03_fast-decoding"

pytestmark = pytest.mark.skipif(
    build.unsupported_reason() is not None,
    reason="the native step needs the C kernels (x86-64 with AVX2, or AArch64)",
)


def native(sd, cfg=BF16, **kwargs) -> FastQwen3:
    model = fast_model(cfg, sd)
    assert model.use_native_step(**kwargs) and model.decode_native()
    assert not model.decode_compiled()
    return model


def teacher_forced(ref_step, model, prompt, seq):
    """Max |logit difference| / max |reference logit| and the share of equal
    argmax tokens, along `seq`: ref_step(token or None) -> reference logits."""
    model.setup_cache(1, prompt.shape[1] + len(seq) + 1)
    with torch.inference_mode():
        ref = ref_step(prompt)
        _, got = prefill(model, prompt)
        pos = torch.tensor([prompt.shape[1]])
        worst, same = 0.0, 0
        for tok in seq:
            t = torch.tensor([[tok]])
            ref = ref_step(t).float()
            nxt, got = decode_one_token(model, t, pos, int(pos) + 1)
            worst = max(worst, float((got.float() - ref).abs().max() / ref.abs().max()))
            same += int(nxt[0, 0]) == int(ref.argmax())
            pos = pos + 1
    return worst, same / len(seq)


def test_tokens_and_logits_match_the_books_bf16_model():
    sd = tiny_state_dict(11, BF16)
    book = book_model(sd, BF16)
    want = tokens(book_gen(book, PROMPT, 120))[0]
    assert len(set(want)) > 30  # not a constant stream
    model = native(sd)
    cache = KVCache(n_layers=BF16["n_layers"])
    book.reset_kv_cache()

    def book_step(t):
        return book(t, cache=cache)[:, -1]

    worst, same = teacher_forced(book_step, model, PROMPT, want)
    # bf16 rounding at the book's points; only sums inside norms, softmax
    # and attention run in another order
    # (the book's bf16 matmuls round differently on AVX-512 CPUs: margin)
    assert worst < 0.03
    assert same >= 0.9


def test_equals_the_eager_step_and_ignores_the_thread_count():
    sd = tiny_state_dict(12, BF16)
    eager = fast_model(BF16, sd)
    model = native(sd)
    seq = tokens(generate(eager, PROMPT, 60))[0]

    def eager_step(t):
        n = t.shape[1]
        if n > 1:
            return prefill(eager, t)[1]
        step = eager_step.pos
        eager_step.pos += 1
        return decode_one_token(eager, t, torch.tensor([step]), step + 1)[1]

    eager_step.pos = PROMPT.shape[1]
    eager.setup_cache(1, PROMPT.shape[1] + len(seq) + 1)
    worst, same = teacher_forced(eager_step, model, PROMPT, seq)
    assert worst < 0.03 and same >= 0.9
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            model.setup_cache(1, 80)
            prefill(model, PROMPT)
            pos = torch.tensor([PROMPT.shape[1]])
            with torch.inference_mode():
                runs.append(decode_one_token(model, PROMPT[:, :1], pos)[1])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(runs[0], runs[1])  # rows and heads split, sums not


def test_int8_weights_match_the_eager_int8_step():
    sd = tiny_state_dict(13, BF16)
    eager = quantize_int8(fast_model(BF16, sd))
    model = quantize_int8(fast_model(BF16, sd))
    assert model.use_native_step()
    want = tokens(generate(eager, PROMPT, 60))[0]
    got = tokens(generate(model, PROMPT, 60))[0]
    assert sum(a == b for a, b in zip(got, want, strict=True)) >= 30  # free-running
    # quantize_int8 drops a step that saw the bf16 layers
    assert quantize_int8(model).decode_step.kind == "eager"


def test_cache_written_by_native_steps_serves_eager_steps():
    sd = tiny_state_dict(14, BF16)
    model = native(sd)
    eager = fast_model(BF16, sd)
    want = tokens(generate(eager, PROMPT, 30))[0]
    model.setup_cache(1, 40)
    tok, _ = prefill(model, PROMPT)
    got, pos = [int(tok)], PROMPT.shape[1]
    with torch.inference_mode():
        for i in range(29):
            if i == 15:  # the rest eager, reading what native steps wrote
                model.use_native_step(False)
                assert model.decode_step.kind == "eager"
            tok, _ = decode_one_token(model, tok, torch.tensor([pos]), pos + 1)
            got.append(int(tok))
            pos += 1
    assert sum(a == b for a, b in zip(got, want, strict=True)) >= 15
    k = model.trf_blocks[1].att.k_cache[0, :, : pos - 1].float()
    eager.setup_cache(1, 40)
    list(generate(eager, PROMPT, 30))
    k_ref = eager.trf_blocks[1].att.k_cache[0, :, : pos - 1].float()
    assert (k - k_ref).abs().max() <= 0.02 * k_ref.abs().max()


def test_step_follows_a_new_cache_and_holds_a_copied_cos():
    sd = tiny_state_dict(22, BF16)
    model, ref = native(sd), native(sd)
    want = tokens(generate(ref, PROMPT, 12))[0]
    assert tokens(generate(model, PROMPT, 12))[0] == want
    old = model.trf_blocks[0].att.k_cache
    # a longer cache (new tensors) and a cos/sin that is not contiguous
    model.setup_cache(1, 200)
    model.cos = model.cos.t().contiguous().t()
    model.sin = model.sin.t().contiguous().t()
    assert not model.cos.is_contiguous()
    tok, _ = prefill(model, PROMPT)
    got, pos = [int(tok)], PROMPT.shape[1]
    with torch.inference_mode():
        for _ in range(11):
            tok, _ = decode_one_token(model, tok, torch.tensor([pos]))
            got.append(int(tok))
            pos += 1
    assert got == want
    step = model.decode_step
    assert step._cache_refs[2] is model.trf_blocks[0].att.k_cache is not old
    assert step.cache_length == model.trf_blocks[0].att.k_cache.shape[2]
    cos = step._keep_cache[0]  # the copy the table points at, kept alive
    assert cos.is_contiguous() and torch.equal(cos, model.cos)
    assert step._table[step._g["COS"]] == cos.data_ptr()
    last = model.trf_blocks[-1].att  # one layer's cache replaced alone
    last.v_cache = last.v_cache.clone()
    with torch.inference_mode():
        decode_one_token(model, tok, torch.tensor([pos]))
    assert step._cache_refs[-1] is last.v_cache


def test_new_outputs_each_step_and_a_batch_cache_falls_back():
    sd = tiny_state_dict(23, BF16)
    model = native(sd)
    model.setup_cache(1, 32)
    prefill(model, PROMPT)
    pos = torch.tensor([PROMPT.shape[1]])
    tok = PROMPT[:, -1:]
    with torch.inference_mode():
        a_tok, a = decode_one_token(model, tok, pos)
        b_tok, b = decode_one_token(model, tok, pos)  # the same slot again
    # no copies are made of the native step's outputs: each call's are new
    assert a.data_ptr() != b.data_ptr() and a_tok.data_ptr() != b_tok.data_ptr()
    assert torch.equal(a, b) and a_tok.shape == (1, 1) and a_tok.dtype == torch.int64
    assert int(a_tok) == int(a.float().argmax())
    # a cache for two rows (checked when the cache changes): the eager step
    # runs (and, given one row, fails as it does in eager)
    model.setup_cache(2, 32)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="index_copy_"):
        decode_one_token(model, tok, pos)
    assert not model.decode_step._cache_ok and model.decode_native()
    model.setup_cache(1, 32)  # a usable cache again: the native step
    prefill(model, PROMPT)
    with torch.inference_mode():
        assert torch.equal(decode_one_token(model, tok, pos)[1], a)
    assert model.decode_step._cache_ok


def test_outputs_made_ahead_are_never_handed_out_twice():
    """The step makes its logits and token tensors OUTPUTS_AHEAD at a time;
    each call's are still its own: kept ones keep their values."""
    from utils.fast.native import OUTPUTS_AHEAD

    model = native(tiny_state_dict(24, BF16))
    model.setup_cache(1, 64)
    prefill(model, PROMPT)
    tok, kept = PROMPT[:, -1:], []
    with torch.inference_mode():
        for pos in range(PROMPT.shape[1], PROMPT.shape[1] + OUTPUTS_AHEAD + 3):
            tok, logits = decode_one_token(model, tok, torch.tensor([pos]))
            kept.append((tok, logits, tok.clone(), logits.clone()))
    pointers = {t.data_ptr() for pair in kept for t in pair[:2]}
    assert len(pointers) == 2 * len(kept)
    assert all(torch.equal(a, c) and torch.equal(b, d) for a, b, c, d in kept)
    assert not kept[0][1].is_inference()  # usable outside inference mode too


def test_token_and_position_of_any_integer_dtype():
    """C reads an int64 token and position where the tensors hold them;
    other integer dtypes, and a position given with more entries, go
    through copies and give the same logits."""
    model = native(tiny_state_dict(25, BF16))
    results = []
    for tok_dtype, pos in (
        (torch.int64, torch.tensor([5])),
        (torch.int32, torch.tensor([5], dtype=torch.int32)),
        (torch.int64, torch.tensor([5, 6], dtype=torch.int16)),
        (torch.int64, torch.tensor([5, 6])),
    ):
        model.setup_cache(1, 64)
        prefill(model, PROMPT)
        with torch.inference_mode():
            tok = PROMPT[:, -1:].to(tok_dtype)
            results.append(decode_one_token(model, tok, pos)[1])
    assert model.decode_native()
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_falls_back_to_eager_where_it_cannot_run(capsys):
    sd = tiny_state_dict(15, BF16)
    model = native(sd)
    eager = fast_model(BF16, sd)
    batch = torch.cat([PROMPT, PROMPT.flip(1)])
    assert tokens(generate(model, batch, 20)) == tokens(generate(eager, batch, 20))
    model.use_cpu_matvec(False)  # asked for torch's matmul: eager step
    assert tokens(generate(model, PROMPT, 20)) == tokens(generate(eager, PROMPT, 20))
    f32 = fast_model(tiny_config(), tiny_state_dict(15, tiny_config()))
    assert unsupported_reason(f32) is not None
    assert f32.use_native_step() is False and f32.decode_step.kind == "eager"
    out = capsys.readouterr()
    assert "native decode step off (it needs a bf16 model" in out.err and not out.out
    with pytest.raises(ValueError, match="native decode step unavailable"):
        NativeStep(f32)


def test_position_outside_the_cache_is_a_clear_error():
    model = native(tiny_state_dict(16, BF16))
    model.setup_cache(1, 10)  # rounded up to 64 slots
    prefill(model, PROMPT)
    with torch.inference_mode(), pytest.raises(ValueError, match="inside the KV cache"):
        decode_one_token(model, PROMPT[:, :1], torch.tensor([64]))
    with torch.inference_mode(), pytest.raises(ValueError, match="token 5000"):
        decode_one_token(model, torch.tensor([[5000]]), torch.tensor([6]))


def test_the_fastest_path_is_native_where_it_runs_else_a_compiled_block(
    monkeypatch, capsys
):
    """`fast_fastest` (the command line's --fast --compile) by a rule: the
    native step where it can run, with no compile; else the compiled block,
    with one line on stderr saying why."""
    from utils.fast import get_path

    book = book_model(tiny_state_dict(17, BF16), BF16)
    fast = get_path("fast_fastest").build(book)
    assert fast.decode_native() and fast.compile_scope is None
    assert "the native step, one C call per token" in capsys.readouterr().err
    monkeypatch.setattr(FastQwen3, "native_unsupported_reason", lambda s: "test")
    fast = get_path("fast_fastest").build(book)
    assert not fast.decode_native() and fast.compile_scope == "block"
    out = capsys.readouterr()
    assert not out.out and out.err.count("native step off: test") == 1


def test_cli_streamer_uses_the_native_step_for_fast(capsys):
    from utils.streaming import GreedyStreamer

    sd = tiny_state_dict(18, BF16)
    book = book_model(sd, BF16)
    eager = fast_model(BF16, sd)
    want = tokens(generate(eager, PROMPT, 12))[0]
    streamer = GreedyStreamer(book)
    got = list(streamer.stream(PROMPT, 12, fast=True))
    assert streamer.built_for("fast_native").decode_native()
    out = capsys.readouterr()
    assert not out.out
    assert "fast_native: the native step, one C call per token" in out.err
    assert sum(a == b for a, b in zip(got, want, strict=True)) >= 6


def test_int8_streamer_runs_the_native_int8_step(capsys):
    from utils.fast import Int8Linear
    from utils.streaming import GreedyStreamer

    sd = tiny_state_dict(23, BF16)
    book = book_model(sd, BF16)
    eager = quantize_int8(fast_model(BF16, sd))
    want = tokens(generate(eager, PROMPT, 12))[0]
    streamer = GreedyStreamer(book, int8=True)
    got = list(streamer.stream(PROMPT, 12, fast=True))
    fast = streamer.built_for("fast_native_int8")
    assert fast.decode_native()
    assert isinstance(fast.trf_blocks[0].ff.fc1, Int8Linear)
    assert "weight-only int8" in capsys.readouterr().err
    assert sum(a == b for a, b in zip(got, want, strict=True)) >= 6
    # the book model the streamer also serves keeps its bf16 weights
    assert book.trf_blocks[0].ff.fc1.weight.dtype == torch.bfloat16


def vector_op(lib, op: int, x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.float32).contiguous()
    y = torch.empty_like(x)
    assert lib.qwen3_test_vector_op(op, x.data_ptr(), y.data_ptr(), x.numel()) == 0
    return y


def test_the_steps_bf16_rounding_and_exp(test_kernels):
    lib = test_kernels.lib
    gen = torch.Generator().manual_seed(0)
    special = [0.0, -0.0, 1e-40, -3e-39, 3.3e38, -3.4e38, 1.0039062, 1.0117188]
    scale = 10.0 ** torch.randint(-30, 30, (4000,), generator=gen)
    x = torch.cat([
        torch.randn(4000, generator=gen) * scale,
        torch.tensor(special + [float("inf"), -float("inf"), float("nan"), 2.5] * 2),
    ])  # fmt: skip
    x = x[: x.numel() // 8 * 8]
    got = vector_op(lib, 0, x)
    want = x.to(torch.bfloat16).to(torch.float32)  # round to nearest even
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok], want[ok])
    e = torch.linspace(-95, 95, 8 * 3000)
    got = vector_op(lib, 1, e).double()
    want = torch.exp(e.double())
    normal = (want > 1.2e-38) & (want < 3.4e38)
    rel = ((got - want).abs() / want)[normal]
    assert rel.max() < 3e-7  # about 2 float32 ulp
    tiny = want <= 1.2e-38  # subnormal results: within one subnormal step
    assert torch.all((got[tiny] - want[tiny]).abs() <= 1.5e-45)
    assert torch.all(got[e > 88.73].isinf())
    edge = vector_op(
        lib, 1, torch.tensor([float("-inf"), float("inf"), float("nan"), 0.0] * 2)
    )
    assert edge[:3].tolist()[:2] == [0.0, float("inf")] and edge[2].isnan()
    assert edge[3] == 1.0


def test_new_weights_renew_the_step_and_old_ones_stay_alive():
    sd, other = tiny_state_dict(19, BF16), tiny_state_dict(20, BF16)
    model = native(sd)
    step = model.decode_step
    # the step holds every tensor it points at: replacing one cannot free it
    held = {id(t) for t in step._keep}
    assert id(model.trf_blocks[0].att.W_query.weight) in held
    assert id(model.out_head.weight) in held
    model.load_state_dict(other, assign=True)  # new tensors, new addresses
    assert model.decode_native() and model.decode_step is not step
    want = tokens(generate(fast_model(BF16, other), PROMPT, 20))[0]
    got = tokens(generate(model, PROMPT, 20))[0]
    assert sum(a == b for a, b in zip(got, want, strict=True)) >= 10


def _step_bandwidth_script():
    import importlib.util

    path = BONUS / "step_bandwidth.py"
    spec = importlib.util.spec_from_file_location("step_bandwidth", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_step_bandwidth_script_times_each_step_next_to_a_sum():
    from utils.benchmark.bandwidth import weight_bytes_per_token
    from utils.fast import describe_step

    script = _step_bandwidth_script()
    sd = tiny_state_dict(21, BF16)
    bf16, int8 = native(sd), quantize_int8(fast_model(BF16, sd))
    assert int8.use_native_step()
    rows = script.side_by_side({"bf16": bf16, "int8": int8}, rounds=4, positions=3)
    assert [r["mode"] for r in rows] == ["bf16", "int8"]
    for row, model in zip(rows, (bf16, int8), strict=True):
        assert row["kernels"] == describe_step(model) == model.decode_step.describe()
        assert row["gb_per_token"] == weight_bytes_per_token(model) / 1e9
        assert row["step_ms"] > 0 and row["ratio"] > 0
        assert row["step_gbps"] == pytest.approx(
            row["gb_per_token"] / row["step_ms"] * 1e3
        )
        # 4 rounds: 1+2+1; each third (lo, hi, step / sum, one core's share)
        assert [len(t) for t in row["thirds"]] == [4, 4, 4]
        assert all(0 < t[3] for t in row["thirds"])
        # steps ran at the prompt's next 3 positions, in the model's cache
        cache = model.trf_blocks[0].att.k_cache[0, 0]
        assert cache[5:8].abs().sum(dim=-1).gt(0).all()
        assert not cache[8:].any()
    assert rows[1]["gb_per_token"] < 0.6 * rows[0]["gb_per_token"]


def test_step_bandwidth_splits_the_rounds_by_the_sums_speed():
    """Thirds by torch.sum's speed, slowest first: each with its speed range
    and its own median step / sum ratio."""
    by_speed = _step_bandwidth_script().by_memory_speed
    # (step s, sum s, one-core sum s) over 1 GB: sums at 10, 20 and 50
    # GB/s, two each, in mixed order; the step keeps up at 10 GB/s only,
    # where one core reads as much as two; at 50 one core reads half
    pairs = [(0.04, 0.02, 0.04), (0.1, 0.1, 0.1), (0.06, 0.05, 0.0625),
             (0.1, 0.1, 0.1), (0.04, 0.02, 0.04), (0.06, 0.05, 0.0625)]  # fmt: skip
    thirds = by_speed(pairs, 10**9)
    assert [(round(lo), round(hi)) for lo, hi, _, _ in thirds] == [
        (10, 10),
        (20, 20),
        (50, 50),
    ]
    assert [r for _, _, r, _ in thirds] == pytest.approx([1.0, 0.05 / 0.06, 0.5])
    assert [one for *_, one in thirds] == pytest.approx([1.0, 0.8, 0.5])
    assert len(by_speed(pairs[:2], 10**9)) == 2  # no empty third


def test_step_bandwidth_times_one_core_on_one_thread(monkeypatch):
    """The one-core sum runs on a single thread and gives the thread count
    back, also when the sum fails."""
    script = _step_bandwidth_script()
    threads = torch.get_num_threads()
    seen = []
    real_sum = torch.sum

    def counting_sum(t):
        seen.append(torch.get_num_threads())
        return real_sum(t)

    monkeypatch.setattr(torch, "sum", counting_sum)
    assert script.one_core_sum(torch.ones(1000)) > 0
    assert seen == [1] and torch.get_num_threads() == threads

    def failing_sum(t):
        raise RuntimeError("no memory")

    monkeypatch.setattr(torch, "sum", failing_sum)
    with pytest.raises(RuntimeError):
        script.one_core_sum(torch.ones(10))
    assert torch.get_num_threads() == threads


def test_a_library_with_another_table_layout_is_refused(monkeypatch, capsys):
    """The table is filled by the names the library reports; a library
    whose layout names other slots is not driven at all."""
    import dataclasses

    kernels = get_kernels()
    model = fast_model(BF16, tiny_state_dict(24, BF16))
    layout = dict(kernels.library.layout)
    layout["layer"] = (*layout["layer"], "NEW_SLOT")
    monkeypatch.setattr(
        kernels, "library", dataclasses.replace(kernels.library, layout=layout)
    )
    assert "another decode-step table layout" in unsupported_reason(model)
    assert not model.use_native_step() and not model.decode_native()
    assert "native decode step off" in capsys.readouterr().err


WIDE_STEP = """
import torch
from tests.tiny import fast_model, tiny_config, tiny_state_dict
from utils.fast import decode_one_token, prefill
cfg = tiny_config(emb_dim=512, dtype=torch.bfloat16)  # E > 2 * hidden, > q+k+v
sd = tiny_state_dict(5, cfg)
out = []
for native in (False, True):
    model = fast_model(cfg, sd)
    assert model.use_native_step(native) == native
    model.setup_cache(1, 16)
    with torch.inference_mode():
        tok, _ = prefill(model, torch.tensor([[1, 2, 3]]))
        logits = [decode_one_token(model, tok, torch.tensor([3]))[1]]
    out.append(logits[0].float())
print(float((out[0] - out[1]).abs().max() / out[0].abs().max()))
"""


@pytest.mark.slow  # a subprocess
def test_a_model_wider_than_its_products_outputs_steps_in_bounds():
    """The step's scratch for product outputs holds the embedding width too
    (a model whose emb_dim exceeds 2 x hidden_dim and q+k+v once wrote past
    it, and the process aborted); run apart, so a crash is a failure."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", WIDE_STEP], capture_output=True, text=True,
        timeout=300, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.split()[-1]) < 0.03


# Every product of this model is big enough to be shared by two threads
# (the tiny model's run on one), and its attention is shared from 16 slots
SPLIT = tiny_config(
    emb_dim=256, hidden_dim=512, head_dim=64, context_length=64,
    dtype=torch.bfloat16,
)  # fmt: skip


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_the_steps_team_gives_one_threads_bits_with_a_late_thread(
    int8, test_kernels, monkeypatch
):
    """The whole step is one parallel region: the products, the kv groups
    and the SwiGLU are shared out, the rest done by every thread. With one
    thread, two, and two of which the second reaches every product 20 ms
    late (its passes then taken from the back by the first; the test
    build's hooks; 2 ms was not late enough under qemu's emulation), the
    logits and the next token are the same bits."""
    import utils.fast.native as native_module
    import utils.fast.threads

    monkeypatch.setattr(native_module, "get_kernels", lambda: test_kernels)
    model = native(tiny_state_dict(14, SPLIT), SPLIT)
    if int8:
        model = quantize_int8(model)
        assert model.use_native_step() and model.decode_native()
    lib = test_kernels.lib
    # each count pinned: the step's own choice may take one thread where two
    # are slower, and then no pass is ever stolen
    monkeypatch.setattr(utils.fast.threads, "_pinned", None)
    threads = torch.get_num_threads()
    runs, stolen = [], []
    try:
        for n, late_us in ((1, 0), (2, 0), (2, 20000)):
            utils.fast.threads.pin_step_threads(n)  # torch's count too
            model.setup_cache(1, 40)
            prefill(model, torch.arange(1, 31).view(1, -1))
            lib.qwen3_test_stolen_passes(late_us)
            with torch.inference_mode():
                nxt, logits = decode_one_token(model, PROMPT[:, :1], torch.tensor([30]))
            stolen.append(lib.qwen3_test_stolen_passes(0))
            runs.append((int(nxt[0, 0]), logits.view(torch.int16)))
    finally:
        torch.set_num_threads(threads)
        lib.qwen3_test_stolen_passes(0)
    assert runs[1][0] == runs[0][0] == runs[2][0]
    assert torch.equal(runs[1][1], runs[0][1])
    assert torch.equal(runs[2][1], runs[0][1])
    assert stolen[0] == 0 and stolen[2] > 0


def test_the_readers_library_has_no_test_hooks(kernels, test_kernels):
    """The step of the reader's library runs without the scheduler's test
    hooks, and gives the test build's bits."""
    assert not hasattr(kernels.lib, "qwen3_test_stolen_passes")
    model = native(tiny_state_dict(14, SPLIT), SPLIT)
    model.setup_cache(1, 40)
    prefill(model, torch.arange(1, 31).view(1, -1))
    with torch.inference_mode():
        _, logits = decode_one_token(model, PROMPT[:, :1], torch.tensor([30]))
    import utils.fast.native as native_module

    real = native_module.get_kernels
    native_module.get_kernels = lambda: test_kernels
    try:
        test_built = native(tiny_state_dict(14, SPLIT), SPLIT)
    finally:
        native_module.get_kernels = real
    assert test_built.decode_step._kernels is test_kernels
    test_built.setup_cache(1, 40)
    prefill(test_built, torch.arange(1, 31).view(1, -1))
    with torch.inference_mode():
        _, want = decode_one_token(test_built, PROMPT[:, :1], torch.tensor([30]))
    assert torch.equal(logits.view(torch.int16), want.view(torch.int16))


def test_step_bandwidth_builds_one_model_per_kernel_named(capsys):
    """--kernels: one native model per named kernel, each running it (its
    class's weights), through the registry; a name not in the table is a
    clear error."""
    from utils.fast.dispatch import kernel_table

    script = _step_bandwidth_script()
    book = book_model(tiny_state_dict(25, BF16), BF16)
    kernels = get_kernels()
    exact, int8 = (kernels.table[kernels.first[c]].name for c in ("exact", "int8"))
    models = script.native_models(book, [exact, int8])
    assert list(models) == [exact, int8]
    assert models[exact].decode_step.describe() == exact
    assert models[int8].decode_step.describe() == int8
    assert set(script.native_models(book, [])) == {"native bf16", "native int8"}
    names = ", ".join(k.name for k in kernel_table(get_kernels()))
    with pytest.raises(ValueError, match=f"choose from {names}"):
        script.native_models(book, ["no_such_kernel"])
    rows = script.side_by_side(models, rounds=3, positions=3)
    script.print_rows(rows)
    table = capsys.readouterr().out.splitlines()
    assert table[2].startswith(f"| {exact} | {exact} |")
