"""Matrix-vector kernels for single-token decoding on x86-64 CPUs.

When one token is decoded, every linear layer is a matrix-vector product:
each weight is read once and used for one multiply-add, so the speed is set
by how fast the weights stream from memory. The small C kernels in
`cpu_matvec.c` read bf16 weights with AVX2, convert them to float32 in
registers, accumulate in float32 and round the result once. The int8
kernel multiplies int8 weights with the input rounded to 16-bit fixed point
(`vpmaddwd`, exact int32 sums), which keeps it at memory speed on AVX2
where converting every weight to float32 was compute-bound (about 10 GB/s
against 16 GB/s measured on a 2-core EPYC VM). Layers that share an input
(q/k/v, gate/up) go through one grouped call (`linear_group`), so each
token makes 4 calls per layer instead of 7.

Two bf16 kernels: `exact` adds in the same order as PyTorch's own AVX2 code
(ATen's bf16 dot), so where PyTorch takes that path its result is
bit-identical to `F.linear`; the other, used inside torch.compile graphs,
orders the additions for speed. Which path PyTorch takes depends on the CPU:
on CPUs with AVX-512 (BF16) it calls oneDNN, which rounds differently. So
eager code uses the exact kernel only where a one-time probe shows that
`F.linear` gives the same bits (`kernel_rounds_like_torch`), and `F.linear`
itself elsewhere: eager results always equal `F.linear`'s.

Why ctypes and the system C compiler rather than
`torch.utils.cpp_extension.load_inline`: the kernel is plain C (no torch
headers), so it builds in about a second with any gcc or clang, without
Python headers or ninja; a torch extension takes tens of seconds to build,
and needs a C++ toolchain matching PyTorch's (MSVC on Windows). Windows,
ARM (Apple silicon) and compilers that are missing simply get `F.linear`;
Apple clang without OpenMP builds a single-threaded kernel.

The library is built on first use and cached (see `kernel_cache_dir`) under
a name that hashes the C file, the compiler (path and version) and the flags.
It is only loaded from a folder that the user owns and nobody else may write,
after its SHA-256 matches the record written at build time; a new build goes
to a fresh file name and is renamed into place, so a library another process
has mapped is never changed. Whatever goes wrong, `get_kernels()` returns
None after one printed line, and callers use `F.linear`.
"""

from __future__ import annotations

import array
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from utils.fileio import atomic_write_bytes

__all__ = [
    "Kernels",
    "get_kernels",
    "kernel_cache_dir",
    "kernel_rounds_like_torch",
    "linear",
    "int8_linear",
    "int8_linear_group",
    "linear_group",
    "supports",
]

SOURCE = Path(__file__).with_name("cpu_matvec.c")
_FLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-shared", "-fPIC"]
_OPENMP = "-fopenmp"
_ABI = 0x40000  # qwen3_matvec_abi() in cpu_matvec.c, plus 1 with OpenMP
# entry point -> number of weight-side arrays (weight [, scales])
_ENTRIES = {
    "qwen3_matvec_bf16": 1,
    "qwen3_matvec_bf16_exact": 1,
    "qwen3_matvec_int8": 2,
}
# grouped entry points (several weights, one input): name -> weight-side arrays
_MULTI = {
    "qwen3_matvec_bf16_multi": 1,
    "qwen3_matvec_bf16_exact_multi": 1,
    "qwen3_matvec_int8_multi": 2,
}


def kernel_cache_dir() -> Path:
    """Where compiled kernels are kept ($QWEN3_KERNEL_CACHE overrides)."""
    env = os.environ.get("QWEN3_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "qwen3-ch02" / "kernels"


def _find_compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        found = shutil.which(name) if name else None
        if found:
            return os.path.realpath(found)
    return None


def _compiler_id(compiler: str) -> str:
    """The compiler's path and its version line (part of the cache key)."""
    try:
        proc = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30
        )
        version = (proc.stdout or proc.stderr).strip().splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        version = []
    return f"{compiler} {version[0] if version else '?'}"


