"""utils.fast.kernels: the decode kernels compute exactly what their C code
documents, and eager `linear` uses the exact kernel exactly where torch's
own `F.linear` would add the same way, so eager results are `F.linear`'s.

The exactness references are float32 sums emulated here in the order each
kernel documents (an exactly rounded fused multiply-add, then the documented
reduction tree), so they hold whichever path PyTorch's own matmul takes.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from reasoning_from_scratch.ch02 import generate_text_basic_stream_cache as book_gen

import utils.fast.kernels as kernels_mod
from tests.tiny import (
    PROMPT,
    book_model,
    fast_model,
    skip_if_inductor_cannot_build,
    tiny_config,
    tiny_state_dict,
    tokens,
)
from utils.fast import (
    FastQwen3,
    Int8Linear,
    decode_one_token,
    generate,
    prefill,
    quantize_int8,
)
from utils.fast.kernels import TorchCPU, bf16_gemv_path
from utils.fast.model import KernelLinear, project

# ---------------------------------------------------------------------------
# Emulated references: the kernels' documented float32 summation orders
# ---------------------------------------------------------------------------


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fma(a, b, c), rounded once (a*b must be exact in float64)."""
    p, c64 = a.double() * b.double(), c.double()
    hi = c64 + p
    back = hi - c64
    lo = (c64 - (hi - back)) + (p - back)  # hi + lo == c + a*b exactly
    r = hi.float()
    inf = torch.full_like(r, float("inf"))
    side = torch.where(hi > r.double(), inf, -inf)
    other = torch.nextafter(r, side)  # the float32 on hi's other side
    tie = ((r.double() + other.double()) / 2 == hi) & (lo != 0)
    nearer = torch.where(lo > 0, torch.maximum(r, other), torch.minimum(r, other))
    return torch.where(tie, nearer, r)


def lanes(v: torch.Tensor) -> torch.Tensor:
    """The kernels' horizontal sum of 8 float32 lanes (last dim)."""
    return ((v[:, 0] + v[:, 4]) + (v[:, 2] + v[:, 6])) + (
        (v[:, 1] + v[:, 5]) + (v[:, 3] + v[:, 7])
    )


ORDER16 = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


def reference(x: torch.Tensor, w: torch.Tensor, kind: str, scales=None):
    """What kernel `kind` ("exact", "fast", "int8") returns for rows `w`."""
    x32 = x.float()
    width = 64 if kind == "exact" else 16
    cols = list(range(width)) if kind != "fast" else ORDER16
    acc = torch.zeros(w.shape[0], width)
    for start in range(0, w.shape[1], width):
        idx = [start + c for c in cols]
        acc = fma32(x32[idx], w[:, idx], acc)
    if kind == "exact":  # 8 accumulators of 8 lanes, folded pairwise
        s = list(acc.view(-1, 8, 8).unbind(1))
        for i in range(4):
            s[i] = s[i] + s[i + 4]
        for i in range(2):
            s[i] = s[i] + s[i + 2]
        total = lanes(s[0] + s[1])
    else:  # two accumulators of 8 lanes
        total = lanes(acc[:, :8] + acc[:, 8:])
    if scales is not None:
        total = total * scales
    return total.to(x.dtype)


def int8_reference(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor):
    """What the int8 kernel returns: x rounded to int16 with one float32
    scale, exact int32 lane sums (lane j: columns 2j, 2j+1 of each 16),
    converted to float32 and added every 1024 columns, lanes summed, then
    times the x scale and the row scales."""
    x32 = x.float()
    amax = x32.abs().max()
    inv = torch.tensor(32767.0) / amax
    qx = torch.round(x32 * inv).clamp(-32767, 32767).long()
    xs = amax / torch.tensor(32767.0)
    prod = w.long() * qx  # (n, k), exact
    f = torch.zeros(w.shape[0], 8)
    for c in range(0, w.shape[1], 1024):
        chunk = prod[:, c : c + 1024].reshape(w.shape[0], -1, 8, 2)
        f = f + chunk.sum(dim=(1, 3)).float()
    return ((lanes(f) * xs) * scales).to(x.dtype)


