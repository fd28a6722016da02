"""utils.fast.quantize: weight-only int8 stays close to bf16, converts a
model layer by layer without keeping both copies, and leaves the book's
weights alone; the agreement figure of ch02/03_fast-decoding/agreement.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from reasoning_from_scratch.qwen3 import KVCache

import utils.fast
import utils.fast.hugepages as hugepages
import utils.fast.quantize as quantize_module
from tests.memory_maps import vm_flags
from tests.tiny import PROMPT, fast_model, tiny_config, tiny_state_dict, tokens
from utils.fast import FastQwen3, decode_one_token, generate, prefill
from utils.fast.quantize import (
    Int8Embedding,
    Int8Linear,
    int8_block,
    quantize_int8,
    quantize_weight,
)

TINY = tiny_config(context_length=512)
BONUS = Path(__file__).resolve().parents[2] / "ch02" / "03_fast-decoding"


def agreement_script():
    """ch02/03_fast-decoding/agreement.py as a module."""
    spec = importlib.util.spec_from_file_location("agreement", BONUS / "agreement.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_int8_linear_is_close_to_the_float_layer():
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 96, bias=False)
    q = Int8Linear(*quantize_weight(lin.weight))
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


def test_int8_model_mostly_agrees_and_leaves_book_weights_alone(fast_tiny):
    book, _ = fast_tiny
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


@pytest.mark.heavy_under_emulation
def test_int8_agreement_figure_on_a_tiny_model():
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(4, cfg)
    ref = fast_model(cfg, sd)
    int8_agreement = agreement_script().int8_agreement
    same = int8_agreement(ref, fast_model(cfg, sd), [PROMPT], 12)
    assert same["token_agreement"] == 1.0 and same["logits_max_rel_error"] == 0.0
    assert same["identical_continuations"] == 1.0 and same["steps"] == 12
    q = quantize_int8(fast_model(cfg, sd))
    prompts = [PROMPT, torch.tensor([[42, 17, 3, 99]]), torch.tensor([[7, 8]])]
    got = int8_agreement(ref, q, prompts, 20)
    assert got["steps"] == 60
    assert 0.8 <= got["token_agreement"] <= 1.0
    assert 0.0 < got["logits_max_rel_error"] < 0.1


def test_quantize_releases_each_bf16_weight(tmp_path):
    """The command line's int8 path: the book's model loaded (memory-mapped)
    from the checkpoint, its weights handed to the fast model (`adopt`),
    every bf16 matrix replaced by int8 and nothing of bf16 left held."""
    from utils.fast import get_path
    from utils.models import load_book_model, read_checkpoint

    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    path = tmp_path / "tiny.pth"
    torch.save(tiny_state_dict(5, cfg), path)
    bf16 = fast_model(cfg, read_checkpoint(path))
    book = load_book_model(read_checkpoint(path), cfg=cfg)
    held = book.trf_blocks[0].ff.fc1.weight
    q = get_path("fast_eager_int8").build(book, adopt=True)
    assert all(p is None for p in book.parameters()) or not list(book.parameters())
    assert sys.getrefcount(held) == 2  # only `held`: the model let it go
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
    t = quantize_int8(fast_model(cfg, tied))
    assert t.tok_emb.weight_int8 is t.out_head.weight_int8
    assert torch.equal(t.tok_emb.weight_int8, q.tok_emb.weight_int8)
    got = agreement_script().int8_agreement(bf16, q, [PROMPT], 15)
    assert got["token_agreement"] >= 0.8
    # the package's public names are the quantize module's
    assert utils.fast.quantize_int8 is quantize_int8
    assert utils.fast.Int8Linear is Int8Linear


HUGE = 2 << 20


def test_int8_weights_are_quantized_into_one_block_in_model_order():
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(5, cfg)  # untied: the embedding is in the block too
    q = quantize_int8(fast_model(cfg, sd))
    names = ["tok_emb"] + [
        name for name, m in q.named_modules() if isinstance(m, Int8Linear)
    ]
    tensors = [q.get_submodule(name).weight_int8 for name in names]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    starts = [t.data_ptr() for t in tensors]
    assert starts[0] % HUGE == 0 and all(p % 64 == 0 for p in starts)
    ends = [p + t.numel() for p, t in zip(starts, tensors, strict=True)]
    assert all(e <= p for e, p in zip(ends, starts[1:], strict=False))
    for name, t in zip(names, tensors, strict=True):  # the same numbers
        want, _ = quantize_weight(sd[f"{name}.weight"])
        assert t.is_contiguous() and torch.equal(t, want), name


def test_int8_block_advises_only_whole_aligned_2mb_pages(monkeypatch):
    calls = []
    monkeypatch.setattr(hugepages, "madvise", lambda *a: calls.append(a))
    shapes = [(1024, 3000), (3, 5), (2048, 1024)]  # 5.2 MB
    block = int8_block(shapes)
    assert [tuple(t.shape) for t in block] == shapes
    start = block[0].data_ptr()
    assert calls == [(start, 2 * HUGE, hugepages.MADV_HUGEPAGE)]
    assert start % HUGE == 0 and block[2].data_ptr() + block[2].numel() > (
        start + 2 * HUGE
    )  # the partial last 2 MB stays on 4 KB pages (no memory added)
    calls.clear()
    assert [t.numel() for t in int8_block([(1000, 2000)])] == [2_000_000]
    assert calls[0][1] == 0  # under 2 MB: nothing to advise


def test_int8_weights_elsewhere_than_the_cpu_get_no_block(monkeypatch):
    def no_block(shapes):
        raise AssertionError("int8_block called for meta weights")

    monkeypatch.setattr(quantize_module, "int8_block", no_block)
    linear = torch.nn.Linear(8, 4, bias=False, device="meta")
    assert quantize_module._slots([("x", linear)]) == {}


def test_madvise_is_not_called_off_linux(monkeypatch):
    def no_libc(*args, **kwargs):
        raise AssertionError("libc opened off Linux")

    monkeypatch.setattr(hugepages.sys, "platform", "darwin")
    monkeypatch.setattr(hugepages.ctypes, "CDLL", no_libc)
    hugepages.madvise(HUGE, HUGE, hugepages.MADV_HUGEPAGE)
    assert len(int8_block([(2048, 2048)])) == 1


def test_the_kernel_marks_the_block_for_huge_pages(madvised_huge_pages):
    block = int8_block([(4096, 2048)])  # 8 MB
    flags = vm_flags(block[0].data_ptr())
    assert flags is not None and "hg" in flags  # MADV_HUGEPAGE took
