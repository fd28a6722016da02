"""csrc/step_ops.c: the decode step's vectorised attention, RoPE, argmax and
int8 input quantisation give exactly the bits of their first, plain forms
(tests/fast/csrc/step_reference.c, in the test build), on inputs chosen to
reach every branch: slot counts that are not multiples of the 4 keys per
pass or the 8 lanes, head sizes with and without the pairwise path, odd
query heads per group, NaN, infinities, ties and signed zeros. (A NaN
result's sign is the one thing left open: which NaN operand x86 passes on
depends on the operand order the compiler picks for a commutative add, in
the plain form too.)"""

from __future__ import annotations

import pytest
import torch

import utils.fast.build as build

pytestmark = pytest.mark.skipif(
    build.unsupported_reason() is not None,
    reason="the decode step's C code needs x86-64 with AVX2, or AArch64",
)


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal bits, NaN where the other has NaN (of either sign)."""
    nan = want.isnan()
    if not torch.equal(got.isnan(), nan):
        return False
    return torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))


def bf16_bits(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).contiguous()


def both(fn):
    """fn(reference) for the plain (1) and the step's (0) form."""
    return fn(1), fn(0)


def cancelling(length: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """Values whose weighted sums over the slots depend on the order of the
    additions: huge values of alternating sign next to small ones (float32
    absorbs part of a small one into a large partial sum), so a reordered
    sum shows after rounding to bf16."""
    rows = torch.randn(length, d, generator=gen)
    rows[::2] += 2.0**30
    rows[1::2] -= 2.0**30
    rows[::3] *= 1e-3
    return rows


def cancelling_keys(length: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """Keys whose dot products with a query of ones depend on the order of
    the 8-column blocks: +2**20, small values, then -2**20 in each lane."""
    rows = torch.rand(length, d, generator=gen)
    rows[:, :8] = 2.0**20
    rows[:, 16:24] = -(2.0**20)
    return rows


@pytest.mark.parametrize("d", [16, 48, 64, 128])
@pytest.mark.parametrize("r", [1, 2, 3])
def test_attention_gives_the_plain_forms_bits(test_kernels, d, r):
    """Also where the step tells it which group comes next."""
    gen = torch.Generator().manual_seed(d * 10 + r)
    # 131 and 600: the values summed over several tiles of 64 slots, at 600
    # (d 128) each tile loaded first
    cases = [(n, "random") for n in (1, 3, 4, 7, 8, 9, 33, 200, 600)]
    cases += [(n, hard) for n in (9, 40, 131) for hard in ("values", "keys")]
    for length, kind in cases:
        q = (torch.randn(r * d, generator=gen) * 2).bfloat16().float()
        kc = bf16_bits(torch.randn(length, d, generator=gen) * 3)
        vc = bf16_bits(torch.randn(length, d, generator=gen))
        if kind == "values":  # even weights, order-sensitive sums of values
            kc, vc = bf16_bits(kc * 0), bf16_bits(cancelling(length, d, gen))
        elif kind == "keys" and d >= 24:  # order-sensitive scores
            q, kc = torch.ones(r * d), bf16_bits(cancelling_keys(length, d, gen))

        def run(reference, q=q, kc=kc, vc=vc, length=length):
            w = torch.zeros(r * length)
            out = torch.zeros(r * d)
            rc = test_kernels.lib.qwen3_test_attend(
                reference,
                q.data_ptr(),
                kc.data_ptr(),
                vc.data_ptr(),
                length,
                d,
                r,
                w.data_ptr(),
                out.data_ptr(),
            )
            assert rc == 0
            return out, w

        (want, want_w), (got, got_w) = both(run)
        assert same_bits(got, want) and same_bits(got_w, want_w), length
        assert want.abs().sum() > 0
        # told that another group comes next (its lines fetched meanwhile)
        got, got_w = run(2)
        assert same_bits(got, want) and same_bits(got_w, want_w), length


@pytest.mark.parametrize("d", [16, 32, 128])
def test_norm_rope_gives_the_plain_forms_bits(test_kernels, d):
    gen = torch.Generator().manual_seed(d)
    for scaled in (False, True):
        h = bf16_bits(torch.randn(d, generator=gen) * 5)
        h[3] = float("nan") if scaled else float("inf")
        scale = (1 + 0.1 * torch.randn(d, generator=gen)) if scaled else None
        angle = torch.rand(d, generator=gen) * 6
        cos, sin = angle.cos(), angle.sin()

        def run(reference, h=h, scale=scale, cos=cos, sin=sin):
            out = torch.zeros(d)
            rc = test_kernels.lib.qwen3_test_norm_rope(
                reference,
                h.data_ptr(),
                d,
                None if scale is None else scale.data_ptr(),
                1e-6,
                cos.data_ptr(),
                sin.data_ptr(),
                out.data_ptr(),
            )
            assert rc == 0
            return out

        want, got = both(run)
        assert same_bits(got, want), scaled


def argmax_cases(gen: torch.Generator) -> list[torch.Tensor]:
    nan, inf = float("nan"), float("inf")
    cases = [torch.randn(n, generator=gen) for n in (1, 5, 8, 9, 151936)]
    ties = torch.randn(1000, generator=gen)
    ties[[17, 400, 999]] = 9.0  # the first of equal maxima
    zeros = torch.tensor([-0.0, 0.0, -0.0, 0.0] * 5)
    low = torch.full((23,), -inf)
    with_nan = torch.randn(300, generator=gen)
    with_nan[[101, 250]] = nan
    late_nan = torch.randn(17, generator=gen)
    late_nan[16] = nan
    tail_max = torch.randn(19, generator=gen)
    tail_max[18] = 50.0
    first = torch.randn(40, generator=gen)
    first[0] = nan
    return cases + [
        ties,
        zeros,
        low,
        with_nan,
        late_nan,
        tail_max,
        first,
        torch.tensor([inf, -inf, inf]),
    ]


def test_argmax_gives_the_plain_forms_index_and_torchs(test_kernels):
    for v in argmax_cases(torch.Generator().manual_seed(0)):
        v = bf16_bits(v)
        want, got = both(
            lambda ref, v=v: test_kernels.lib.qwen3_test_argmax(
                ref, v.data_ptr(), v.numel()
            )
        )
        assert got == want, v
        assert got == int(torch.argmax(v))  # NaN first, then the first maximum


def test_int8_input_quantisation_gives_the_plain_forms_bits(test_kernels):
    gen = torch.Generator().manual_seed(1)
    xs = [
        torch.randn(k, generator=gen) * 10.0 ** float(e)
        for k, e in ((8, 0), (1024, -3), (3072, 3), (2048, 30))
    ]
    halves = torch.tensor([0.5, -0.5, 1.5, -2.5, 32767.0, 1.0, 0.0, -1.0])
    xs += [halves, torch.zeros(16), torch.full((24,), -1e-30)]
    for bad in (float("inf"), float("nan"), -float("inf")):
        x = torch.randn(64, generator=gen)
        x[33] = bad
        xs.append(x)
    for x in xs:

        def run(reference, x=x):
            qx = torch.zeros(x.numel() + 2, dtype=torch.int16)
            finite = test_kernels.lib.qwen3_test_quantize(
                reference, x.data_ptr(), x.numel(), qx.data_ptr()
            )
            return finite, qx

        (want_ok, want), (got_ok, got) = both(run)
        assert got_ok == want_ok == int(bool(x.isfinite().all()))
        assert torch.equal(got, want)  # the int16 values and the scale's bits


def test_bad_sizes_are_refused(test_kernels):
    lib = test_kernels.lib
    x = torch.zeros(64)
    assert lib.qwen3_test_attend(0, x.data_ptr(), None, None, 0, 16, 1, None, None) == 1
    assert lib.qwen3_test_norm_rope(0, None, 24, None, 1e-6, None, None, None) == 1
    assert lib.qwen3_test_argmax(0, None, 0) == -1
    assert lib.qwen3_test_quantize(0, x.data_ptr(), 12, None) == -1