def rows_to_check(n: int) -> torch.Tensor:
    """All rows, or a sample of 3,000 (the reference is slow in Python)."""
    if n <= 3000:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(n))[:3000]


# (rows, columns): remainders of the four-row groups, one and two threads'
# worth of rows, and the real model's shapes (its output head with the slow
# tests)
HEAD = pytest.param(151936, 1024, marks=pytest.mark.slow)
SHAPES = [(1, 64), (3, 128), (7, 64), (1000, 64), (4099, 192), (3072, 1024),
          (1024, 3072), HEAD]  # fmt: skip


@pytest.mark.parametrize("n,k", SHAPES)
def test_bf16_kernels_match_their_documented_sums(kernels, n, k):
    gen = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=gen) * 3).to(torch.bfloat16)
    rows = rows_to_check(n)
    for x_dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(k, generator=gen).to(x_dtype)
        for kind in ("exact", "fast"):
            got = kernels.matvec(x, [w], exact=kind == "exact")
            assert got.dtype == x_dtype and got.shape == (n,)
            want = reference(x, w[rows], kind)
            assert torch.equal(got[rows], want), (kind, x_dtype)
    # and both are correctly computed dot products (float64 check)
    ref = w.double() @ x.double()
    bound = 1e-5 * (w.double().abs() @ x.double().abs()).max()
    assert (got.double() - ref).abs().max() <= bound


@pytest.mark.parametrize("n,k", [(5, 16), (1000, 64), (3072, 1024), (7, 3072)])
def test_int8_kernel_matches_its_documented_sums(kernels, n, k):
    gen = torch.Generator().manual_seed(n)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, generator=gen) + 0.01
    for x_dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, k, generator=gen).to(x_dtype)
        (got,) = kernels_mod.linear(x, [w], [scales])
        assert got.dtype == x_dtype and got.shape == (1, n)
        assert torch.equal(got[0], int8_reference(x[0], w, scales))
    # and close to the float product of the same weights (x's 16-bit rounding)
    ref = (w.double() @ x[0].double()) * scales.double()
    bound = 1e-4 * ((w.double().abs() @ x[0].double().abs()) * scales).max()
    assert (got[0].double() - ref).abs().max() <= bound + 1e-2 * ref.abs().max() * (
        x_dtype == torch.bfloat16
    )


@pytest.mark.parametrize("sizes", [(2048, 1024, 1024), (5, 1000, 3), (3072, 3072)])
def test_grouped_call_equals_one_call_per_matrix(kernels, sizes):
    """matvec of a group: the same bits as one call per weight, concatenated,
    whichever thread gets which rows (the split crosses matrix borders)."""
    gen = torch.Generator().manual_seed(sum(sizes))
    k = 1024
    x = torch.randn(k, generator=gen).to(torch.bfloat16)
    ws = [torch.randn(n, k, generator=gen).to(torch.bfloat16) for n in sizes]
    for exact in (False, True):
        got = kernels.matvec(x, ws, exact=exact)
        want = torch.cat([kernels.matvec(x, [w], exact=exact) for w in ws])
        assert torch.equal(got, want)
    qs = [
        torch.randint(-127, 128, w.shape, generator=gen, dtype=torch.int8) for w in ws
    ]
    ss = [torch.rand(n, generator=gen) for n in sizes]
    got = kernels.matvec(x, qs, ss)
    assert torch.equal(
        got,
        torch.cat([kernels.matvec(x, [q], [s]) for q, s in zip(qs, ss, strict=True)]),
    )
    pieces = kernels_mod.linear(x.view(1, k), qs, ss)
    assert [p.shape for p in pieces] == [(1, n) for n in sizes]
    for piece, q, s in zip(pieces, qs, ss, strict=True):
        assert torch.equal(piece, kernels_mod.linear(x.view(1, k), [q], [s])[0])
    with pytest.raises(ValueError, match="scales"):
        kernels.matvec(x, qs, ss[:1])
    with pytest.raises(ValueError, match="dtype"):
        kernels.matvec(x, [ws[0], qs[0]])


