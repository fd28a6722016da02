"""Matrix-vector products for single-token decoding on CPUs (x86-64, AArch64).

Decoding one token makes every linear layer a matrix-vector product: each
weight is read once for one multiply-add, so memory speed sets the pace.
The C kernels (`csrc/kernels_*.c`) read bf16 weights and add in float32;
the int8 kernel multiplies int8 weights with the input rounded to 16-bit
fixed point (exact int32 sums), which keeps it at memory speed. A
prompt's rows with int8 weights take a multi-row kernel (`Kernels.matmul`)
with each row's bits unchanged, each weight byte read once per tile.

Two bf16 classes: "exact" adds in the order of ATen's own bf16 dot, "fast"
(inside torch.compile graphs, as torch operators) orders the additions for
speed. Eager code uses the exact kernel only where `F.linear` itself would
run that dot (`bf16_gemv_path`), so eager results are its bits on every CPU.
"""

from __future__ import annotations

import array
import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import utils.fast.build as build
from utils.device import torch_version

_FLOAT_X = (torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Kernel:
    """One entry of the library's table: index (what the C calls take),
    name, class, the CPU features it needs, the multiple k must be."""

    index: int
    name: str
    cls: str
    needs: frozenset[str]
    kmul: int


class Kernels:
    """The loaded kernel library with typed, checked calls (see `get_kernels`):
    its kernels (`table`, per class best first); `first[cls]`, the index of
    a class's reference kernel (its kernels_v8.c one, AVX2 or NEON: the
    class's last), and `kmul[cls]`, the multiple k must be for it."""

    def __init__(self, library: build.Library) -> None:
        self.library = library
        self.lib = library.lib
        self.path = library.path
        names = self.lib.qwen3_cpu_feature_names().decode("ascii")
        self.feature_names = names.split(",")
        entries = self.lib.qwen3_kernels().decode("ascii").split(";")
        self.table = tuple(
            Kernel(i, name, cls, self.features(int(needs)), int(kmul))
            for i, (name, cls, needs, kmul) in enumerate(
                e.split(":") for e in entries if e
            )
        )
        self.first = {k.cls: k.index for k in self.table}
        self.kmul = {cls: self.table[i].kmul for cls, i in self.first.items()}

    def features(self, bits: int) -> frozenset[str]:
        """The names of the CPU features set in `bits` (the library's order)."""
        return frozenset(n for i, n in enumerate(self.feature_names) if bits >> i & 1)

    def matvec(
        self,
        x: Tensor,
        weights: list[Tensor],
        scales: list[Tensor] | None = None,
        *,
        exact: bool = False,
        kernel: int | None = None,
        threads: int | None = None,
    ) -> Tensor:
        """`torch.cat([w @ x for w in weights])` in one parallel call (q/k/v or
        gate/up at once), in x's dtype: bf16 weights by the fast kernel (or
        the exact one), int8 weights times `scales` per row; k a multiple
        of the class's `kmul`.
        `kernel`: that index of the library's table instead of the class's
        reference. ValueError for operands it cannot read; RuntimeError when
        the kernel cannot run (code 1: k or the weights do not fit it; 3:
        the CPU lacks its instructions)."""
        cls = _class_of(weights, scales, exact)
        problem = _operand_problem(x, weights, scales, self.kmul[cls])
        if problem is not None:
            raise ValueError(problem)
        index = self.first[cls] if kernel is None else kernel
        return self._call(self.lib.qwen3_matvec, index, x, (), weights, scales, threads)

    def matmul(
        self,
        x: Tensor,
        weights: list[Tensor],
        scales: list[Tensor],
        *,
        kernel: int | None = None,
        threads: int | None = None,
    ) -> Tensor:
        """`torch.stack([self.matvec(row, weights, scales) for row in x])`
        for int8 weights and m rows of x (m, k) in one call, with a
        multi-row kernel (class "int8_mm"; `kernel`: that index, else the
        class's reference): every row the bits `matvec`'s int8 reference
        gives it alone, each weight byte read once per tile of rows.
        Errors as `matvec`'s."""
        if _class_of(weights, scales, False) != "int8" or x.dim() != 2:
            raise ValueError("matmul takes x (m, k) and int8 weights with scales")
        problem = _operand_problem(x[0], weights, scales, self.kmul["int8_mm"])
        if problem is not None or not x.is_contiguous():
            raise ValueError(problem or "x must be contiguous")
        index = self.first["int8_mm"] if kernel is None else kernel
        m = (x.shape[0],)
        return self._call(self.lib.qwen3_matmul, index, x, m, weights, scales, threads)

    def _call(self, entry, index, x, m, weights, scales, threads) -> Tensor:
        """y (*m, n) from the C entry point `entry` (qwen3_matvec, m = (), or
        qwen3_matmul, m = (rows of x,)); RuntimeError for its error codes."""
        y = torch.empty(*m, sum(w.shape[0] for w in weights), dtype=x.dtype)
        held = _arrays(weights, scales)
        w_ptrs, s_ptrs, row_array = (a.buffer_info()[0] for a in held)
        rc = entry(
            index, x.data_ptr(), x.dtype == torch.float32, *m, len(weights),
            w_ptrs, s_ptrs if scales else None,
            row_array, y.data_ptr(), y.dtype == torch.float32,
            weights[0].shape[1],
            torch.get_num_threads() if threads is None else threads,
        )  # fmt: skip
        if rc:
            raise RuntimeError(f"kernel {index} failed with code {rc}")
        return y


def _arrays(weights: list[Tensor], scales: list[Tensor] | None) -> tuple:
    """The weights' addresses, the scales' (or [0]) and the row counts, as
    arrays for one C call (array.array: built ~10x faster than ctypes
    arrays, at about a hundred calls per token); the caller holds them
    until the call returns."""
    return (
        array.array("Q", [w.data_ptr() for w in weights]),
        array.array("Q", [s.data_ptr() for s in scales] if scales else [0]),
        array.array("l", [w.shape[0] for w in weights]),
    )


def _class_of(weights: list[Tensor], scales: list[Tensor] | None, exact: bool) -> str:
    """The kernel class for these weights (ValueError if none)."""
    if not weights:
        raise ValueError("matvec needs at least one weight")
    dtype = weights[0].dtype
    if scales is not None and len(scales) != len(weights):
        raise ValueError(f"{len(weights)} weights but {len(scales)} scales")
    if dtype == torch.int8 and scales is not None:
        return "int8"
    if dtype == torch.bfloat16 and scales is None:
        return "exact" if exact else "fast"
    raise ValueError(
        "matvec takes bf16 weights, or int8 weights with scales; "
        f"got {dtype} weights and scales {scales is not None}"
    )


def _operand_problem(
    x: Tensor, weights: list[Tensor], scales: list[Tensor] | None, multiple: int
) -> str | None:
    """What keeps the kernel from reading these tensors safely (None:
    nothing). It needs contiguous CPU tensors, weights (n, k) all bf16 or
    all int8, k a multiple of `multiple`, x (k,) bf16 or float32, scales
    (n,) float32. Messages are made only on failure (a hundred calls a
    token)."""
    for t in (x, *weights, *(scales or ())):
        if t.device.type != "cpu" or not t.is_contiguous():
            return "x, weights and scales must be contiguous CPU tensors"
    first = weights[0]
    for i, w in enumerate(weights):
        if w.dtype != first.dtype or w.dtype not in (torch.bfloat16, torch.int8):
            return f"weights differ in dtype or are not bf16/int8: {w.dtype}"
        if w.dim() != 2 or w.shape[1] != first.shape[1]:
            return f"weights must be 2-D, alike in k; got {tuple(w.shape)}"
        s = None if scales is None else scales[i]
        if s is not None and (s.dtype != torch.float32 or s.shape != w.shape[:1]):
            got = f"{tuple(s.shape)} {s.dtype}"
            return f"scales must be ({w.shape[0]},) float32, got {got}"
    k = first.shape[1]
    if k % multiple:
        return f"weight columns ({k}) must be a multiple of {multiple}"
    if x.dtype not in _FLOAT_X or x.shape != (k,):
        return f"x must be ({k},) bf16 or float32, got {tuple(x.shape)} {x.dtype}"
    return None


# The kernels loaded in this process (set once by `get_kernels`; the
# operators below look them up) and the operator library
_LOADED: dict[str, Any] = {}


@functools.cache
def _kernels_for(library: build.Library) -> Kernels:
    kernels = Kernels(library)
    _LOADED.setdefault("kernels", kernels)
    _register_ops()
    return kernels


def get_kernels(extra: build.Extra | None = None) -> Kernels | None:
    """The compiled kernels, building them on first use; None (after one
    line on stderr saying why) where they cannot be built or loaded.
    `extra`: sources and defines added to the library (`build.Extra`)."""
    library = build.get_library(extra or build.Extra())
    return None if library is None else _kernels_for(library)


ATEN_AVX2 = "aten-avx2"  # the path whose sums the exact kernel reproduces


@dataclass(frozen=True)
class TorchCPU:
    """What decides, in PyTorch, which code runs a bf16 `F.linear` of one
    row on an x86-64 CPU (read once per process, see `torch_cpu`)."""

    torch_version: tuple[int, int]  # (major, minor)
    mkldnn_built: bool  # torch.backends.mkldnn.is_available()
    onednn_bf16: bool  # torch.ops.mkldnn._is_mkldnn_bf16_supported()
    avx512_bf16: bool  # the CPU has AVX512_BF16 (cpuinfo)
    openblas: bool  # built with OpenBLAS (whose sbgemm may take bf16 GEMMs)
    capability: str  # ATen's CPU capability: DEFAULT, AVX2, AVX512


@functools.cache
def torch_cpu() -> TorchCPU:
    """The facts of this process's torch and CPU that `bf16_gemv_path` uses."""
    mkldnn = torch.backends.mkldnn.is_available()
    onednn_bf16 = bool(mkldnn and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return TorchCPU(
        torch_version=torch_version(),
        mkldnn_built=mkldnn,
        onednn_bf16=onednn_bf16,
        avx512_bf16=torch.cpu._is_avx512_bf16_supported(),
        openblas="BLAS_INFO=open" in torch.__config__.show(),
        capability=torch.backends.cpu.get_cpu_capability(),
    )


def bf16_gemv_path(
    rows: int,
    cols: int,
    mkldnn_enabled: bool | None = None,
    cpu: TorchCPU | None = None,
) -> str:
    """Which code torch 2.10 runs for `F.linear(x, w)`, x one bf16 row and
    w a bf16 (rows, cols) matrix, on an x86-64 CPU (`mkldnn_enabled` and
    `cpu` default to this process's). `F.linear` -> `mm` -> `cpublas::gemm`
    (aten/src/ATen/native/LinearAlgebra.cpp, CPUBlas.cpp) tries oneDNN where
    the CPU has AVX512_BF16: taken when mkldnn is enabled, its bf16 check
    passes and rows * cols > 16**3 (mkldnn/Matmul.cpp): "onednn". Else an
    OpenBLAS build may call sbgemm: "openblas". Else ATen's
    `bf16_gemv_trans` (cpu/ReducedPrecisionFloatGemvFastPathKernel.cpp; its
    AVX2 code also runs at capability AVX512): "aten-avx2", the exact
    kernel's sums; at ATEN_CPU_CAPABILITY=default "aten-default". Other
    torch versions: "unverified"."""
    if mkldnn_enabled is None:
        mkldnn_enabled = torch.backends.mkldnn.enabled
    cpu = cpu or torch_cpu()
    if cpu.torch_version != (2, 10):
        return "unverified"
    onednn = cpu.mkldnn_built and mkldnn_enabled and cpu.onednn_bf16
    if onednn and cpu.avx512_bf16 and rows * cols > 16 * 16 * 16:
        return "onednn"
    if cpu.openblas:
        return "openblas"
    if cpu.capability in ("AVX2", "AVX512"):
        return ATEN_AVX2
    return f"aten-{cpu.capability.lower()}"


# torch operators, so torch.compile can call the kernels from its graphs


def _matvec_impl(
    x: Tensor,
    weights: list[Tensor],
    scales: list[Tensor] | None = None,
    exact: bool = False,
) -> Tensor:
    """`Kernels.matvec` for the decode row x (..., k), shaped (..., n)."""
    flat = x.reshape(-1).contiguous()
    out = _LOADED["kernels"].matvec(flat, weights, scales, exact=exact)
    return out.view(*x.shape[:-1], out.shape[0])


def _fake_matvec(x, weights, *rest):
    return x.new_empty(*x.shape[:-1], sum(w.shape[0] for w in weights))


def _register_ops() -> None:
    """Define torch.ops.qwen3_ch02.matvec[_int8] once per process
    (`torch.library.Library` rather than `custom_op`: a third of the
    per-call overhead, at a hundred or more calls per token)."""
    if "library" in _LOADED:
        return
    lib = torch.library.Library("qwen3_ch02", "DEF")
    lib.define("matvec(Tensor x, Tensor[] weights) -> Tensor")
    lib.define("matvec_int8(Tensor x, Tensor[] weights, Tensor[] scales) -> Tensor")
    lib.impl("matvec", _matvec_impl, "CPU")
    lib.impl("matvec_int8", _matvec_impl, "CPU")
    for name in ("matvec", "matvec_int8"):
        torch.library.register_fake(f"qwen3_ch02::{name}", _fake_matvec, lib=lib)
    _LOADED["library"] = lib


# What the layers call


def _eager_exact(x: Tensor, weight: Tensor) -> bool:
    """Whether eager code may use the exact kernel for `F.linear(x, weight)`:
    same dtypes (as F.linear needs) and torch would add the same way."""
    rows, cols = weight.shape
    return (
        x.dtype == weight.dtype
        and cols % _LOADED["kernels"].kmul["exact"] == 0
        and bf16_gemv_path(rows, cols) == ATEN_AVX2
    )


def use_rows_kernel(index: int | None) -> None:
    """The multi-row int8 kernel (class "int8_mm", an index of the table)
    that eager int8 layers give several rows of x; None: torch's."""
    _LOADED["int8_mm"] = index


def _rows_linear(
    x: Tensor, weights: list[Tensor], scales: list[Tensor]
) -> Tensor | None:
    """int8 layers for several rows of x (a prompt): eagerly, the chosen
    multi-row kernel (each row the bits it gets as a decode row); None
    where it does not apply."""
    index, kernels = _LOADED.get("int8_mm"), _LOADED["kernels"]
    k = x.shape[-1]
    if index is None or torch.compiler.is_compiling() or x.dtype not in _FLOAT_X:
        return None
    multiple = kernels.kmul["int8_mm"]
    if _operand_problem(x.new_empty(k), weights, scales, multiple) is not None:
        return None
    flat = x.reshape(-1, k).contiguous()
    out = kernels.matmul(flat, weights, scales, kernel=index)
    return out.view(*x.shape[:-1], out.shape[-1])


def linear(
    x: Tensor, weights: list[Tensor], scales: list[Tensor] | None = None
) -> list[Tensor] | None:
    """`[F.linear(x, w) for w in weights]` (int8: `x @ (w * s[:, None]).T`)
    for layers sharing x, in one kernel call. A decode row: inside
    torch.compile the fast or int8 kernel; eagerly int8, or the exact
    kernel where torch would add the same way (F.linear's bits). Several
    rows: eagerly int8, the multi-row kernel (`use_rows_kernel`). None
    where no kernel applies (the caller runs torch)."""
    if "kernels" not in _LOADED:
        return None
    if x.numel() != x.shape[-1]:  # several rows
        out = None if scales is None else _rows_linear(x, weights, scales)
        return None if out is None else _split(out, weights)
    multiple = _LOADED["kernels"].kmul["fast" if scales is None else "int8"]
    if _operand_problem(x.reshape(-1), weights, scales, multiple) is not None:
        return None
    if torch.compiler.is_compiling():
        if scales is None:
            out = torch.ops.qwen3_ch02.matvec(x, weights)
        else:
            out = torch.ops.qwen3_ch02.matvec_int8(x, weights, scales)
    elif scales is not None or all(_eager_exact(x, w) for w in weights):
        out = _matvec_impl(x, weights, scales, exact=scales is None)  # no dispatcher
    else:
        return None
    return _split(out, weights)


def _split(out: Tensor, weights: list[Tensor]) -> list[Tensor]:
    """A grouped product's output, one tensor per weight."""
    if len(weights) == 1:
        return [out]
    return list(out.split([w.shape[0] for w in weights], -1))
