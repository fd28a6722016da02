"""Which matrix-vector kernel runs: the library's table over CPU features.

The library (`csrc/dispatch.c`) holds a few kernels per class: "exact"
(bf16 summed in ATen's order, all with the same bits), "fast" (bf16 in a
free order, within float32's error bound; for compiled graphs) and "int8"
(all with the first int8 kernel's bits), and "int8_mm", the multi-row
int8 kernels of a prompt's prefill (each row the int8 reference's bits
for that row alone). Its table lists each class's kernels best first,
each with the CPU features it needs: a class runs the first one this CPU
has the features for. The class's last, its first kernel (AVX2 on x86-64,
NEON on AArch64: one source, csrc/kernels_v8.c), is its reference and runs
wherever no other applies. As in ggml-cpu, the CPU's features alone decide
(instant, the same on every run, testable); the measurements behind each
choice are in ch02/03_fast-decoding/README.md.

`QWEN3_KERNEL_VARIANTS` overrides the table's choice: "default" (the first kernels)
or kernel names (e.g. "int8_avx512vnni_s2"). A kernel other than the
reference is checked once per process against it on a small problem
before it runs; one that fails is not used (one line on stderr).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import torch

from utils import settings
from utils.fast.kernels import Kernel, Kernels
from utils.log import get_logger

CLASSES = ("exact", "fast", "int8", "int8_mm")
ENV = "QWEN3_KERNEL_VARIANTS"
_log = get_logger(__name__)

# The class whose first kernel a class's kernels must equal: the multi-row
# int8 kernels give each row the bits of the int8 (matrix-vector) reference
REFERENCE_CLASS = {"int8_mm": "int8"}


def kernel_table(kernels: Kernels) -> tuple[Kernel, ...]:
    """Every kernel the library was built with, in its table's order (per
    class best first)."""
    return kernels.table


def cpu_features(kernels: Kernels) -> frozenset[str]:
    """What this CPU and OS run, as the library detects it: on x86-64
    "avx2" (with FMA), "avx512" (F, BW, DQ and VL), "avx512_bf16",
    "avx512_vnni"; on AArch64 "asimd" (NEON), "asimddp", "bf16", "i8mm"."""
    return kernels.features(kernels.lib.qwen3_cpu_features())


def rule_choice(cls: str, features: frozenset[str], table: Sequence[Kernel]) -> Kernel:
    """The kernel of class `cls` for a CPU with `features`: the first of
    the class in `table` (best first) that needs no other features; the
    class's reference (its last) where none fits."""
    kernels = [k for k in table if k.cls == cls]
    return next((k for k in kernels if k.needs <= features), kernels[-1])