def _unsupported_reason() -> str | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs an x86-64 CPU (this is {platform.machine()})"
    if platform.system() == "Windows":
        return "building the kernel with MSVC is not supported"
    # The CPU's own flags (cpuinfo), not ATEN_CPU_CAPABILITY's choice
    has_avx2 = getattr(torch.cpu, "_is_avx2_supported", None)
    if has_avx2 is None:
        capability = torch.backends.cpu.get_cpu_capability()
        if capability not in ("AVX2", "AVX512"):
            return f"needs AVX2 (torch reports {capability})"
    elif not has_avx2():
        return "needs a CPU with AVX2"
    return None


def _check_private_dir(path: Path) -> None:
    """Refuse a folder that another user owns or may write into."""
    info = path.stat()
    getuid = getattr(os, "getuid", None)
    if getuid is not None and info.st_uid != getuid():
        raise RuntimeError(
            f"{path} belongs to another user; set QWEN3_KERNEL_CACHE to a "
            "folder of your own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeError(
            f"{path} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}); run `chmod go-w {path}` or set "
            "QWEN3_KERNEL_CACHE to a private folder"
        )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _verified(path: Path) -> bool:
    """Whether `path` is the complete library its build recorded."""
    try:
        _check_private_dir(path)  # the file itself: ours, not writable by others
        return _record(path).read_text().strip() == _sha256(path)
    except (OSError, RuntimeError):
        return False


@dataclass(frozen=True)
class Kernels:
    """The loaded kernel library (one per process, see `get_kernels`)."""

    lib: ctypes.CDLL
    path: Path
    openmp: bool

    def matvec(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        scales: torch.Tensor | None = None,
        *,
        exact: bool = False,
    ) -> torch.Tensor:
        """`weight (n, k) @ x (k,)` -> (n,) in x's dtype (bf16 or float32).

        bf16 weight: the fast kernel, or with `exact=True` the one that adds
        like torch's AVX2 code (k % 64 == 0). int8 weight: times `scales`
        (n,) float32 per row, x rounded to 16-bit fixed point (see the C
        file). Shapes, dtypes and contiguity are checked."""
        return self.matvec_multi(
            x, [weight], None if scales is None else [scales], exact=exact
        )

    def matvec_multi(
        self,
        x: torch.Tensor,
        weights: list[torch.Tensor],
        scales: list[torch.Tensor] | None = None,
        *,
        exact: bool = False,
    ) -> torch.Tensor:
        """`torch.cat([w @ x for w in weights])` in one call (one parallel
        region): the q/k/v or gate/up projections of one token at once."""
        if not weights:
            raise ValueError("matvec_multi needs at least one weight")
        dtype = weights[0].dtype
        if dtype == torch.int8 and scales is not None:
            name = "qwen3_matvec_int8_multi"
        elif dtype == torch.bfloat16 and scales is None:
            name = (
                "qwen3_matvec_bf16_exact_multi" if exact else "qwen3_matvec_bf16_multi"
            )
        else:
            raise ValueError(
                "matvec takes bf16 weights, or int8 weights with scales; "
                f"got {dtype} weights and scales {scales is not None}"
            )
        if scales is not None and len(scales) != len(weights):
            raise ValueError(f"{len(weights)} weights but {len(scales)} scales")
        multiple = 64 if exact else 16
        if not _operands_ok(x, weights, scales, dtype, multiple):
            for i, w in enumerate(weights):  # say what is wrong
                if w.dtype != dtype:
                    raise ValueError(f"weights differ in dtype: {dtype} and {w.dtype}")
                _check_operands(x, w, None if scales is None else scales[i], multiple)
            raise ValueError("the kernel cannot read these tensors")  # not reached
        count = len(weights)
        rows = [w.shape[0] for w in weights]
        y = torch.empty(sum(rows), dtype=x.dtype)
        # array.array: C arrays built ~10x faster than ctypes arrays (this
        # runs ~100 times per token); they live until the call returns
        arrays = [array.array("Q", [w.data_ptr() for w in weights])]
        if scales is not None:
            arrays.append(array.array("Q", [s.data_ptr() for s in scales]))
        row_array = array.array("l", rows)
        rc = getattr(self.lib, name)(
            x.data_ptr(), x.dtype == torch.float32, count,
            *(a.buffer_info()[0] for a in arrays), row_array.buffer_info()[0],
            y.data_ptr(), y.dtype == torch.float32, weights[0].shape[1],
            torch.get_num_threads(),
        )  # fmt: skip
        if rc:
            raise RuntimeError(f"{name} failed with code {rc}")
        return y


