"""Build and load the fast decoder's C library (`csrc/`), once per machine.

Why ctypes and the system C compiler rather than
`torch.utils.cpp_extension.load_inline`: the code is plain C (no torch
headers), so it builds in about a second with any gcc or clang, without
Python headers or ninja; a torch extension takes tens of seconds to build
and needs a C++ toolchain matching PyTorch's (MSVC on Windows). Windows,
ARM (Apple silicon) and machines without a compiler simply get torch's own
matmul; a compiler without OpenMP builds a single-threaded library.

The library is cached (see `kernel_cache_dir`) under a name that hashes the
sources, the compiler (path and version) and the flags. It is only loaded
from a folder that the user owns and nobody else may write, after its
SHA-256 matches the record written at build time; a new build goes to a
fresh file name and is renamed into place, so a library another process
has mapped is never changed. A library that lacks an entry point or
reports another ABI version is rebuilt.
"""

from __future__ import annotations

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

import torch

from utils.fileio import atomic_write_bytes

__all__ = ["Library", "get_library", "kernel_cache_dir", "unsupported_reason"]

CSRC = Path(__file__).with_name("csrc")
# compiled together into one library
SOURCES = ("matvec.c", "variants.c", "decode_step.c", "step_ops.c", "step_reference.c")
_FLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-shared", "-fPIC"]
_OPENMP = "-fopenmp"
ABI = 0x80000  # qwen3_matvec_abi() in csrc/matvec.c, plus 1 with OpenMP

# Entry points and their ctypes argument types (see csrc/matvec.c,
# csrc/variants.c, csrc/decode_step.c and csrc/step_reference.c); a new
# kernel variant needs none (it is a line of the table in variants.c).
_P, _I, _L, _D = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_double
_SINGLE = [_P, _I, _P, _P, _I, _L, _L, _I]  # x, x_f32, w, y, y_f32, n, k, threads
_MULTI = [_P, _I, _I, _P, _P, _P, _I, _L, _I]  # x, x_f32, count, w[], n[], y, ...
ENTRY_POINTS: dict[str, tuple[list, type]] = {
    "qwen3_matvec_abi": ([], _I),
    "qwen3_matvec_bf16": (_SINGLE, _I),
    "qwen3_matvec_bf16_exact": (_SINGLE, _I),
    "qwen3_matvec_int8": ([_P, _I, _P, _P, _P, _I, _L, _L, _I], _I),
    "qwen3_matvec_bf16_multi": (_MULTI, _I),
    "qwen3_matvec_bf16_exact_multi": (_MULTI, _I),
    "qwen3_matvec_int8_multi": ([_P, _I, _I, _P, _P, _P, _P, _I, _L, _I], _I),
    # dims, eps, table, &token, &pos (int64), variants[2], logits, next, threads
    "qwen3_decode_step": ([_P, _D, _P, _P, _P, _P, _P, _P, _I], _I),
    "qwen3_step_products": ([_P, _P, _P, _I], _I),  # dims, table, variants, threads
    "qwen3_step_layout": ([], ctypes.c_char_p),
    # the kernel variants: CPU features, the table, one call, a hot loop
    "qwen3_cpu_feature_names": ([], ctypes.c_char_p),
    "qwen3_cpu_features": ([], _I),
    "qwen3_limit_cpu_features": ([_I], _I),
    "qwen3_variant_table": ([], ctypes.c_char_p),
    "qwen3_matvec_variant": ([_I, _P, _I, _I, _P, _P, _P, _P, _I, _L, _I], _I),
    "qwen3_variant_hot": ([_I, _P, _P, _P, _L, _L, _I, _P], _I),
    "qwen3_stolen_passes": ([_I], _L),
    "qwen3_step_clocks": ([_I, _P], None),  # on, out: long long[2 + 5]
    # for the tests: the step's pieces and their first forms, rounding, exp
    "qwen3_piece_attend": ([_I, _P, _P, _P, _L, _L, _L, _P, _P], _I),
    "qwen3_piece_norm_rope": ([_I, _P, _L, _P, _D, _P, _P, _P], _I),
    "qwen3_piece_argmax": ([_I, _P, _L], _L),
    "qwen3_piece_quantize": ([_I, _P, _L, _P], _I),
    "qwen3_vector_op": ([_I, _P, _P, _L], _I),
}


@dataclass(frozen=True, eq=False)  # one per process: hashed by identity
class Library:
    """The loaded C library: its ctypes handle, file, whether it was built
    with OpenMP, and the decode step's table layout it reports (section ->
    slot names in order: "global", "layer", "dims")."""

    lib: ctypes.CDLL
    path: Path
    openmp: bool
    layout: dict[str, tuple[str, ...]]


