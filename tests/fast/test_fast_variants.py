"""utils.fast.variants and csrc/variants.c: every kernel variant this CPU can
execute computes what its class promises (exact and int8: the bits of the
default AVX2 kernel; fast: within float32's error bound), alone, grouped and
inside whole decode steps; variants the CPU lacks the instructions for are
reported as skipped (compiled into the library, never executed here), and
the C side refuses to run them rather than crash."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
import torch

import utils.fast.build as build
import utils.fast.variants as variants_mod
from tests.tiny import PROMPT, tiny_config, tiny_state_dict, tokens
from utils.fast import FastQwen3, generate, get_kernels, quantize_int8
from utils.fast.variants import (
    CLASSES,
    Variant,
    check_variant,
    cpu_features,
    default_variant,
    usable_variants,
    variant_table,
)

pytestmark = pytest.mark.skipif(
    build.unsupported_reason() is not None,
    reason="the kernel variants need an x86-64 CPU with AVX2",
)
BF16 = tiny_config(context_length=512, dtype=torch.bfloat16)


def _table() -> tuple[Variant, ...]:
    kernels = get_kernels()
    return variant_table(kernels) if kernels is not None else ()


def every_variant():
    """One parameter per variant of the library; those this CPU cannot
    execute are skipped with the instructions it lacks."""
    kernels = get_kernels()
    have = cpu_features(kernels) if kernels is not None else frozenset()
    for v in _table():
        lacks = sorted(v.needs - have)
        marks = []
        if lacks:
            why = f"{v.name}: this CPU lacks {'+'.join(lacks)} (compiled, not executed)"
            marks = [pytest.mark.skip(reason=why)]
        yield pytest.param(v, id=v.name, marks=marks)


# (k, rows of the matrices sharing x): leftovers of the four-row passes,
# several int8 chunks, the real model's shapes
SHAPES = [
    (1024, (2048, 1024, 1024)),
    (2048, (1024,)),
    (3072, (37, 6)),
    (1024, (5,)),
    (192, (130, 3)),
    (64, (1,)),
]


def problem(cls: str, k: int, rows: tuple[int, ...], gen: torch.Generator):
    if cls == "int8":
        ws = [
            torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
            for n in rows
        ]
        ws[0][0, :] = -127  # the largest sums
        scales = [torch.rand(n, generator=gen) * 0.01 + 1e-4 for n in rows]
        return torch.randn(k, generator=gen), ws, scales
    ws = [(torch.randn(n, k, generator=gen) * 0.05).bfloat16() for n in rows]
    ws[0][0, :5] = torch.tensor([3e4, -1e-3, 7.0, 1e-6, -3e4]).bfloat16()
    x = (torch.randn(k, generator=gen) * 2).bfloat16().float()  # bf16 values
    return x, ws, None


def within_float32_bound(got, x, ws) -> bool:
    w = torch.cat(ws).double()
    k = w.shape[1]
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    bound = gamma * (w.abs() @ x.double().abs())
    return bool(((got.double() - w @ x.double()).abs() <= bound).all())


@pytest.mark.parametrize("variant", list(every_variant()))
@pytest.mark.parametrize("threads", [1, 2])
def test_every_variant_computes_what_its_class_promises(kernels, variant, threads):
    gen = torch.Generator().manual_seed(variant.index * 10 + threads)
    for k, rows in SHAPES:
        if k % variant.kmul:
            continue
        x, ws, scales = problem(variant.cls, k, rows, gen)
        for out in (torch.float32, torch.bfloat16):
            got = kernels.matvec_variant(variant.index, x.to(out), ws, scales, threads)
            assert got.shape == (sum(rows),) and got.dtype == out
            if variant.cls == "fast":
                assert out != torch.float32 or within_float32_bound(got, x, ws)
                continue
            want = kernels.matvec_multi(x.to(out), ws, scales, exact=True)
            view = torch.int32 if out == torch.float32 else torch.int16
            assert torch.equal(got.view(view), want.view(view)), (k, rows, out)
    if variant.cls == "int8":  # an inf in x: the float32 kernel, as the default
        x[7] = math.inf
        got = kernels.matvec_variant(variant.index, x, ws, scales, threads)
        want = kernels.matvec_multi(x, ws, scales)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got[~want.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("variant", list(every_variant()))
def test_a_thread_that_starts_late_has_its_passes_taken_same_bits(kernels, variant):
    """With the second thread held back 20 ms at the start of each product,
    the first takes the passes left at the back of its share (run in
    matvec.c): every row is still computed once, with the bits of one
    thread alone."""
    gen = torch.Generator().manual_seed(variant.index)
    for k, rows in SHAPES[:3]:
        if k % variant.kmul:
            continue
        x, ws, scales = problem(variant.cls, k, rows, gen)
        alone = kernels.matvec_variant(variant.index, x, ws, scales, 1)
        kernels.lib.qwen3_stolen_passes(20_000)
        try:
            late = kernels.matvec_variant(variant.index, x, ws, scales, 2)
        finally:
            stolen = kernels.lib.qwen3_stolen_passes(0)
        assert torch.equal(late.view(torch.int32), alone.view(torch.int32)), k
        assert stolen > 0, (k, rows)


def test_the_table_has_the_defaults_first_and_the_avx512_forms(kernels):
    table = variant_table(kernels)
    assert [default_variant(table, c).name for c in CLASSES] == [
        "bf16_exact_avx2",
        "bf16_fast_avx2",
        "int8_avx2",
    ]
    names = {v.name: v for v in table}
    assert names["bf16_exact_avx512"].needs == {"avx2", "avx512"}
    for name in ("bf16_exact_avx512_xb", "bf16_exact_avx512_xb_s2"):
        assert names[name].needs == {"avx2", "avx512"}
        assert names[name].cls == "exact"
    assert names["bf16_fast_avx512bf16"].needs >= {"avx512", "avx512_bf16"}
    assert names["int8_avx512vnni"].needs >= {"avx512", "avx512_vnni"}
    assert names["int8_avx512vnni_s2"].needs >= {"avx512", "avx512_vnni"}
    assert names["int8_avx512vnni_s2_nta"].needs >= {"avx512", "avx512_vnni"}
    assert names["int8_avx2_s2_nta"].needs == {"avx2"}
    assert [v.index for v in table] == list(range(len(table)))


def test_cpu_features_agree_with_the_kernel_of_the_os(kernels):
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo to compare with")
    line = next(ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags"))
    flags = set(line.split(":", 1)[1].split())
    want = {"avx2"} if {"avx2", "fma"} <= flags else set()
    if want and {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        want.add("avx512")
        want |= {n for n in ("avx512_bf16", "avx512_vnni") if n in flags}
    assert cpu_features(kernels) == want


@contextlib.contextmanager
def cpu_limited_to(kernels, names: set[str]):
    """The library acting as if the CPU had only `names` (it never adds)."""
    bits = kernels.lib.qwen3_cpu_feature_names().decode().split(",")
    mask = sum(1 << i for i, n in enumerate(bits) if n in names)
    kernels.lib.qwen3_limit_cpu_features(mask)
    try:
        yield
    finally:
        kernels.lib.qwen3_limit_cpu_features(-1)


def test_the_library_refuses_a_variant_the_cpu_lacks(kernels):
    table = variant_table(kernels)
    wide = [
        v for v in table if "avx512" in v.needs and v.needs <= cpu_features(kernels)
    ]
    if not wide:
        pytest.skip("this CPU runs no AVX-512 variant")
    exact = next((v for v in wide if v.cls == "exact"), None)
    model = FastQwen3.from_state_dict(BF16, tiny_state_dict(3, BF16))
    if exact is not None:
        assert model.use_native_step(variants=exact.name)
    with cpu_limited_to(kernels, {"avx2"}):
        assert cpu_features(kernels) == {"avx2"}
        for v in wide:
            x, ws, scales = problem(v.cls, 1024, (8,), torch.Generator())
            with pytest.raises(RuntimeError, match="code 3"):
                kernels.matvec_variant(v.index, x, ws, scales)
        if exact is not None:  # the step checks too: an error, not SIGILL
            with pytest.raises(RuntimeError, match="cannot run its kernel"):
                tokens(generate(model, PROMPT, 3))
    assert cpu_features(kernels) >= {"avx2", "avx512"}


def test_wrong_k_or_index_is_an_error_not_a_crash(kernels):
    table = variant_table(kernels)
    exact = default_variant(table, "exact")
    x, ws, _ = problem("exact", 80, (4,), torch.Generator())  # 80 % 64 != 0
    with pytest.raises(RuntimeError, match="code 1"):
        kernels.matvec_variant(exact.index, x, ws)
    x, ws, scales = problem("int8", 64, (4,), torch.Generator())
    for index in (-1, len(table), exact.index):  # none, or not an int8 one
        with pytest.raises(RuntimeError, match="code 1"):
            kernels.matvec_variant(index, x, ws, scales)


def test_an_exact_variant_taking_x_as_bf16_refuses_an_x_it_would_round(kernels):
    """The `_xb` variants hold x as bf16: exact for the step's x, which
    always holds bf16 values, and refused (code 1) for a float32 x they
    would round, rather than returning other bits."""
    have = cpu_features(kernels)
    table = variant_table(kernels)
    xb = [v for v in table if v.name.startswith("bf16_exact_avx512_xb")]
    if not xb or not xb[0].needs <= have:
        pytest.skip("this CPU runs no AVX-512 variant")
    x, ws, _ = problem("exact", 1024, (8, 3), torch.Generator().manual_seed(1))
    want = kernels.matvec_multi(x, ws, None, exact=True)
    off = x.clone()
    off[5] = torch.nextafter(off[5], torch.tensor(math.inf))  # not a bf16 value
    for v in xb:
        got = kernels.matvec_variant(v.index, x, ws)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
        with pytest.raises(RuntimeError, match="code 1"):
            kernels.matvec_variant(v.index, off, ws)


def test_the_load_time_check_catches_a_variant_with_other_bits(kernels):
    table = variant_table(kernels)
    fast = [v for v in table if v.cls == "fast" and v.needs <= cpu_features(kernels)]
    # a fast-order kernel claimed to be in the exact class: other bits
    for v in fast:
        posing = Variant(v.index, v.name, "exact", v.needs, v.kmul)
        assert "differ" in check_variant(kernels, posing)
    assert all(check_variant(kernels, v) is None for v in fast)


def test_a_variant_failing_its_check_is_skipped_with_one_line(
    kernels, monkeypatch, capsys
):
    table = variant_table(kernels)
    runnable = [v for v in table if v.needs <= cpu_features(kernels)]
    victim = next(v for v in runnable if v != default_variant(table, v.cls))
    real = variants_mod.check_variant

    def failing(k, v):
        return "results differ (test)" if v == victim else real(k, v)

    monkeypatch.setattr(variants_mod, "check_variant", failing)
    variants_mod._checked.cache_clear()
    try:
        usable = usable_variants(kernels)
        assert victim not in usable[victim.cls]
        out = capsys.readouterr().out
        assert out.count("skipped") == 1 and f"{victim.name} skipped" in out
    finally:
        variants_mod._checked.cache_clear()
        monkeypatch.undo()
    assert victim in usable_variants(kernels)[victim.cls]


def test_fake_cpu_features_leave_the_avx2_kernels(kernels):
    usable = usable_variants(kernels, frozenset({"avx2"}))
    for cls in CLASSES:
        assert usable[cls][0] == default_variant(variant_table(kernels), cls)
        assert all(v.needs == {"avx2"} for v in usable[cls])
    assert [v.name for v in usable["exact"]] == [
        "bf16_exact_avx2",
        "bf16_exact_avx2_np",
        "bf16_exact_avx2_eo",
        "bf16_exact_avx2_eo_nta",
    ]
    assert [v.name for v in usable["int8"]] == [
        "int8_avx2",
        "int8_avx2_s2",
        "int8_avx2_s2_nta",
    ]


def runnable_names(kernels, cls: str) -> list[str]:
    return [v.name for v in usable_variants(kernels)[cls]]


def test_whole_steps_give_the_same_logits_with_every_exact_or_int8_variant(kernels):
    sd = tiny_state_dict(21, BF16)
    for cls in ("exact", "int8"):
        results = {}
        for name in runnable_names(kernels, cls):
            model = FastQwen3.from_state_dict(BF16, sd)
            if cls == "int8":
                model = quantize_int8(model)
            assert model.use_native_step(variants=name)
            assert model.decode_step.choice.variants[cls].name == name
            assert model.decode_step.choice.how in ("forced", "default")
            model.setup_cache(1, 40)
            seq = tokens(generate(model, PROMPT, 20))[0]
            results[name] = seq
        assert len({tuple(s) for s in results.values()}) == 1, results


def test_fast_class_steps_stay_close(kernels):
    sd = tiny_state_dict(22, BF16)
    seqs = []
    for name in runnable_names(kernels, "fast"):
        model = FastQwen3.from_state_dict(BF16, sd)
        assert model.use_native_step(exact=False, variants=name)
        assert model.decode_step.choice.variants["fast"].name == name
        seqs.append(tokens(generate(model, PROMPT, 20))[0])
    for seq in seqs[1:]:  # free-running tokens: mostly the same
        assert sum(a == b for a, b in zip(seq, seqs[0], strict=True)) >= 15