_FLOAT_X = (torch.bfloat16, torch.float32)


def _operands_ok(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    scales: list[torch.Tensor] | None,
    dtype: torch.dtype,
    multiple: int,
) -> bool:
    """The checks of `_check_operands` for a whole group, quickly (about a
    hundred calls per token); False sends the caller to the one that explains."""
    if x.device.type != "cpu" or x.dtype not in _FLOAT_X or not x.is_contiguous():
        return False
    if x.dim() != 1:
        return False
    k = x.shape[0]
    if k % multiple:
        return False
    for w in weights:
        if (
            w.dtype != dtype
            or w.dim() != 2
            or w.shape[1] != k
            or w.device.type != "cpu"
            or not w.is_contiguous()
        ):
            return False
    if scales is not None:
        for w, sc in zip(weights, scales, strict=True):
            if (
                sc.dtype != torch.float32
                or sc.dim() != 1
                or sc.shape[0] != w.shape[0]
                or sc.device.type != "cpu"
                or not sc.is_contiguous()
            ):
                return False
    return True


def _check_operands(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None, multiple: int
) -> None:
    """ValueError unless the kernel can read these tensors safely."""
    problems = []
    for name, t in (("x", x), ("weight", weight), ("scales", scales)):
        if t is not None and (t.device.type != "cpu" or not t.is_contiguous()):
            problems.append(f"{name} must be a contiguous CPU tensor")
    if weight.dim() != 2:
        problems.append(f"weight must be 2-D, got shape {tuple(weight.shape)}")
    else:
        n, k = weight.shape
        if k % multiple:
            problems.append(f"weight columns ({k}) must be a multiple of {multiple}")
        if x.dtype not in (torch.bfloat16, torch.float32) or x.shape != (k,):
            problems.append(
                f"x must be ({k},) bf16 or float32, got {tuple(x.shape)} {x.dtype}"
            )
        bad = scales is not None and (
            scales.dtype != torch.float32 or scales.shape != (n,)
        )
        if bad:
            problems.append(
                f"scales must be ({n},) float32, "
                f"got {tuple(scales.shape)} {scales.dtype}"
            )
    if problems:
        raise ValueError("; ".join(problems))


def _load(path: Path) -> Kernels:
    """Open the library and bind its entry points (OSError/RuntimeError if
    it is not the library built from cpu_matvec.c)."""
    lib = ctypes.CDLL(str(path))
    p, i, long_ = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    try:
        abi = lib.qwen3_matvec_abi
        abi.argtypes, abi.restype = [], i
        for name, arrays in _ENTRIES.items():
            fn = getattr(lib, name)
            fn.argtypes = [p, i, *[p] * arrays, p, i, long_, long_, i]
            fn.restype = i
        for name, arrays in _MULTI.items():
            fn = getattr(lib, name)
            fn.argtypes = [p, i, i, *[p] * arrays, p, p, i, long_, i]
            fn.restype = i
        step = lib.qwen3_decode_step  # see utils.native_step
        step.argtypes = [p, ctypes.c_double, p, long_, long_, i, p, p, i]
        step.restype = i
        vec = lib.qwen3_vector_op  # the step's bf16 rounding and exp (tests)
        vec.argtypes, vec.restype = [i, p, p, long_], i
    except AttributeError as exc:
        raise RuntimeError(f"{path.name} lacks the kernel entry points") from exc
    version = abi()
    if version & ~1 != _ABI:
        raise RuntimeError(f"{path.name} is kernel version {version:#x}, not {_ABI:#x}")
    return Kernels(lib, path, openmp=bool(version & 1))