def kernel_cache_dir() -> Path:
    """Where compiled libraries are kept ($QWEN3_KERNEL_CACHE overrides)."""
    env = os.environ.get("QWEN3_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "qwen3-ch02" / "kernels"


def find_compiler() -> str | None:
    """The C compiler to use: $CC, else cc, gcc or clang on PATH."""
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


def unsupported_reason() -> str | None:
    """Why the library cannot run on this machine (None: it can)."""
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


def check_private_dir(path: Path) -> None:
    """Refuse a folder (or file) that another user owns or may write into."""
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


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_path(path: Path) -> Path:
    """The file holding `path`'s SHA-256 as written at build time."""
    return path.with_name(path.name + ".sha256")


def verified(path: Path) -> bool:
    """Whether `path` is the complete library its build recorded."""
    try:
        check_private_dir(path)  # the file itself: ours, not writable by others
        return record_path(path).read_text().strip() == sha256(path)
    except (OSError, RuntimeError):
        return False


def parse_layout(text: str) -> dict[str, tuple[str, ...]]:
    """`qwen3_step_layout()`'s "global:A,B,;layer:...;dims:..." as a dict."""
    layout = {}
    for section in text.split(";"):
        name, _, names = section.partition(":")
        layout[name] = tuple(n for n in names.split(",") if n)
    return layout


def load(path: Path) -> Library:
    """Open the library and bind its entry points; OSError/RuntimeError if
    it is not a library built from csrc/ with this ABI and a readable table
    layout (utils.fast.native checks the layout's names against its own)."""
    lib = ctypes.CDLL(str(path))
    try:
        for name, (argtypes, restype) in ENTRY_POINTS.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
    except AttributeError as exc:
        raise RuntimeError(f"{path.name} lacks the kernel entry points") from exc
    version = lib.qwen3_matvec_abi()
    if version & ~1 != ABI:
        raise RuntimeError(f"{path.name} is kernel version {version:#x}, not {ABI:#x}")
    layout = parse_layout(lib.qwen3_step_layout().decode("ascii"))
    sections = all(len(set(layout.get(k, ()))) == len(layout.get(k, ())) > 0
                   for k in ("global", "layer", "dims"))  # fmt: skip
    if not sections:
        raise RuntimeError(f"{path.name} reports no usable decode-step layout")
    return Library(lib, path, openmp=bool(version & 1), layout=layout)


def _compile(compiler: str, flags: list[str], cache_dir: Path) -> Path:
    """Compile the sources to a fresh file in `cache_dir`; returns its path."""
    fd, out = tempfile.mkstemp(dir=cache_dir, prefix=".build-", suffix=".so")
    os.close(fd)
    sources = [str(CSRC / name) for name in SOURCES]
    try:
        proc = subprocess.run(
            [compiler, *flags, *sources, "-o", out],
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


def _source_bytes() -> bytes:
    """Every file of csrc/ (sources and headers), in name order."""
    files = sorted(p for p in CSRC.iterdir() if p.suffix in (".c", ".h"))
    return b"\0".join(p.name.encode() + b"\0" + p.read_bytes() for p in files)


def _cached_or_fresh(
    compiler: str, flags: list[str], cache_dir: Path, target: Path
) -> Library:
    """The verified library at `target`, else a fresh build renamed there."""
    if verified(target):
        try:
            return load(target)
        except (OSError, RuntimeError):
            pass  # rebuilt below, under a new name, then renamed
    fresh = _compile(compiler, flags, cache_dir)
    try:
        library = load(fresh)  # loaded before the rename: never replaced
        digest = sha256(fresh)
        os.replace(fresh, target)
        atomic_write_bytes(record_path(target), digest.encode())
    finally:
        fresh.unlink(missing_ok=True)
    return Library(library.lib, target, library.openmp, library.layout)


def build_and_load(cache_dir: Path) -> Library:
    """The cached library if it verifies and loads, else a fresh build:
    with OpenMP, or single-threaded where the compiler rejects -fopenmp."""
    compiler = find_compiler()
    if compiler is None:
        raise RuntimeError(
            "no C compiler found (install gcc, e.g. `sudo apt install "
            "build-essential`, or set CC)"
        )
    cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(cache_dir)
    ident = _compiler_id(compiler)
    source = _source_bytes()
    error: Exception | None = None
    for flags in ([*_FLAGS, _OPENMP], _FLAGS):
        key = hashlib.sha256(
            b"\0".join([source, ident.encode(), " ".join(flags).encode()])
        ).hexdigest()[:16]
        target = cache_dir / f"qwen3_matvec_{key}.so"
        try:
            library = _cached_or_fresh(compiler, flags, cache_dir, target)
        except RuntimeError as exc:
            error = error or exc
            continue
        if _OPENMP not in flags:
            print(
                f"utils.fast: {Path(compiler).name} rejected {_OPENMP} "
                f"({error}); the kernel runs on one thread"
            )
        return library
    assert error is not None
    raise error


@functools.cache
def _library_for(cache_dir: str) -> Library | None:
    reason = unsupported_reason()
    if reason is None:
        try:
            return build_and_load(Path(cache_dir))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            lines = str(exc).strip().splitlines()
            reason = lines[0][:200] if lines else type(exc).__name__
    print(f"utils.fast: using torch's matmul instead of the AVX2 kernel ({reason})")
    return None


def get_library() -> Library | None:
    """The library for this machine, built on first use (once per cache
    folder and process); None, after one printed line saying why, where it
    cannot be built or loaded."""
    return _library_for(str(kernel_cache_dir()))