def test_int8_kernel_propagates_nan_and_inf(kernels):
    """A non-finite input must not vanish in the fixed-point rounding."""
    w = torch.ones(8, 64, dtype=torch.int8)
    scales = torch.ones(8)
    for bad in (float("nan"), float("inf")):
        x = torch.ones(64)
        x[3] = bad
        got = kernels.matvec(x, [w], [scales])
        assert not torch.isfinite(got).any()
    assert torch.equal(kernels.matvec(torch.zeros(64), [w], [scales]), torch.zeros(8))


def test_several_rows_of_int8_layers_take_the_multi_row_kernel(kernels, monkeypatch):
    """The layers' entry sends several rows of x (a prompt) with int8
    weights to the multi-row kernel set by `use_rows_kernel`: each row the
    bits of that row as a decode row; with none set, or bf16 weights,
    torch runs them."""
    gen = torch.Generator().manual_seed(3)
    ws = [torch.randint(-127, 128, (n, 64), dtype=torch.int8, generator=gen)
          for n in (40, 24)]  # fmt: skip
    scales = [torch.rand(n, generator=gen) + 0.01 for n in (40, 24)]
    x = torch.randn(1, 7, 64, generator=gen).bfloat16()
    monkeypatch.setitem(kernels_mod._LOADED, "int8_mm", None)
    assert kernels_mod.linear(x, ws, scales) is None
    kernels_mod.use_rows_kernel(kernels.first["int8_mm"])
    q, k = kernels_mod.linear(x, ws, scales)
    assert q.shape == (1, 7, 40) and k.shape == (1, 7, 24)
    for t in range(7):
        q1, k1 = kernels_mod.linear(x[:, t : t + 1], ws, scales)  # decode rows
        assert torch.equal(q[:, t].view(torch.int16), q1[:, 0].view(torch.int16))
        assert torch.equal(k[:, t].view(torch.int16), k1[:, 0].view(torch.int16))
    assert kernels_mod.linear(x, [torch.zeros(8, 64).bfloat16()]) is None


def test_wrong_operands_raise_clear_errors(kernels, monkeypatch):
    w = torch.randint(-127, 128, (1000, 64), dtype=torch.int8)
    x = torch.randn(1, 64)
    with pytest.raises(ValueError, match=r"scales must be .*\(1000,\)"):
        kernels.matvec(x[0], [w], [torch.ones(1)])
    with pytest.raises(ValueError, match="contiguous"):
        kernels.matvec(x[0], [w], [torch.ones(1000, 2)[:, 0]])
    # the layers' entry leaves what the kernel cannot take to torch
    assert kernels_mod.linear(x, [w], [torch.ones(1)]) is None
    monkeypatch.setitem(kernels_mod._LOADED, "int8_mm", kernels.first["int8_mm"])
    assert kernels_mod.linear(torch.randn(2, 64), [w], [torch.ones(1)]) is None
    with pytest.raises(ValueError, match="matmul takes x"):
        kernels.matmul(torch.randn(64), [w], [torch.ones(1000)])
    with pytest.raises(ValueError, match="scales must be"):
        kernels.matvec(x[0], [w], [torch.ones(1000, dtype=torch.float64)])
    wb = torch.randn(32, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"x must be \(64,\)"):
        kernels.matvec(torch.randn(32), [wb])
    with pytest.raises(ValueError, match="contiguous"):
        kernels.matvec(torch.randn(64, 2)[:, 0], [wb])
    with pytest.raises(ValueError, match="multiple of 64"):
        kernels.matvec(torch.randn(48), [torch.zeros(4, 48).bfloat16()], exact=True)
    with pytest.raises(ValueError, match="bf16 weight"):
        kernels.matvec(torch.randn(64), [torch.zeros(4, 64)])


def layer(weight: torch.Tensor) -> KernelLinear:
    """A bias-free KernelLinear holding `weight`, set to use the kernel."""
    m = KernelLinear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    m.weight = torch.nn.Parameter(weight, requires_grad=False)
    m.use_kernel = True
    return m


def test_shapes_the_kernel_does_not_take_use_torch(kernels):
    w = torch.randn(32, 24, dtype=torch.bfloat16)  # 24 columns: not 16k
    x = torch.randn(1, 24, dtype=torch.bfloat16)
    assert kernels_mod.linear(x, [w]) is None
    assert torch.equal(layer(w)(x), F.linear(x, w))
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    x2 = torch.randn(2, 64, dtype=torch.bfloat16)  # two rows: a matmul
    assert kernels_mod.linear(x2, [w]) is None
    assert torch.equal(layer(w)(x2), F.linear(x2, w))
    assert kernels_mod.linear(x2[:1], [w.t()]) is None  # not contiguous


