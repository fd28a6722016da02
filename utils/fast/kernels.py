"""Matrix-vector products for single-token decoding on x86-64 CPUs.

Decoding one token makes every linear layer a matrix-vector product: each
weight is read once for one multiply-add, so memory speed sets the pace.
The C kernels (`csrc/kernels_*.c`) read bf16 weights and add in float32;
the int8 kernel multiplies int8 weights with the input rounded to 16-bit
fixed point (exact int32 sums), which keeps it at memory speed. Layers
sharing an input (q/k/v, gate/up) go through one grouped call.

Two bf16 classes: "exact" adds in the order of ATen's own bf16 dot, "fast"
(inside torch.compile graphs) orders the additions for speed. Eager
`linear` uses the exact kernel only where `F.linear` itself would run that
dot (`bf16_gemv_path`), so eager results are `F.linear`'s bits on every
CPU. The kernels are also torch operators, so compiled graphs can call them.
"""

from __future__ import annotations

import array
import functools
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from torch import Tensor

import utils.fast.build as build
from utils.device import torch_version

_FLOAT_X = (torch.bfloat16, torch.float32)


class Kernels:
    """The loaded kernel library with typed, checked calls (see `get_kernels`).
    `first[cls]` is the index of a class's reference kernel (the AVX2 one)."""

    def __init__(self, library: build.Library) -> None:
        self.library = library
        self.lib = library.lib
        self.path = library.path
        self.first: dict[str, int] = {}
        entries = library.lib.qwen3_kernels().decode("ascii").split(";")
        for i, entry in enumerate(e for e in entries if e):
            self.first.setdefault(entry.split(":")[1], i)

    def matvec(
        self,
        x: Tensor,
        weight: Tensor,
        scales: Tensor | None = None,
        *,
        exact: bool = False,
    ) -> Tensor:
        """`weight (n, k) @ x (k,)` -> (n,) in x's dtype (bf16 or float32).

        bf16 weight: the fast kernel, or with `exact=True` the one that adds
        like ATen's dot (k % 64 == 0). int8 weight: times `scales` (n,)
        float32 per row. Shapes, dtypes and contiguity are checked."""
        return self.matvec_multi(
            x, [weight], None if scales is None else [scales], exact=exact
        )

    def matvec_multi(
        self,
        x: Tensor,
        weights: list[Tensor],
        scales: list[Tensor] | None = None,
        *,
        exact: bool = False,
    ) -> Tensor:
        """`torch.cat([w @ x for w in weights])` in one call (one parallel
        region): the q/k/v or gate/up projections of one token at once."""
        cls = _class_of(weights, scales, exact)
        multiple = 64 if exact else 16
        return self._call(
            self.first[cls], x, weights, scales, multiple, f"{cls} kernel"
        )

    def matvec_with(
        self,
        index: int,
        x: Tensor,
        weights: list[Tensor],
        scales: list[Tensor] | None = None,
        threads: int | None = None,
    ) -> Tensor:
        """`matvec_multi` with kernel `index` of the library's table
        (`utils.fast.dispatch`). RuntimeError when it cannot run: code 1, k
        is not a multiple of the kernel's or the weights do not fit its
        class; 3, the CPU lacks its instructions."""
        _class_of(weights, scales, exact=False)  # bf16 alone or int8 + scales
        return self._call(index, x, weights, scales, 16, f"kernel {index}", threads)

    def _call(self, index, x, weights, scales, multiple, name, threads=None):
        """qwen3_matvec after checking the operands; the stacked result."""
        if not _operands_ok(x, weights, scales, multiple):
            _explain_operands(x, weights, scales, multiple)
        rows = [w.shape[0] for w in weights]
        y = torch.empty(sum(rows), dtype=x.dtype)
        # array.array: built ~10x faster than ctypes arrays (this runs about
        # a hundred times per token); they live until the call returns
        w_ptrs = array.array("Q", [w.data_ptr() for w in weights])
        s_ptrs = array.array("Q", [s.data_ptr() for s in scales or []])
        row_array = array.array("l", rows)
        rc = self.lib.qwen3_matvec(
            index, x.data_ptr(), x.dtype == torch.float32, len(weights),
            w_ptrs.buffer_info()[0], s_ptrs.buffer_info()[0] if scales else None,
            row_array.buffer_info()[0], y.data_ptr(), y.dtype == torch.float32,
            weights[0].shape[1],
            torch.get_num_threads() if threads is None else threads,
        )  # fmt: skip
        if rc:
            raise RuntimeError(f"{name} failed with code {rc}")
        return y