def _compile(compiler: str, flags: list[str], cache_dir: Path) -> Path:
    """Compile cpu_matvec.c to a fresh file in `cache_dir`; returns its path."""
    fd, out = tempfile.mkstemp(dir=cache_dir, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        proc = subprocess.run(
            [compiler, *flags, str(SOURCE), "-o", out],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.SubprocessError):
        Path(out).unlink(missing_ok=True)
        raise
    if proc.returncode != 0:
        Path(out).unlink(missing_ok=True)
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(
            f"{Path(compiler).name} failed: {detail[0] if detail else proc.returncode}"
        )
    os.chmod(out, 0o755)  # the linker applies the umask (maybe group-writable)
    return Path(out)


def _build_and_load(cache_dir: Path) -> Kernels:
    """The cached library if it verifies and loads, else a fresh build:
    with OpenMP, or single-threaded where the compiler rejects -fopenmp."""
    compiler = _find_compiler()
    if compiler is None:
        raise RuntimeError(
            "no C compiler found (install gcc, e.g. `sudo apt install "
            "build-essential`, or set CC)"
        )
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private_dir(cache_dir)
    ident = _compiler_id(compiler)
    source = SOURCE.read_bytes()
    error: Exception | None = None
    for flags in ([*_FLAGS, _OPENMP], _FLAGS):
        key = hashlib.sha256(
            b"\0".join([source, ident.encode(), " ".join(flags).encode()])
        ).hexdigest()[:16]
        target = cache_dir / f"qwen3_matvec_{key}.so"
        kernels = None
        if _verified(target):
            try:
                kernels = _load(target)
            except (OSError, RuntimeError):
                pass  # rebuild below, under a new name, then rename
        if kernels is None:
            try:
                fresh = _compile(compiler, flags, cache_dir)
            except RuntimeError as exc:
                error = error or exc
                continue
            try:
                kernels = _load(fresh)  # loaded before the rename: never replaced
                digest = _sha256(fresh)
                os.replace(fresh, target)
                atomic_write_bytes(_record(target), digest.encode())
            finally:
                fresh.unlink(missing_ok=True)
        if _OPENMP not in flags:
            print(
                f"cpu_matvec: {Path(compiler).name} rejected {_OPENMP} "
                f"({error}); the kernel runs on one thread"
            )
        return Kernels(kernels.lib, target, kernels.openmp)
    assert error is not None
    raise error


# The kernels loaded in this process (set once by `_get_kernels`), looked up
# by the operators below on every call, and the operator library itself
_LOADED: dict[str, Any] = {}


@functools.cache
def _get_kernels(cache_dir: str) -> Kernels | None:
    reason = _unsupported_reason()
    if reason is None:
        try:
            kernels = _build_and_load(Path(cache_dir))
            _LOADED.setdefault("kernels", kernels)
            _register_ops()
            return kernels
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            lines = str(exc).strip().splitlines()
            reason = lines[0][:200] if lines else type(exc).__name__
    print(f"cpu_matvec: using torch's matmul instead of the AVX2 kernel ({reason})")
    return None


def get_kernels() -> Kernels | None:
    """The compiled kernels, building them on first use; None (after one
    printed line saying why) where they cannot be built or loaded."""
    return _get_kernels(str(kernel_cache_dir()))


# Per setting of torch.backends.mkldnn.enabled: does F.linear round like
# the exact kernel? (see kernel_rounds_like_torch)
_PROBES: dict[bool, bool] = {}


def kernel_rounds_like_torch() -> bool:
    """Whether torch's bf16 `F.linear` on one row gives exactly the exact
    kernel's bits on this machine (its AVX2 path; not oneDNN on AVX-512 BF16
    CPUs, nor ATEN_CPU_CAPABILITY=default). Probed once per mkldnn setting."""
    kernels = _LOADED.get("kernels")
    if kernels is None:
        return False
    key = bool(torch.backends.mkldnn.enabled)
    if key not in _PROBES:
        gen = torch.Generator().manual_seed(20250601)
        same = True
        with torch.inference_mode():
            for k in (1024, 3072):
                w = torch.randn(256, k, generator=gen).to(torch.bfloat16)
                x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
                got = kernels.matvec(x[0], w, exact=True)
                same = same and torch.equal(got, F.linear(x, w)[0])
        _PROBES[key] = same
    return _PROBES[key]


# ---------------------------------------------------------------------------
# torch operators (so torch.compile can call the kernels from its graphs)
# ---------------------------------------------------------------------------


def _matvec_impl(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None = None
) -> torch.Tensor:
    return _matvec_cat_impl(x, [weight], None if scales is None else [scales])


def _matvec_cat_impl(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    scales: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    flat = x.reshape(-1).contiguous()
    out = _LOADED["kernels"].matvec_multi(flat, list(weights), scales)
    return out.view(*x.shape[:-1], out.shape[0])


def _fake_matvec(x, weight, *rest):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _fake_matvec_cat(x, weights, *rest):
    return x.new_empty(*x.shape[:-1], sum(w.shape[0] for w in weights))


def _register_ops() -> None:
    """Define torch.ops.qwen3_ch02.matvec[_int8][_cat] once per process.
    (`torch.library.Library` rather than `custom_op`: a third of the
    per-call overhead, which matters at ~100-200 calls per token.)"""
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
    for name, fake in (
        ("matvec", _fake_matvec),
        ("matvec_int8", _fake_matvec),
        ("matvec_cat", _fake_matvec_cat),
        ("matvec_int8_cat", _fake_matvec_cat),
    ):
        torch.library.register_fake(f"qwen3_ch02::{name}", fake, lib=lib)
    _LOADED["library"] = lib


# ---------------------------------------------------------------------------
# What callers use
# ---------------------------------------------------------------------------


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel handles `x @ weight.T`: one CPU row (decode), K a
    multiple of 16, contiguous bf16/int8 weight, bf16/float32 activations."""
    return (
        x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.dtype in (torch.bfloat16, torch.float32)
        and weight.dtype in (torch.bfloat16, torch.int8)
        and weight.dim() == 2
        and weight.is_contiguous()
        and x.shape[-1] == weight.shape[1]
        and weight.shape[1] % 16 == 0
        and x.numel() == x.shape[-1]
    )


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight)`, through a kernel where one applies.

    Inside torch.compile (kernels loaded, `supports` true) the fast kernel;
    eagerly the exact kernel, only where `kernel_rounds_like_torch()`, so
    eager results are always F.linear's own bits.
    """
    if weight.dtype == torch.bfloat16 and "kernels" in _LOADED and supports(x, weight):
        if torch.compiler.is_compiling():  # traced: an operator in the graph
            return torch.ops.qwen3_ch02.matvec(x, weight)
        if weight.shape[1] % 64 == 0 and kernel_rounds_like_torch():
            flat = x.reshape(-1).contiguous()  # eager: skip the dispatcher
            out = _LOADED["kernels"].matvec(flat, weight, exact=True)
            return out.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight)


def int8_linear(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor
) -> torch.Tensor:
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
        out = torch._weight_int8pack_mm(
            x.reshape(1, -1), weight, scales.to(x.dtype)
        )  # fmt: skip
        return out.view(*x.shape[:-1], weight.shape[0])
    if torch.compiler.is_compiling():
        return torch.ops.qwen3_ch02.matvec_int8(x, weight, scales)
    return _matvec_impl(x, weight, scales)


def linear_group(x: torch.Tensor, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """`[F.linear(x, w) for w in weights]` (bias-free, same x), as one kernel
    call where the kernel applies (the q/k/v or gate/up projections); each
    result has the bits `linear(x, w)` would give."""
    ok = (
        "kernels" in _LOADED
        and len(weights) > 1
        and all(w.dtype == torch.bfloat16 and supports(x, w) for w in weights)
    )
    if ok:
        sizes = [w.shape[0] for w in weights]
        if torch.compiler.is_compiling():
            return list(torch.ops.qwen3_ch02.matvec_cat(x, weights).split(sizes, -1))
        if weights[0].shape[1] % 64 == 0 and kernel_rounds_like_torch():
            flat = x.reshape(-1).contiguous()
            out = _LOADED["kernels"].matvec_multi(flat, weights, exact=True)
            out = out.view(*x.shape[:-1], out.shape[0])
            return list(out.split(sizes, -1))
    return [linear(x, w) for w in weights]


def int8_linear_group(
    x: torch.Tensor, weights: list[torch.Tensor], scales: list[torch.Tensor]
) -> list[torch.Tensor]:
    """`[int8_linear(x, w, s) ...]` for several int8 weights sharing x, as
    one kernel call where the kernel is loaded."""
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