# ---------------------------------------------------------------------------
# When eager code may use the exact kernel: what torch itself would run
# ---------------------------------------------------------------------------

ATEN = "aten-avx2"
# CPUs as torch 2.10 sees them (see kernels.bf16_gemv_path)
ZEN4 = TorchCPU((2, 10), True, True, True, False, "AVX512")  # AVX-512 BF16
SKYLAKE_X = TorchCPU((2, 10), True, True, False, False, "AVX512")  # no BF16
EPYC_AVX2 = TorchCPU((2, 10), True, False, False, False, "AVX2")
ZEN4_AVX2 = TorchCPU((2, 10), True, True, True, False, "AVX2")  # capability avx2
ZEN4_DEFAULT = TorchCPU((2, 10), True, True, True, False, "DEFAULT")
OPENBLAS = TorchCPU((2, 10), False, False, False, True, "AVX2")
NO_MKLDNN = TorchCPU((2, 10), False, False, True, False, "AVX512")
TORCH_2_9 = TorchCPU((2, 9), True, False, False, False, "AVX2")

# (rows, cols) of every matrix the 0.6B model multiplies one row with, and
# of the tiny test model, around oneDNN's 16**3 threshold
MODEL_SHAPES = [(2048, 1024), (1024, 1024), (1024, 2048), (3072, 1024),
                (1024, 3072), (151936, 1024)]  # fmt: skip
SMALL_SHAPES = [(64, 64), (32, 128), (64, 65)]


@pytest.mark.parametrize(
    "cpu,mkldnn,shape,path",
    [
        (ZEN4, True, (3072, 1024), "onednn"),
        (ZEN4, True, (64, 64), "aten-avx2"),  # 4096 products: below the cut
        (ZEN4, True, (64, 65), "onednn"),
        (ZEN4, False, (3072, 1024), "aten-avx2"),
        (ZEN4_AVX2, True, (3072, 1024), "onednn"),  # oneDNN ignores ATen's
        (ZEN4_AVX2, False, (3072, 1024), "aten-avx2"),
        (SKYLAKE_X, True, (3072, 1024), "aten-avx2"),  # the gemv bypass
        (EPYC_AVX2, True, (151936, 1024), "aten-avx2"),
        (ZEN4_DEFAULT, False, (3072, 1024), "aten-default"),
        (ZEN4_DEFAULT, True, (3072, 1024), "onednn"),
        (OPENBLAS, True, (3072, 1024), "openblas"),
        (NO_MKLDNN, True, (3072, 1024), "aten-avx2"),
        (TORCH_2_9, True, (3072, 1024), "unverified"),
    ],
)
def test_gemv_path_follows_torchs_dispatch(cpu, mkldnn, shape, path):
    assert bf16_gemv_path(*shape, mkldnn_enabled=mkldnn, cpu=cpu) == path


@pytest.mark.parametrize("cpu", [ZEN4, SKYLAKE_X, EPYC_AVX2, ZEN4_DEFAULT, TORCH_2_9])
def test_eager_linear_uses_the_kernel_where_the_decision_says(
    kernels, monkeypatch, exact_calls, cpu
):
    """Injected CPUs: the exact kernel runs for a shape iff the decision is
    ATen's AVX2 dot (bits are not compared: torch here is not that CPU)."""
    monkeypatch.setattr(kernels_mod, "torch_cpu", lambda: cpu)
    calls = exact_calls
    for rows, cols in [(3072, 1024), (64, 64), (64, 128)]:
        w = torch.randn(rows, cols).bfloat16()
        layer(w)(torch.randn(1, 1, cols).bfloat16())
        project(torch.randn(1, cols).bfloat16(), [layer(w), layer(w[:8])])
        exact = [r for r in (rows, 8) if bf16_gemv_path(r, cols, cpu=cpu) == ATEN]
        # one call for the layer; the group in one call where both are
        # exact, else layer by layer (each only where exact)
        group = [rows + 8] if len(exact) == 2 else exact
        assert calls == exact[:1] * (rows in exact) + group, (rows, cols)
        calls.clear()