def _class_of(weights: list[Tensor], scales: list[Tensor] | None, exact: bool) -> str:
    """The kernel class for these weights (ValueError if none)."""
    if not weights:
        raise ValueError("matvec_multi needs at least one weight")
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


def _operands_ok(
    x: Tensor, weights: list[Tensor], scales: list[Tensor] | None, multiple: int
) -> bool:
    """Whether the kernel can read these tensors safely: the quick test
    (about a hundred calls per token); `_explain_operands` says why not."""
    if x.device.type != "cpu" or x.dtype not in _FLOAT_X or not x.is_contiguous():
        return False
    if x.dim() != 1 or x.shape[0] % multiple:
        return False
    k, dtype = x.shape[0], weights[0].dtype
    for w in weights:
        if w.dtype != dtype or w.dim() != 2 or w.shape[1] != k:
            return False
        if w.device.type != "cpu" or not w.is_contiguous():
            return False
    for w, sc in zip(weights, scales or [], strict=scales is not None):
        if sc.dtype != torch.float32 or sc.dim() != 1 or sc.shape[0] != w.shape[0]:
            return False
        if sc.device.type != "cpu" or not sc.is_contiguous():
            return False
    return True


def _explain_operands(
    x: Tensor, weights: list[Tensor], scales: list[Tensor] | None, multiple: int
) -> NoReturn:
    """Raise the ValueError that says what is wrong with a group's operands
    (for the first weight that has a problem)."""
    dtype = weights[0].dtype
    for i, w in enumerate(weights):
        if w.dtype != dtype:
            raise ValueError(f"weights differ in dtype: {dtype} and {w.dtype}")
        s = None if scales is None else scales[i]
        bad = [
            f"{name} must be a contiguous CPU tensor"
            for name, t in (("x", x), ("weight", w), ("scales", s))
            if t is not None and (t.device.type != "cpu" or not t.is_contiguous())
        ]
        if w.dim() != 2:
            bad.append(f"weight must be 2-D, got shape {tuple(w.shape)}")
        else:
            n, k = w.shape
            if k % multiple:
                bad.append(f"weight columns ({k}) must be a multiple of {multiple}")
            if x.dtype not in _FLOAT_X or x.shape != (k,):
                bad.append(
                    f"x must be ({k},) bf16 or float32, got {tuple(x.shape)} {x.dtype}"
                )
            if s is not None and (s.dtype != torch.float32 or s.shape != (n,)):
                bad.append(
                    f"scales must be ({n},) float32, got {tuple(s.shape)} {s.dtype}"
                )
        if bad:
            raise ValueError("; ".join(bad))
    raise ValueError("the kernel cannot read these tensors")  # not reached


# The kernels loaded in this process (set once by `get_kernels`), looked up
# by the operators below on every call, and the operator library itself
_LOADED: dict[str, Any] = {}


@functools.cache
def _kernels_for(library: build.Library) -> Kernels:
    kernels = Kernels(library)
    _LOADED.setdefault("kernels", kernels)
    _register_ops()
    return kernels


def get_kernels(testing: bool = False) -> Kernels | None:
    """The compiled kernels, building them on first use; None (after one
    line on stderr saying why) where they cannot be built or loaded.
    `testing`: the library's test build (for the tests)."""
    library = build.get_library(testing)
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

    def gemv_path(self, rows: int, cols: int, mkldnn_enabled: bool) -> str:
        """See `bf16_gemv_path`."""
        if self.torch_version != (2, 10):
            return "unverified"
        onednn = self.mkldnn_built and mkldnn_enabled and self.onednn_bf16
        if onednn and self.avx512_bf16 and rows * cols > 16 * 16 * 16:
            return "onednn"
        if self.openblas:
            return "openblas"
        if self.capability in ("AVX2", "AVX512"):
            return ATEN_AVX2
        return f"aten-{self.capability.lower()}"


