"""utils.fast.dispatch and csrc/dispatch.c: the kernel per class follows the
CPU's features by a small rule table (decisions tested by naming feature
sets); every kernel this CPU can execute computes what its class promises
(exact and int8: the bits of the first kernel; fast: within float32's error
bound), alone, grouped and inside whole decode steps; kernels the CPU lacks
the instructions for are compiled into the library but never executed here,
and the C side refuses to run them rather than crash. QWEN3_KERNEL_VARIANTS
overrides the rules, with one line on stderr for a name it cannot use."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
import torch

import utils.fast.build as build
import utils.fast.dispatch as dispatch
from tests.tiny import PROMPT, fast_model, tiny_config, tiny_state_dict, tokens
from utils.fast import generate, get_kernels, quantize_int8
from utils.fast.dispatch import (
    CLASSES,
    Kernel,
    check_kernel,
    choose,
    cpu_features,
    kernel_table,
    rows_kernel,
    rule_choice,
)

pytestmark = pytest.mark.skipif(
    build.unsupported_reason() is not None,
    reason="the kernels need x86-64 with AVX2, or AArch64",
)
BF16 = tiny_config(context_length=512, dtype=torch.bfloat16)
# The first kernels (kernels_v8.c) are named for the instruction set
ISA = "avx2" if build.machine() == "x86_64" else "neon"
FIRST = (f"bf16_exact_{ISA}", f"bf16_fast_{ISA}", f"int8_{ISA}", f"int8_mm_{ISA}")
# The classes of the matrix-vector kernels (int8_mm: several rows of x)
MATVEC = ("exact", "fast", "int8")
x86_only = pytest.mark.skipif(
    build.machine() != "x86_64", reason="x86-64's AVX-512 kernels and their rules"
)


def every_kernel(classes=MATVEC):
    """One parameter per kernel of the library in `classes`; those this CPU
    cannot execute are skipped with the instructions it lacks."""
    kernels = get_kernels()
    table = kernel_table(kernels) if kernels is not None else ()
    have = cpu_features(kernels) if kernels is not None else frozenset()
    for k in (k for k in table if k.cls in classes):
        lacks = sorted(k.needs - have)
        marks = []
        if lacks:
            why = f"{k.name}: this CPU lacks {'+'.join(lacks)} (compiled, not executed)"
            marks = [pytest.mark.skip(reason=why)]
        yield pytest.param(k, id=k.name, marks=marks)


def reference(kernels, cls: str) -> Kernel:
    """The class's reference: its last kernel (the table is best first)."""
    return [k for k in kernel_table(kernels) if k.cls == cls][-1]


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
    if cls in ("int8", "int8_mm"):
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


@pytest.mark.parametrize("kernel", list(every_kernel()))
@pytest.mark.parametrize("threads", [1, 2])
def test_every_kernel_computes_what_its_class_promises(kernels, kernel, threads):
    gen = torch.Generator().manual_seed(kernel.index * 10 + threads)
    for k, rows in SHAPES:
        if k % kernel.kmul:
            continue
        x, ws, scales = problem(kernel.cls, k, rows, gen)
        for out in (torch.float32, torch.bfloat16):
            got = kernels.matvec(
                x.to(out), ws, scales, kernel=kernel.index, threads=threads
            )
            assert got.shape == (sum(rows),) and got.dtype == out
            if kernel.cls == "fast":
                assert out != torch.float32 or within_float32_bound(got, x, ws)
                continue
            want = kernels.matvec(x.to(out), ws, scales, exact=True)
            view = torch.int32 if out == torch.float32 else torch.int16
            assert torch.equal(got.view(view), want.view(view)), (k, rows, out)
    if kernel.cls == "int8":  # an inf in x: the float32 kernel, as the reference
        x[7] = math.inf
        got = kernels.matvec(x, ws, scales, kernel=kernel.index, threads=threads)
        want = kernels.matvec(x, ws, scales)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got[~want.isnan()], want[~want.isnan()])


