"""utils.cpu_matvec: the AVX2 decode kernels must give what F.linear gives.

References: float64 matrix-vector products, torch's own `F.linear`, and the
book's greedy generator on the same bf16 weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reasoning_from_scratch.ch02 import generate_text_basic_stream_cache as book_gen
from test_fast_decode import PROMPT, book_model, tiny_state_dict, tokens
from tiny import tiny_config

from utils import cpu_matvec
from utils.fast_decode import (
    FastQwen3,
    Int8Linear,
    decode_one_token,
    generate,
    prefill,
    quantize_int8,
)

kernels = cpu_matvec.get_kernels()
needs_kernel = pytest.mark.skipif(
    kernels is None, reason="the AVX2 kernel cannot be built on this machine"
)

# (rows, columns): remainders of the four-row groups, one and two threads'
# worth of rows, and the real model's shapes
SHAPES = [(1, 16), (3, 32), (7, 16), (1000, 64), (4099, 48), (3072, 1024),
          (1024, 3072), (151936, 1024)]  # fmt: skip


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of bfloat16 numbers around |x| (8 significant bits)."""
    exp = torch.floor(torch.log2(x.abs().clamp(min=1e-30)))
    return torch.exp2(exp - 7)


@needs_kernel
@pytest.mark.parametrize("n,k", SHAPES)
def test_fast_bf16_kernel_matches_float64_and_torch(n, k):
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(1, 1, k, generator=gen).to(torch.bfloat16)
    ref = F.linear(x.double(), w.double())
    # float32 activations and output: only the order of the additions differs
    got32 = kernels.matvec_bf16(x.float().reshape(-1), w)
    assert got32.dtype == torch.float32 and got32.shape == (n,)
    scale = (x.double().abs() @ w.double().abs().T).max()
    assert (got32.double() - ref.flatten()).abs().max() <= 1e-6 * scale
    # bf16 output (the operator compiled graphs call): within one rounding
    # of the exact value, and nearly always torch's very bits
    got = torch.ops.qwen3_ch02.matvec(x, w)
    assert got.dtype == torch.bfloat16 and got.shape == (1, 1, n)
    err = (got.double() - ref).abs()
    assert bool((err <= bf16_ulp(ref) + 1e-6 * scale).all())
    same = (got == F.linear(x, w)).float().mean()
    assert same >= 0.99


EXACT_SHAPES = [(1, 64), (7, 128), (1000, 64), (4099, 192), (2048, 1024),
                (1024, 3072), (151936, 1024)]  # fmt: skip


@needs_kernel
@pytest.mark.parametrize("n,k", EXACT_SHAPES)
def test_eager_kernel_is_bit_identical_to_torch(n, k):
    gen = torch.Generator().manual_seed(n * k)
    for trial in range(3):
        w = (torch.randn(n, k, generator=gen) * 10**trial).to(torch.bfloat16)
        x = torch.randn(1, 1, k, generator=gen).to(torch.bfloat16)
        got = cpu_matvec.linear(x, w)  # eager: the exact kernel
        assert torch.equal(got, F.linear(x, w))
    assert torch.equal(
        kernels.matvec_bf16_exact(x.reshape(-1), w), F.linear(x, w)[0, 0]
    )


@needs_kernel
@pytest.mark.parametrize("n,k", [(5, 16), (1000, 64), (3072, 1024)])
def test_int8_kernel_matches_dequantized_reference(n, k):
    gen = torch.Generator().manual_seed(n)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, generator=gen) + 0.01
    x = torch.randn(1, k, generator=gen)
    ref = (x.double() @ w.double().T) * scales.double()
    got = cpu_matvec.int8_linear(x, w, scales)
    assert got.dtype == torch.float32 and got.shape == (1, n)
    bound = (x.double().abs() @ w.double().abs().T) * scales.double()
    assert bool(((got.double() - ref).abs() <= 1e-5 * bound.max()).all())
    got16 = cpu_matvec.int8_linear(x.bfloat16(), w, scales)
    ref16 = (x.bfloat16().double() @ w.double().T) * scales.double()
    err = (got16.double() - ref16).abs()
    assert bool((err <= bf16_ulp(ref16) + 1e-5 * bound.max()).all())


def test_shapes_the_kernel_does_not_take_use_torch():
    w = torch.randn(32, 24, dtype=torch.bfloat16)  # 24 columns: not 16k
    x = torch.randn(1, 24, dtype=torch.bfloat16)
    assert not cpu_matvec.supports(x, w)
    assert torch.equal(cpu_matvec.linear(x, w), F.linear(x, w))
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    x2 = torch.randn(2, 64, dtype=torch.bfloat16)  # two rows: a matmul
    assert not cpu_matvec.supports(x2, w)
    assert torch.equal(cpu_matvec.linear(x2, w), F.linear(x2, w))
    assert not cpu_matvec.supports(x2[:1], w.t())  # not contiguous
    with pytest.raises(ValueError, match="one CPU row"):
        cpu_matvec.int8_linear(x2, w.to(torch.int8), torch.ones(32))