@functools.cache
def torch_cpu() -> TorchCPU:
    """The facts of this process's torch and CPU that `bf16_gemv_path` uses."""
    mkldnn = torch.backends.mkldnn.is_available()
    onednn_bf16 = bool(mkldnn and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    avx512_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    return TorchCPU(
        torch_version=torch_version(),
        mkldnn_built=mkldnn,
        onednn_bf16=onednn_bf16,
        avx512_bf16=bool(avx512_bf16()),
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
    w a bf16 (rows, cols) matrix, on an x86-64 CPU.

    `F.linear` -> `mm` -> `addmm_impl_cpu_` -> `cpublas::gemm` (bf16, transa,
    n == 1; aten/src/ATen/native/LinearAlgebra.cpp, CPUBlas.cpp) tries
    oneDNN (`mkldnn_bf16_gemm`) where the CPU has AVX512_BF16; it takes the
    product when mkldnn is enabled, its bf16 check passes and rows * cols >
    16**3 (mkldnn/Matmul.cpp): "onednn". Else an OpenBLAS build may call
    sbgemm: "openblas". Else ATen's `bf16_gemv_trans` (cpu/
    ReducedPrecisionFloatGemvFastPathKernel.cpp; REGISTER_DISPATCH leaves
    the AVX512 slot empty, so the AVX2 code runs at both capabilities):
    "aten-avx2", the exact kernel's sums; at ATEN_CPU_CAPABILITY=default its
    scalar code: "aten-default". Other torch versions: "unverified".
    `mkldnn_enabled` and `cpu` default to this process's."""
    if mkldnn_enabled is None:
        mkldnn_enabled = torch.backends.mkldnn.enabled
    return (cpu or torch_cpu()).gemv_path(rows, cols, bool(mkldnn_enabled))


def kernel_rounds_like_torch(rows: int, cols: int) -> bool:
    """Whether torch's bf16 `F.linear` of one row with a (rows, cols) weight
    gives exactly the exact kernel's bits here (see `bf16_gemv_path`)."""
    mkldnn_enabled = torch.backends.mkldnn.enabled
    return torch_cpu().gemv_path(rows, cols, mkldnn_enabled) == ATEN_AVX2


# torch operators, so torch.compile can call the kernels from its graphs


def _matvec_impl(x: Tensor, weight: Tensor, scales: Tensor | None = None) -> Tensor:
    return _matvec_cat_impl(x, [weight], None if scales is None else [scales])


def _matvec_cat_impl(
    x: Tensor, weights: list[Tensor], scales: list[Tensor] | None = None
) -> Tensor:
    flat = x.reshape(-1).contiguous()
    out = _LOADED["kernels"].matvec_multi(flat, list(weights), scales)
    return out.view(*x.shape[:-1], out.shape[0])


def _fake_matvec(x, weight, *rest):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _fake_matvec_cat(x, weights, *rest):
    return x.new_empty(*x.shape[:-1], sum(w.shape[0] for w in weights))


def _register_ops() -> None:
    """Define torch.ops.qwen3_ch02.matvec[_int8][_cat] once per process
    (`torch.library.Library` rather than `custom_op`: a third of the
    per-call overhead, at a hundred or more calls per token)."""
    if "library" in _LOADED:
        return
    lib = torch.library.Library("qwen3_ch02", "DEF")
    lib.define("matvec(Tensor x, Tensor weight) -> Tensor")
    lib.define("matvec_int8(Tensor x, Tensor weight, Tensor scales) -> Tensor")
    lib.define("matvec_cat(Tensor x, Tensor[] weights) -> Tensor")
    lib.define("matvec_int8_cat(Tensor x, Tensor[] weights, Tensor[] scales) -> Tensor")
    # Python-level indirection, so a test can count the calls
    lib.impl("matvec", lambda x, w: _matvec_impl(x, w), "CPU")
    lib.impl("matvec_int8", lambda x, w, s: _matvec_impl(x, w, s), "CPU")
    lib.impl("matvec_cat", lambda x, ws: _matvec_cat_impl(x, ws), "CPU")
    lib.impl("matvec_int8_cat", lambda x, ws, ss: _matvec_cat_impl(x, ws, ss), "CPU")
    for name in ("matvec", "matvec_int8", "matvec_cat", "matvec_int8_cat"):
        fake = _fake_matvec_cat if name.endswith("_cat") else _fake_matvec
        torch.library.register_fake(f"qwen3_ch02::{name}", fake, lib=lib)
    _LOADED["library"] = lib


# What the layers call


def supports(x: Tensor, weight: Tensor) -> bool:
    """Whether the kernel handles `x @ weight.T`: one CPU row (decode), K a
    multiple of 16, contiguous bf16/int8 weight, bf16/float32 activations."""
    return (
        x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.dtype in _FLOAT_X
        and weight.dtype in (torch.bfloat16, torch.int8)
        and weight.dim() == 2
        and weight.is_contiguous()
        and x.shape[-1] == weight.shape[1]
        and weight.shape[1] % 16 == 0
        and x.numel() == x.shape[-1]
    )


def _eager_exact(x: Tensor, weight: Tensor) -> bool:
    """Whether eager code may use the exact kernel for `F.linear(x, weight)`:
    same dtypes (as F.linear needs) and torch would add the same way."""
    rows, cols = weight.shape
    return (
        x.dtype == weight.dtype
        and cols % 64 == 0
        and kernel_rounds_like_torch(rows, cols)
    )


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """`F.linear(x, weight)`, through a kernel where one applies: the fast
    kernel inside torch.compile, the exact one eagerly where torch itself
    would add the same way, so eager results are F.linear's bits."""
    if weight.dtype == torch.bfloat16 and "kernels" in _LOADED and supports(x, weight):
        if torch.compiler.is_compiling():  # traced: an operator in the graph
            return torch.ops.qwen3_ch02.matvec(x, weight)
        if _eager_exact(x, weight):
            flat = x.reshape(-1).contiguous()  # eager: skip the dispatcher
            out = _LOADED["kernels"].matvec(flat, weight, exact=True)
            return out.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight)