@pytest.mark.heavy_under_emulation
@pytest.mark.parametrize("mkldnn", [True, False], ids=["as-is", "mkldnn-off"])
def test_eager_linear_gives_torchs_bits_on_every_cpu(kernels, exact_calls, mkldnn):
    """On this machine, at every shape the models use: the kernel is used
    exactly where the decision says torch adds like it, and the results are
    F.linear's bits either way (with oneDNN as it is, and switched off)."""
    calls = exact_calls
    gen = torch.Generator().manual_seed(5)
    with torch.backends.mkldnn.flags(enabled=mkldnn), torch.inference_mode():
        for rows, cols in MODEL_SHAPES + SMALL_SHAPES:
            decided = bf16_gemv_path(rows, cols) == ATEN
            w = torch.randn(rows, cols, generator=gen).to(torch.bfloat16)
            for trial in range(1 if rows > 100_000 else 3):
                x = torch.randn(1, 1, cols, generator=gen).to(torch.bfloat16)
                x = x * 10**trial
                assert torch.equal(layer(w)(x), F.linear(x, w))
            used = cols % 64 == 0 and decided
            assert bool(calls) is used, (rows, cols, decided)
            calls.clear()


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cpu", [None, ZEN4, EPYC_AVX2], ids=["here", "zen4", "avx2"])
def test_bf16_model_with_kernel_gives_the_books_tokens(kernels, monkeypatch, cpu):
    """None: as decided here; injected: as torch would run on those CPUs
    (the tiny model's greedy tokens do not hinge on the last bit)."""
    if cpu is not None:
        monkeypatch.setattr(kernels_mod, "torch_cpu", lambda: cpu)
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(cfg=cfg)
    book = book_model(sd, cfg)
    fast = FastQwen3.from_book_model(book)
    want = tokens(book_gen(book, PROMPT, 40))
    assert len(set(want[0])) > 5
    assert tokens(generate(fast, PROMPT, 40)) == want
    assert fast.out_head.use_kernel
    assert not fast.use_cpu_matvec(False)
    assert tokens(generate(fast, PROMPT, 40)) == want
    assert not fast.out_head.use_kernel
    assert fast.use_cpu_matvec(True)


@pytest.mark.slow  # an inductor compile
def test_compiled_decode_calls_the_kernel_and_matches_eager(kernels, monkeypatch):
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(1, cfg)
    want = tokens(generate(fast_model(cfg, sd), PROMPT, 20))
    fast = fast_model(cfg, sd).compile_decode()
    calls = []
    loaded = kernels_mod._LOADED["kernels"]  # what the operators call
    real = loaded.matvec

    def counting(x, ws, *args, **kwargs):
        calls.append(len(ws))
        return real(x, ws, *args, **kwargs)

    monkeypatch.setattr(loaded, "matvec", counting)
    assert tokens(generate(fast, PROMPT, 20)) == want
    skip_if_inductor_cannot_build(fast.decode_compiled())
    assert fast.decode_compiled() and fast.out_head.use_kernel
    # 19 compiled decode steps x (2 layers x (q/k/v, out, gate/up, down)
    # + the head): 9 kernel calls covering 15 matrices
    assert len(calls) >= 19 * 9 and sum(calls) >= 19 * 15
    assert calls.count(3) >= 19 * 2 and calls.count(2) >= 19 * 2


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


def test_int8_model_uses_the_kernel_and_stays_close(kernels):
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(2, cfg)
    fast = fast_model(cfg, sd)
    q = quantize_int8(fast_model(cfg, sd))
    assert isinstance(q.out_head, Int8Linear)
    assert q.out_head.scales.dtype == torch.float32
    x = torch.randn(1, 1, cfg["emb_dim"]).bfloat16()
    head = q.out_head
    ref = F.linear(x.float(), head.weight_int8.float() * head.scales[:, None])
    q.use_cpu_matvec(True)
    assert q.out_head.use_kernel
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
    assert q.out_head.use_kernel