@needs_kernel
def test_build_is_cached_and_leaves_only_the_library(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN3_KERNEL_CACHE", str(tmp_path))
    path = cpu_matvec._build(tmp_path)
    assert list(tmp_path.iterdir()) == [path]  # no temporary files left
    mtime = path.stat().st_mtime_ns
    assert cpu_matvec._build(tmp_path) == path
    assert path.stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_no_compiler_means_torch_matmul_with_one_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QWEN3_KERNEL_CACHE", str(tmp_path / "fresh"))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to find here
    assert cpu_matvec.get_kernels() is None
    assert cpu_matvec.get_kernels() is None
    out = capsys.readouterr().out
    assert out.count("cpu_matvec: using torch's matmul") == 1
    if cpu_matvec._unsupported_reason() is None:
        assert "no C compiler found" in out
    assert not (tmp_path / "fresh").exists() or not any((tmp_path / "fresh").iterdir())
    # A model built now generates with torch's matmul, the same tokens
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    fast = FastQwen3.from_state_dict(cfg, tiny_state_dict(cfg=cfg))
    got = tokens(generate(fast, PROMPT, 10))
    assert not fast.cpu_matvec_active()
    monkeypatch.undo()
    if kernels is not None:
        assert tokens(generate(fast, PROMPT, 10)) == got
        assert fast.cpu_matvec_active()


@needs_kernel
def test_bf16_model_with_kernel_gives_the_books_tokens():
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(cfg=cfg)
    book = book_model(sd, cfg)
    fast = FastQwen3.from_book_model(book)
    want = tokens(book_gen(book, PROMPT, 40))
    assert len(set(want[0])) > 5
    assert tokens(generate(fast, PROMPT, 40)) == want
    assert fast.cpu_matvec_active()
    assert not fast.use_cpu_matvec(False)
    assert tokens(generate(fast, PROMPT, 40)) == want
    assert not fast.cpu_matvec_active()
    assert fast.use_cpu_matvec(True)


@needs_kernel
def test_compiled_decode_calls_the_kernel_and_matches_eager(monkeypatch):
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(1, cfg)
    want = tokens(generate(FastQwen3.from_state_dict(cfg, sd), PROMPT, 20))
    fast = FastQwen3.from_state_dict(cfg, sd).compile_decode()
    calls = []
    real = cpu_matvec._matvec_impl

    def counting(x, w):  # the registered operator calls this per call
        calls.append(1)
        return real(x, w)

    monkeypatch.setattr(cpu_matvec, "_matvec_impl", counting)
    assert tokens(generate(fast, PROMPT, 20)) == want
    assert fast.decode_compiled() and fast.cpu_matvec_active()
    # 19 compiled decode steps x (2 layers x 7 linear layers + the head)
    assert len(calls) >= 19 * 15


@needs_kernel
def test_int8_model_uses_the_kernel_and_stays_close():
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(2, cfg)
    fast = FastQwen3.from_state_dict(cfg, sd)
    q = quantize_int8(FastQwen3.from_state_dict(cfg, sd))
    assert isinstance(q.out_head, Int8Linear)
    assert q.out_head.scales.dtype == torch.float32
    x = torch.randn(1, 1, cfg["emb_dim"]).bfloat16()
    head = q.out_head
    ref = F.linear(x.float(), head.weight_int8.float() * head.scales[:, None])
    q.use_cpu_matvec(True)
    assert q.out_head.matvec
    with_kernel = q.out_head(x)
    q.use_cpu_matvec(False)
    without = q.out_head(x)
    assert (with_kernel.float() - ref).abs().max() <= 0.02 * ref.abs().max()
    assert (without.float() - ref).abs().max() <= 0.02 * ref.abs().max()
    q.use_cpu_matvec(True)
    seq = tokens(generate(fast, PROMPT, 30))[0]
    assert greedy_picks(fast, seq) == seq
    agree = sum(a == b for a, b in zip(greedy_picks(q, seq), seq, strict=True))
    assert agree >= 24  # teacher-forced top-1: most steps, int8 is approximate
    assert q.cpu_matvec_active()


def greedy_picks(model: FastQwen3, seq: list[int]) -> list[int]:
    """The model's greedy choice at each step when fed PROMPT + seq."""
    model.setup_cache(1, PROMPT.shape[1] + len(seq))
    tok, _ = prefill(model, PROMPT)
    picks = [int(tok)]
    pos = torch.tensor([PROMPT.shape[1]])
    for t in seq[:-1]:
        tok, _ = decode_one_token(model, torch.tensor([[t]]), pos, int(pos) + 1)
        picks.append(int(tok))
        pos = pos + 1
    return picks


def test_kernel_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("QWEN3_KERNEL_CACHE", str(tmp_path))
    assert cpu_matvec.kernel_cache_dir() == tmp_path
    monkeypatch.delenv("QWEN3_KERNEL_CACHE")
    assert cpu_matvec.kernel_cache_dir() == Path.home() / ".cache/qwen3-ch02/kernels"
    assert os.fspath(cpu_matvec.kernel_cache_dir()).endswith("kernels")