def int8_linear(x: Tensor, weight: Tensor, scales: Tensor) -> Tensor:
    """Weight-only int8 `x @ (weight * scales[:, None]).T` for one CPU row
    (the kernel when loaded, else torch's int8 matmul); checks its inputs."""
    if not supports(x, weight) or weight.dtype != torch.int8:
        raise ValueError(
            "int8_linear handles one CPU row x (..., k) with a contiguous "
            f"int8 weight (n, k), k % 16 == 0; got x {tuple(x.shape)} {x.dtype}, "
            f"weight {tuple(weight.shape)} {weight.dtype}"
        )
    if not scales.is_floating_point() or scales.shape != weight.shape[:1]:
        raise ValueError(
            f"scales must be a float tensor of shape ({weight.shape[0]},), one "
            f"per weight row; got {tuple(scales.shape)} {scales.dtype}"
        )
    if not scales.is_contiguous():
        raise ValueError("scales must be contiguous (call .contiguous() first)")
    scales = scales.to(torch.float32)
    if "kernels" not in _LOADED:
        out = torch._weight_int8pack_mm(x.reshape(1, -1), weight, scales.to(x.dtype))
        return out.view(*x.shape[:-1], weight.shape[0])
    if torch.compiler.is_compiling():
        return torch.ops.qwen3_ch02.matvec_int8(x, weight, scales)
    return _matvec_impl(x, weight, scales)


def linear_group(x: Tensor, weights: list[Tensor]) -> list[Tensor]:
    """`[linear(x, w) for w in weights]` (bias-free, same x) as one kernel
    call where the kernel applies (q/k/v, gate/up), with the same bits."""
    ok = (
        "kernels" in _LOADED
        and len(weights) > 1
        and all(w.dtype == torch.bfloat16 and supports(x, w) for w in weights)
    )
    if ok:
        sizes = [w.shape[0] for w in weights]
        if torch.compiler.is_compiling():
            return list(torch.ops.qwen3_ch02.matvec_cat(x, weights).split(sizes, -1))
        if all(_eager_exact(x, w) for w in weights):
            flat = x.reshape(-1).contiguous()
            out = _LOADED["kernels"].matvec_multi(flat, weights, exact=True)
            out = out.view(*x.shape[:-1], out.shape[0])
            return list(out.split(sizes, -1))
    return [linear(x, w) for w in weights]


def int8_linear_group(
    x: Tensor, weights: list[Tensor], scales: list[Tensor]
) -> list[Tensor]:
    """`[int8_linear(x, w, s) ...]` for int8 weights sharing x, as one
    kernel call where the kernel is loaded."""
    ok = (
        "kernels" in _LOADED
        and all(w.dtype == torch.int8 and supports(x, w) for w in weights)
        and all(
            s.dtype == torch.float32 and s.is_contiguous() and s.shape == w.shape[:1]
            for w, s in zip(weights, scales, strict=True)
        )
    )
    if not ok:
        return [int8_linear(x, w, s) for w, s in zip(weights, scales, strict=True)]
    sizes = [w.shape[0] for w in weights]
    if torch.compiler.is_compiling():
        out = torch.ops.qwen3_ch02.matvec_int8_cat(x, weights, scales)
    else:
        out = _matvec_cat_impl(x, weights, scales)
    return list(out.split(sizes, -1))