def _problem(cls: str, gen: torch.Generator):
    """(x, weights, scales) of the load-time check: two matrices sharing x
    (101 rows: full passes and leftovers, split over two threads),
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


def _rows_problem(gen: torch.Generator):
    """`_problem("int8")` with x of 9 rows (tiles of 2 and 6 rows and their
    leftovers), each of another size, one holding an inf."""
    _, ws, scales = _problem("int8", gen)
    x = torch.randn(9, ws[0].shape[1], generator=gen)
    x *= torch.logspace(-3, 3, 9)[:, None]
    x[4, 100] = math.inf
    return x, ws, scales


def check_rows_kernel(
    kernels: Kernels, kernel: Kernel, reference: Kernel
) -> str | None:
    """Why the multi-row kernel `kernel` fails its check here (None: it
    passes): each row of its product has the bits the int8 kernel
    `reference` gives that row alone (float32 and bf16 out, one and two
    threads)."""
    x, ws, scales = _rows_problem(torch.Generator().manual_seed(kernel.index))
    for threads, out in itertools.product((1, 2), (torch.float32, torch.bfloat16)):
        xo = x.to(out)
        got = kernels.matmul(xo, ws, scales, kernel=kernel.index, threads=threads)
        want = torch.stack([
            kernels.matvec(row, ws, scales, kernel=reference.index, threads=threads)
            for row in xo
        ])  # fmt: skip
        bits = torch.int32 if out == torch.float32 else torch.int16
        if not torch.equal(got.view(bits), want.view(bits)):
            return f"rows differ from {reference.name}'s bits"
    return None


def check_kernel(kernels: Kernels, kernel: Kernel, reference: Kernel) -> str | None:
    """Why `kernel` fails its class's check here (None: it passes): the
    reference's bits (float32 and bf16 out, one and two threads), or for
    the fast class |y - w.x| <= k u / (1 - k u) * sum|w_i x_i|, u = 2**-24;
    a multi-row kernel: `check_rows_kernel`."""
    if kernel.cls == "int8_mm":
        return check_rows_kernel(kernels, kernel, reference)
    x, ws, scales = _problem(kernel.cls, torch.Generator().manual_seed(kernel.index))
    for threads, out in itertools.product((1, 2), (torch.float32, torch.bfloat16)):
        got, want = (
            kernels.matvec(x.to(out), ws, scales, kernel=k.index, threads=threads)
            for k in (kernel, reference)
        )
        bits = torch.int32 if out == torch.float32 else torch.int16
        if kernel.cls == "fast":
            if out == torch.float32 and not _within_bound(got, x, ws):
                return "results outside float32's error bound"
        elif not torch.equal(got.view(bits), want.view(bits)):
            return f"results differ from {reference.name}'s bits"
    return None


def _within_bound(got: torch.Tensor, x: torch.Tensor, ws: list[torch.Tensor]) -> bool:
    w = torch.cat(ws).double()
    k = w.shape[1]
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    bound = gamma * (w.abs() @ x.double().abs())
    return bool(((got.double() - w @ x.double()).abs() <= bound).all())


@functools.cache
def _passes_check(kernels: Kernels, kernel: Kernel) -> bool:
    """`check_kernel` once per process; one line on stderr when it fails.
    The multi-row class's reference is the int8 class's (row by row), so
    its first kernel is checked too."""
    cls = REFERENCE_CLASS.get(kernel.cls, kernel.cls)
    reference = kernels.table[kernels.first[cls]]
    if kernel == reference:
        return True
    reason = check_kernel(kernels, kernel, reference)
    if reason is not None:
        _log.warning("kernel %s not used (%s)", kernel.name, reason)
    return reason is None


def _forced(text: str, chosen: dict[str, Kernel], table, features) -> dict[str, Kernel]:
    """`chosen` with the kernels `text` names in place of the table's (one
    line on stderr for each name that cannot be used)."""
    known = {k.name: k for k in table}
    for name in (n.strip() for n in text.split(",") if n.strip()):
        k = known.get(name)
        if k is None:
            _log.warning("%s names no kernel %r (known: %s)", ENV, name,
                         ", ".join(known))  # fmt: skip
        elif k.needs - features:
            _log.warning("kernel %s cannot run on this CPU (it lacks %s)",
                         name, ", ".join(sorted(k.needs - features)))  # fmt: skip
        elif k.cls in chosen:
            chosen[k.cls] = k
    return chosen


def choose(
    kernels: Kernels,
    classes: Sequence[str] = CLASSES,
    setting: str | None = None,
    features: frozenset[str] | None = None,
) -> dict[str, Kernel]:
    """The kernel per class in `classes`: the table's choice for this CPU (or
    for `features`, never more than this CPU has: for the tests), unless
    `setting` (None: $QWEN3_KERNEL_VARIANTS) says otherwise; a kernel that
    fails its load-time check gives way to the class's reference."""
    table, have = kernel_table(kernels), cpu_features(kernels)
    features = have if features is None else features & have
    setting = ((settings.text(ENV) if setting is None else setting) or "").strip()
    if setting == "default":  # the first kernels, as on a CPU with no features
        features, setting = frozenset(), ""
    chosen = {c: rule_choice(c, features, table) for c in classes}
    if setting:
        chosen = _forced(setting, chosen, table, features)
    for cls, k in chosen.items():
        if not _passes_check(kernels, k):
            chosen[cls] = rule_choice(cls, frozenset(), table)
    return chosen


def rows_kernel(kernels: Kernels) -> Kernel | None:
    """The multi-row int8 kernel that prompts take: `choose`'s, or None
    where even the class's first kernel fails its check here (torch's int8
    product then runs prompts; one line on stderr said why)."""
    kernel = choose(kernels, ("int8_mm",))["int8_mm"]
    return kernel if _passes_check(kernels, kernel) else None
