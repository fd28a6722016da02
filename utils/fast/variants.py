"""Kernel variants: the matrix-vector kernels this CPU may run, each checked.

The C library carries several row kernels per class (`csrc/variants.c`):
"exact" (bf16 summed in ATen's order: every variant gives the same bits),
"fast" (bf16 in a free order: within float32's error bound of the exact
dot product) and "int8" (every variant gives the bits of the AVX2 int8
kernel). The first variant of each class is the AVX2 kernel of
`csrc/matvec.c`: the reference of its class and the default. The others
are other loop shapes (no software prefetch, one 256-bit load per 16
columns) or AVX-512 forms (`vdpbf16ps`, VNNI), compiled into the same
`-mavx2` library through target attributes.

What may run is decided here, at run time and never from compile-time
guesses: the CPU's features as cpuid (and the OS) report them, then, once
per process, a check of each variant on a small problem against its
class's reference (bit for bit, or within the bound); a variant that fails
is skipped with one printed line. Which of the remaining ones is fastest
depends on the machine: `utils.fast.tuner` measures it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

import utils.fast.build as build
from utils.fast.kernels import Kernels

__all__ = [
    "CLASSES",
    "Variant",
    "check_variant",
    "cpu_features",
    "default_variant",
    "missing_features",
    "usable_variants",
    "variant_table",
]

CLASSES = ("exact", "fast", "int8")


@dataclass(frozen=True)
class Variant:
    """One entry of the library's table: its index (what the C calls take),
    name, class, the CPU features it needs and the multiple k must be."""

    index: int
    name: str
    cls: str
    needs: frozenset[str]
    kmul: int


def _feature_names(kernels: Kernels) -> list[str]:
    return kernels.lib.qwen3_cpu_feature_names().decode("ascii").split(",")


def _names_of(bits: int, names: list[str]) -> frozenset[str]:
    return frozenset(n for i, n in enumerate(names) if bits >> i & 1)


@functools.cache
def _table(library: build.Library) -> tuple[Variant, ...]:
    kernels = Kernels(library)
    names = _feature_names(kernels)
    table = []
    text = kernels.lib.qwen3_variant_table().decode("ascii")
    for i, entry in enumerate(e for e in text.split(";") if e):
        name, cls, needs, kmul = entry.split(":")
        table.append(Variant(i, name, cls, _names_of(int(needs), names), int(kmul)))
    return tuple(table)


def variant_table(kernels: Kernels) -> tuple[Variant, ...]:
    """Every variant the library was built with, in its table's order."""
    return _table(kernels.library)


def cpu_features(kernels: Kernels) -> frozenset[str]:
    """What this CPU and OS run, as the library detects it: "avx2" (with
    FMA), "avx512" (F, BW, DQ and VL), "avx512_bf16", "avx512_vnni"."""
    return _names_of(kernels.lib.qwen3_cpu_features(), _feature_names(kernels))


def missing_features(variant: Variant, features: frozenset[str]) -> frozenset[str]:
    """The features `variant` needs that `features` lacks."""
    return variant.needs - features


def default_variant(table: tuple[Variant, ...], cls: str) -> Variant:
    """The first variant of `cls`: the AVX2 kernel, reference and default."""
    return next(v for v in table if v.cls == cls)


def _problem(cls: str, gen: torch.Generator):
    """(x, weights, scales) of the load-time check: two matrices sharing x
    (101 rows: four-row groups and leftovers, split over two threads),
    k = 2048 (two int8 chunks), entries of very different sizes."""
    rows, k = (64, 37), 2048
    if cls == "int8":
        ws = [
            torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
            for n in rows
        ]
        ws[0][0] = -127
        scales = [torch.rand(n, generator=gen) * 0.01 + 1e-4 for n in rows]
        return torch.randn(k, generator=gen), ws, scales
    ws = [(torch.randn(n, k, generator=gen) * 0.05).bfloat16() for n in rows]
    ws[0][0, :4] = torch.tensor([3e4, -1e-3, 7.0, -3e4])
    x = (torch.randn(k, generator=gen) * 2).bfloat16().float()  # as the step's
    return x, ws, None


def check_variant(kernels: Kernels, variant: Variant) -> str | None:
    """Why `variant` fails its class's check here (None: it passes): the
    reference's bits (exact: the exact kernel; int8: the AVX2 int8 kernel)
    for float32 and bf16 outputs on one and two threads, or for the fast
    class |y - w.x| <= gamma_k * sum|w_i x_i| (gamma_k = k u / (1 - k u),
    u = 2**-24) against the dot product in float64."""
    gen = torch.Generator().manual_seed(variant.index)
    x, ws, scales = _problem(variant.cls, gen)
    for threads in (1, 2):
        for out in (torch.float32, torch.bfloat16):
            got = kernels.matvec_variant(variant.index, x.to(out), ws, scales, threads)
            if variant.cls == "fast":
                if out == torch.float32 and not _within_bound(got, x, ws):
                    return "results outside float32's error bound"
                continue
            want = kernels.matvec_multi(x.to(out), ws, scales, exact=True)
            bits = torch.int32 if out == torch.float32 else torch.int16
            if not torch.equal(got.view(bits), want.view(bits)):
                return f"results differ from {variant.cls} reference's bits"
    return None


def _within_bound(got: torch.Tensor, x: torch.Tensor, ws: list[torch.Tensor]) -> bool:
    w = torch.cat(ws).double()
    k = w.shape[1]
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    bound = gamma * (w.abs() @ x.double().abs())
    return bool(((got.double() - w @ x.double()).abs() <= bound).all())


@functools.cache
def _checked(library: build.Library) -> tuple[Variant, ...]:
    """The variants this CPU runs that pass their check (once per process);
    one printed line per variant that fails."""
    kernels = Kernels(library)
    table, features = variant_table(kernels), cpu_features(kernels)
    passed = []
    for v in table:
        if missing_features(v, features):
            continue
        if v == default_variant(table, v.cls):  # the reference itself
            passed.append(v)
            continue
        reason = check_variant(kernels, v)
        if reason is None:
            passed.append(v)
        else:
            print(f"utils.fast: kernel variant {v.name} skipped ({reason})")
    return tuple(passed)


def usable_variants(
    kernels: Kernels, features: frozenset[str] | None = None
) -> dict[str, tuple[Variant, ...]]:
    """Per class, the variants that may run here, the default first: this
    CPU runs them (or, given `features`, a CPU with those: for the tests;
    never more than this one has) and they passed their load-time check."""
    passed = _checked(kernels.library)
    if features is not None:
        passed = tuple(v for v in passed if not missing_features(v, features))
    return {cls: tuple(v for v in passed if v.cls == cls) for cls in CLASSES}