def rows_of_x(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """m rows of x, each of another size (each row its own fixed-point scale)."""
    return torch.randn(m, k, generator=gen) * torch.logspace(-2, 2, m)[:, None]


@pytest.mark.parametrize("kernel", list(every_kernel(("int8_mm",))))
@pytest.mark.parametrize("threads", [1, 2])
def test_a_prompts_rows_get_the_bits_of_the_same_rows_sent_one_by_one(
    kernels, kernel, threads
):
    """Every multi-row int8 kernel gives each row of x the bits the int8
    reference gives that row alone (the decode kernel): tiles of rows and
    their leftovers, several int8 chunks, grouped matrices, float32 and bf16
    out, and a row holding an inf (computed apart, as alone)."""
    gen = torch.Generator().manual_seed(kernel.index * 10 + threads)
    one_by_one = reference(kernels, "int8").index
    for (k, rows), m in zip(SHAPES, (13, 7, 1, 64, 5, 2), strict=True):
        _, ws, scales = problem("int8", k, rows, gen)
        x = rows_of_x(m, k, gen)
        if m > 4:
            x[3, k // 2] = math.inf
        for out in (torch.float32, torch.bfloat16):
            xo = x.to(out)
            got = kernels.matmul(xo, ws, scales, kernel=kernel.index, threads=threads)
            assert got.shape == (m, sum(rows)) and got.dtype == out
            want = torch.stack([
                kernels.matvec(r, ws, scales, kernel=one_by_one, threads=threads)
                for r in xo
            ])  # fmt: skip
            view = torch.int32 if out == torch.float32 else torch.int16
            assert torch.equal(got.view(view), want.view(view)), (k, rows, m, out)


class OneBitOff:
    """Kernels whose multi-row product has one bit of one row changed."""

    def __init__(self, kernels) -> None:
        self.kernels = kernels

    def matvec(self, *args, **kwargs):
        return self.kernels.matvec(*args, **kwargs)

    def matmul(self, *args, **kwargs):
        y = self.kernels.matmul(*args, **kwargs)
        y.view(torch.int32 if y.dtype == torch.float32 else torch.int16)[5, 7] ^= 1
        return y


def test_the_multi_row_check_compares_each_row_with_the_int8_reference(kernels):
    """The load-time check of a multi-row kernel (first kernel included)
    passes for the library's kernel and catches one bit changed in one row."""
    rows, one_by_one = reference(kernels, "int8_mm"), reference(kernels, "int8")
    assert check_kernel(kernels, rows, one_by_one) is None
    reason = check_kernel(OneBitOff(kernels), rows, one_by_one)
    assert reason is not None and "differ" in reason


@pytest.mark.parametrize("kernel", list(every_kernel(("int8_mm",))))
def test_a_late_thread_leaves_a_prompts_rows_their_bits(test_kernels, kernel):
    """The multi-row kernels' weight rows are shared out by the team as a
    decode product's: with the second thread held back, the first takes
    passes from the back of its share, and the bits are one thread's."""
    if not test_kernels.library.openmp:
        pytest.skip("the library was built without OpenMP: one thread")
    gen = torch.Generator().manual_seed(kernel.index)
    lib = test_kernels.lib
    _, ws, scales = problem("int8", 1024, (1024, 512), gen)
    x = rows_of_x(9, 1024, gen)
    alone = test_kernels.matmul(x, ws, scales, kernel=kernel.index, threads=1)
    lib.qwen3_test_stolen_passes(20_000)
    try:
        late = test_kernels.matmul(x, ws, scales, kernel=kernel.index, threads=2)
    finally:
        stolen = lib.qwen3_test_stolen_passes(0)
    assert torch.equal(late.view(torch.int32), alone.view(torch.int32))
    assert stolen > 0


@pytest.mark.parametrize("kernel", list(every_kernel()))
def test_a_thread_that_starts_late_has_its_passes_taken_same_bits(test_kernels, kernel):
    """With the second thread held back 20 ms at the start of each product
    (the test build's hook), the first takes the passes left at the back of
    its share (team.c): every row is still computed once, with the bits of
    one thread alone."""
    if not test_kernels.library.openmp:
        pytest.skip("the library was built without OpenMP: one thread")
    gen = torch.Generator().manual_seed(kernel.index)
    lib = test_kernels.lib
    for k, rows in SHAPES[:3]:
        if k % kernel.kmul:
            continue
        x, ws, scales = problem(kernel.cls, k, rows, gen)
        alone = test_kernels.matvec(x, ws, scales, kernel=kernel.index, threads=1)
        lib.qwen3_test_stolen_passes(20_000)
        try:
            late = test_kernels.matvec(x, ws, scales, kernel=kernel.index, threads=2)
        finally:
            stolen = lib.qwen3_test_stolen_passes(0)
        assert torch.equal(late.view(torch.int32), alone.view(torch.int32)), k
        assert stolen > 0, (k, rows)


def test_the_table_is_best_first_with_the_first_kernels_last(kernels):
    """Per class the first kernels (the references) come last, and no
    kernel needs all that one before it needs (it would never be chosen)."""
    table = kernel_table(kernels)
    assert tuple(reference(kernels, c).name for c in CLASSES) == FIRST
    assert tuple(table[kernels.first[c]].name for c in CLASSES) == FIRST
    base = "avx2" if ISA == "avx2" else "asimd"
    assert all(k.needs == {base} for k in table if k.name in FIRST)
    for cls in CLASSES:
        of_cls = [k for k in table if k.cls == cls]
        for i, later in enumerate(of_cls):
            assert not any(later.needs >= k.needs for k in of_cls[:i]), later
    assert [k.index for k in table] == list(range(len(table)))
    if ISA == "neon":  # nothing but the first kernels on AArch64
        assert tuple(k.name for k in table) == FIRST


@x86_only
def test_the_table_has_the_avx512_forms(kernels):
    table = kernel_table(kernels)
    names = {k.name: k for k in table}
    assert names["bf16_exact_avx512_xb"].needs == {"avx2", "avx512"}
    assert names["bf16_exact_avx512_xb"].cls == "exact"
    assert names["int8_avx512vnni_s2"].needs == {"avx2", "avx512", "avx512_vnni"}
    assert names["int8_mm_avx512vnni"].needs == {"avx2", "avx512", "avx512_vnni"}
    assert names["int8_mm_avx512vnni"].cls == "int8_mm"


# Feature sets of CPUs the rules were written for, and what they pick
_V8 = ("bf16_fast_avx2",)
RULE_CASES = [
    (frozenset(), ("bf16_exact_avx2", *_V8, "int8_avx2", "int8_mm_avx2")),
    (frozenset({"avx2"}), ("bf16_exact_avx2", *_V8, "int8_avx2", "int8_mm_avx2")),
    (frozenset({"avx2", "avx512"}),
     ("bf16_exact_avx512_xb", *_V8, "int8_avx2", "int8_mm_avx2")),
    (frozenset({"avx2", "avx512", "avx512_vnni", "avx512_bf16"}),
     ("bf16_exact_avx512_xb", *_V8, "int8_avx512vnni_s2", "int8_mm_avx512vnni")),
    (frozenset({"avx2", "avx512_vnni"}),  # VNNI without AVX-512 F/BW/DQ/VL
     ("bf16_exact_avx2", *_V8, "int8_avx2", "int8_mm_avx2")),
]  # fmt: skip


@x86_only
@pytest.mark.parametrize("features, picks", RULE_CASES)
def test_the_rules_pick_by_cpu_features(kernels, features, picks):
    table = kernel_table(kernels)
    assert tuple(rule_choice(c, features, table).name for c in CLASSES) == picks


def test_a_rule_naming_a_kernel_the_library_lacks_is_skipped(kernels):
    """A compiler too old for AVX-512 builds the AVX2 kernels alone: the
    rules then fall back to them."""
    table = tuple(k for k in kernel_table(kernels) if "avx512" not in k.needs)
    every = frozenset({"avx2", "avx512", "avx512_vnni", "avx512_bf16"})
    assert rule_choice("exact", every, table).name == FIRST[0]
    assert rule_choice("int8", every, table).name == FIRST[2]
    assert rule_choice("int8_mm", every, table).name == FIRST[3]


def test_choose_follows_the_cpu_and_never_exceeds_it(kernels):
    have = cpu_features(kernels)
    table = kernel_table(kernels)
    assert choose(kernels, setting="") == {
        c: rule_choice(c, have, table) for c in CLASSES
    }
    # naming more features than the CPU has never picks what it cannot run
    every = frozenset({"avx2", "avx512", "avx512_vnni", "avx512_bf16"})
    for k in choose(kernels, setting="", features=every).values():
        assert k.needs <= have
    default = choose(kernels, setting="default")
    assert tuple(default[c].name for c in CLASSES) == FIRST


def test_the_setting_forces_kernels_and_says_what_it_cannot_use(kernels, capsys):
    chosen = choose(kernels, ("exact", "int8"), setting=f"{FIRST[2]}, nonsense")
    assert chosen["int8"].name == FIRST[2]
    out = capsys.readouterr()
    assert out.out == ""
    assert "names no kernel 'nonsense'" in out.err and FIRST[2] in out.err
    if ISA == "avx2" and "avx512" not in cpu_features(kernels):
        chosen = choose(kernels, ("exact",), setting="bf16_exact_avx512_xb")
        assert chosen["exact"].name == FIRST[0]
        err = capsys.readouterr().err
        assert "bf16_exact_avx512_xb cannot run on this CPU (it lacks avx512)" in err


def test_cpu_features_agree_with_the_kernel_of_the_os(kernels):
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo to compare with")
    key = "flags" if ISA == "avx2" else "Features"
    lines = [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith(key)]
    if not lines:  # qemu-user shows the host's /proc/cpuinfo
        pytest.skip(f"/proc/cpuinfo has no {key} line to compare with")
    flags = set(lines[0].split(":", 1)[1].split())
    if ISA == "neon":
        want = {"asimd", "asimddp", "bf16", "i8mm"} & flags
        assert cpu_features(kernels) == want
        return
    want = {"avx2"} if {"avx2", "fma"} <= flags else set()
    if want and {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        want.add("avx512")
        want |= {n for n in ("avx512_bf16", "avx512_vnni") if n in flags}
    assert cpu_features(kernels) == want


@contextlib.contextmanager
def cpu_limited_to(kernels, names: set[str]):
    """The test build acting as if the CPU had only `names` (never more)."""
    bits = kernels.lib.qwen3_cpu_feature_names().decode().split(",")
    mask = sum(1 << i for i, n in enumerate(bits) if n in names)
    kernels.lib.qwen3_test_limit_cpu_features(mask)
    try:
        yield
    finally:
        kernels.lib.qwen3_test_limit_cpu_features(-1)


def test_the_library_refuses_a_kernel_the_cpu_lacks(test_kernels):
    """Limited to no features at all (the test build's hook), every kernel
    is refused with code 3: an error, never an illegal instruction."""
    table = kernel_table(test_kernels)
    with cpu_limited_to(test_kernels, set()):
        assert cpu_features(test_kernels) == frozenset()
        for k in table:
            x, ws, scales = problem(k.cls, 1024, (8,), torch.Generator())
            with pytest.raises(RuntimeError, match="code 3"):
                if k.cls == "int8_mm":
                    test_kernels.matmul(x[None], ws, scales, kernel=k.index)
                else:
                    test_kernels.matvec(x, ws, scales, kernel=k.index)
    assert ("avx2" if ISA == "avx2" else "asimd") in cpu_features(test_kernels)


def test_wrong_k_or_index_is_an_error_not_a_crash(kernels):
    table = kernel_table(kernels)
    exact = reference(kernels, "exact")
    x, ws, _ = problem("exact", 80, (4,), torch.Generator())  # 80 % 64 != 0
    with pytest.raises(RuntimeError, match="code 1"):
        kernels.matvec(x, ws, kernel=exact.index)
    x, ws, scales = problem("int8", 64, (4,), torch.Generator())
    rows = reference(kernels, "int8_mm").index
    for index in (-1, len(table), exact.index, rows):  # none, or not an int8 one
        with pytest.raises(RuntimeError, match="code 1"):
            kernels.matvec(x, ws, scales, kernel=index)
    for index in (-1, len(table), exact.index, reference(kernels, "int8").index):
        with pytest.raises(RuntimeError, match="code 1"):
            kernels.matmul(x[None], ws, scales, kernel=index)


@x86_only
def test_an_exact_kernel_taking_x_as_bf16_refuses_an_x_it_would_round(kernels):
    """bf16_exact_avx512_xb holds x as bf16: exact for the step's x, which
    always holds bf16 values, and refused (code 1) for a float32 x it would
    round, rather than returning other bits."""
    xb = next(k for k in kernel_table(kernels) if k.name == "bf16_exact_avx512_xb")
    if not xb.needs <= cpu_features(kernels):
        pytest.skip("this CPU runs no AVX-512 kernel")
    x, ws, _ = problem("exact", 1024, (8, 3), torch.Generator().manual_seed(1))
    want = kernels.matvec(x, ws, None, exact=True)
    off = x.clone()
    off[5] = torch.nextafter(off[5], torch.tensor(math.inf))  # not a bf16 value
    assert torch.equal(kernels.matvec(x, ws, kernel=xb.index).view(torch.int32),
                       want.view(torch.int32))  # fmt: skip
    with pytest.raises(RuntimeError, match="code 1"):
        kernels.matvec(off, ws, kernel=xb.index)


def test_the_load_time_check_catches_a_kernel_with_other_bits(kernels):
    fast = reference(kernels, "fast")
    # a fast-order kernel claimed to be in the exact class: other bits
    posing = Kernel(fast.index, fast.name, "exact", fast.needs, fast.kmul)
    assert "differ" in check_kernel(kernels, posing, reference(kernels, "exact"))
    assert check_kernel(kernels, fast, fast) is None


@x86_only
def test_a_kernel_failing_its_check_gives_way_with_one_line(
    kernels, monkeypatch, capsys
):
    """A forced kernel that fails its load-time check is not used: the
    class's reference runs, and one line on stderr says why."""
    victim = next(k for k in kernel_table(kernels)
                  if k.cls == "int8" and k.name != FIRST[2])  # fmt: skip
    monkeypatch.setattr(dispatch, "check_kernel", lambda *a: "results differ (test)")
    monkeypatch.setattr(dispatch, "cpu_features", lambda k: victim.needs)
    dispatch._passes_check.cache_clear()
    try:
        chosen = choose(kernels, ("int8",), setting=victim.name, features=victim.needs)
        assert chosen["int8"].name == FIRST[2]
        err = capsys.readouterr().err
        assert err.count("not used") == 1 and victim.name in err
    finally:
        dispatch._passes_check.cache_clear()


def runnable(kernels, cls: str) -> list[str]:
    have = cpu_features(kernels)
    return [k.name for k in kernel_table(kernels) if k.cls == cls and k.needs <= have]


def test_whole_steps_give_the_same_logits_with_every_exact_or_int8_kernel(kernels):
    sd = tiny_state_dict(21, BF16)
    for cls in ("exact", "int8"):
        results = {}
        for name in runnable(kernels, cls):
            model = fast_model(BF16, sd)
            if cls == "int8":
                model = quantize_int8(model)
            assert model.use_native_step(kernels=name)
            assert model.decode_step.kernels[cls].name == name
            model.setup_cache(1, 40)
            results[name] = tokens(generate(model, PROMPT, 20))[0]
        assert len({tuple(s) for s in results.values()}) == 1, results


def test_an_int8_prompt_goes_through_the_rules_multi_row_kernel(kernels, monkeypatch):
    """An int8 model's prefill sends the prompt's rows to the multi-row
    kernel the rules pick (one call per group of layers sharing x), and
    decode rows to the matrix-vector kernels; `use_cpu_matvec(False)`
    leaves the prompt to torch."""
    import utils.fast.kernels as kernels_mod

    model = quantize_int8(fast_model(BF16, tiny_state_dict(21, BF16)))
    chosen = choose(kernels, ("int8_mm",))["int8_mm"]  # its check done first
    rows = []
    real = type(kernels).matmul

    def counted(self, x, *args, **kwargs):
        rows.append(x.shape[0])
        return real(self, x, *args, **kwargs)

    monkeypatch.setattr(type(kernels), "matmul", counted)
    model.setup_cache(1, 40)
    tokens(generate(model, PROMPT, 3))
    layers = BF16["n_layers"]
    assert rows == [PROMPT.shape[1]] * (4 * layers + 1)  # qkv, o, gate+up, down; head
    assert kernels_mod._LOADED["int8_mm"] == chosen.index
    rows.clear()
    model.use_cpu_matvec(False)
    tokens(generate(model, PROMPT, 3))
    assert rows == []


def test_prompts_go_to_torch_where_every_multi_row_kernel_fails_its_check(
    kernels, monkeypatch, capsys
):
    """Where even the class's first multi-row kernel fails its check (NEON
    code never run here, say), prompts take torch's int8 product: no
    multi-row kernel, one line on stderr."""
    assert rows_kernel(kernels) is not None
    monkeypatch.setattr(dispatch, "check_kernel", lambda *a: "results differ (test)")
    dispatch._passes_check.cache_clear()
    try:
        assert rows_kernel(kernels) is None
        assert "not used (results differ (test))" in capsys.readouterr().err
    finally:
        dispatch._passes_check.cache_clear()
