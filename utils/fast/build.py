"""Build and load the fast decoder's C library (`csrc/`), once per machine.

ctypes and the system C compiler, not a torch extension: plain C builds in
seconds with any gcc or clang, no C++ toolchain matching PyTorch's.
It builds for x86-64 with AVX2 (and FMA) and for AArch64 (NEON: Linux,
and macOS, which was not executed here); elsewhere (Windows, another CPU,
no compiler) torch's matmul is used. A compiler without OpenMP builds a
single-threaded library; Apple's clang, which has none of its own, tries
the OpenMP runtime PyTorch ships first.

Entry points and types are read from the C prototypes (`csrc/api.h`). The
library is cached under a hash of the sources, compiler and flags, loaded
only from a folder of the user's own that nobody else may write, under
folders nobody else may write either (else another user could swap the
folder between the check and the load), after its
SHA-256 matches the record written at build time (`utils.download.provenance`). A
new build is renamed into place (a mapped library never changes); one
with another ABI number is rebuilt. A caller may add sources and defines
(`Extra`): a second library, cached under its own hash.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from utils import linksafe, settings
from utils.download import disk_reason, hash_file, read_record, write_record
from utils.errors import first_line
from utils.log import get_logger

CSRC = Path(__file__).with_name("csrc")
# -ffp-contract=off: no multiply and add fused unless the code says so
# (gcc fuses by default on AArch64), so every machine rounds alike
_FLAGS = ["-O3", "-ffp-contract=off", "-fvisibility=hidden", "-shared", "-fPIC"]
_ISA_FLAGS = {"x86_64": ["-mavx2", "-mfma"], "aarch64": []}
_OPENMP = "-fopenmp"
_log = get_logger(__name__)

_PROTOTYPE = re.compile(r"^QWEN3_API\s+(.+?)\b(qwen3_\w+)\((.*)\);\s*$")
_ABI = re.compile(r"^#define QWEN3_ABI (0x[0-9a-fA-F]+)\s*$", re.M)
_SCALARS = {"int": ctypes.c_int, "long": ctypes.c_long, "double": ctypes.c_double}


@dataclass(frozen=True, eq=False)  # one per process and build: by identity
class Library:
    """The loaded C library: ctypes handle, file, whether built with OpenMP,
    the decode step's table layout it reports (section -> slot names)."""

    lib: ctypes.CDLL
    path: Path
    openmp: bool
    layout: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class Extra:
    """What a caller adds to the library: C sources and headers, compiled
    and hashed with csrc/'s (the headers' QWEN3_API prototypes bound as
    api.h's), and include folders and defines (-I, -D) for every source."""

    sources: tuple[Path, ...] = ()
    include_dirs: tuple[Path, ...] = ()
    defines: tuple[str, ...] = ()


def _ctype(decl: str) -> type | None:
    """The ctypes type of a C parameter or result type as api.h writes it."""
    decl = decl.replace("const", "").strip()
    if "*" in decl:  # a C string (char *), else any pointer
        return ctypes.c_char_p if decl.startswith("char") else ctypes.c_void_p
    return None if decl == "void" else _SCALARS[decl]


def entry_points(header: Path) -> dict[str, tuple[list, type | None]]:
    """Name -> (argument types, result type) of every QWEN3_API prototype
    in `header`."""
    found = {}
    for line in header.read_text().splitlines():
        m = _PROTOTYPE.match(line)
        if m is None:
            continue
        result, name, params = m.groups()
        args = [] if params.strip() == "void" else params.split(",")
        # a parameter's type is everything but its name
        types = [_ctype(re.sub(r"\w+\s*$", "", p)) for p in args]
        found[name] = (types, _ctype(result))
    return found


def abi_version() -> int:
    """QWEN3_ABI as csrc/api.h defines it."""
    m = _ABI.search((CSRC / "api.h").read_text())
    assert m is not None, "csrc/api.h defines QWEN3_ABI"
    return int(m.group(1), 16)


def kernel_cache_dir() -> Path:
    """Where compiled libraries are kept ($QWEN3_KERNEL_CACHE overrides)."""
    env = settings.text("QWEN3_KERNEL_CACHE")
    return Path(env).expanduser() if env else settings.cache_root() / "kernels"


def find_compiler() -> str | None:
    """The C compiler to use: $CC, else cc, gcc or clang on PATH."""
    for name in (settings.text("CC"), "cc", "gcc", "clang"):
        found = shutil.which(name) if name else None
        if found:
            return os.path.realpath(found)
    return None


def _compiler_id(compiler: str) -> str:
    """The compiler's path and its version line (part of the cache key)."""
    command = [compiler, "--version"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
        version = (proc.stdout or proc.stderr).strip().splitlines() or ["?"]
    except (OSError, subprocess.SubprocessError):
        version = ["?"]
    return f"{compiler} {version[0]}"


def machine() -> str:
    """This CPU's architecture as the build knows it: "x86_64", "aarch64"
    (macOS says arm64), or what platform.machine() says."""
    name = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def unsupported_reason() -> str | None:
    """Why the library cannot run on this machine (None: it can)."""
    if machine() not in _ISA_FLAGS:
        return f"needs an x86-64 or AArch64 CPU (this is {platform.machine()})"
    if platform.system() == "Windows":
        return "building the kernel with MSVC is not supported"
    if machine() == "x86_64" and not torch.cpu._is_avx2_supported():
        return "needs a CPU with AVX2"  # cpuinfo, not ATEN_CPU_CAPABILITY
    return None


def openmp_flags() -> list[list[str]]:
    """The ways to ask for OpenMP, in order: -fopenmp; on macOS first
    PyTorch's own libomp (Apple's clang has no OpenMP runtime). The last
    way is none: a single-threaded library."""
    ways = [[_OPENMP]]
    torch_lib = Path(torch.__file__).parent / "lib"
    if platform.system() == "Darwin" and (torch_lib / "libomp.dylib").exists():
        ways.insert(0, ["-Xclang", _OPENMP, f"-L{torch_lib}", "-lomp",
                        f"-Wl,-rpath,{torch_lib}"])  # fmt: skip
    return [*ways, []]


def check_private_dir(path: Path) -> None:
    """Refuse a folder (or file) that another user owns or may write into,
    or that is a symbolic link."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        problem = "is a symbolic link"
    elif hasattr(os, "getuid") and info.st_uid != os.getuid():
        problem = "belongs to another user"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(info.st_mode)
        problem = f"is writable by other users (mode {mode:o}; `chmod go-w {path}`)"
    else:
        return
    raise RuntimeError(f"{path} {problem}; set QWEN3_KERNEL_CACHE to a private folder")


def prepare_cache(cache_dir: Path) -> None:
    """Make the kernel cache (private) and refuse it, in one line naming the
    folder and the fix, where it is no folder, or where another user could
    put a library of their own in it: the folder itself, or any folder above
    it (`utils.linksafe.untrusted_reason`, checked before anything there is
    built or loaded)."""
    fix = "set QWEN3_KERNEL_CACHE to a folder of your own"
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise RuntimeError(
            f"the kernel cache {cache_dir} is a file, or lies under one: "
            f"move that file away or {fix}"
        ) from None
    except OSError as exc:
        raise RuntimeError(
            f"cannot make the kernel cache {cache_dir} ({exc.strerror}); {fix}"
        ) from None
    check_private_dir(cache_dir)
    reason = linksafe.untrusted_reason(cache_dir)
    if reason is not None:
        raise RuntimeError(f"the kernel cache {cache_dir} is not safe: {reason}; {fix}")


def _disk_refused(cache_dir: Path, exc: BaseException) -> RuntimeError | None:
    """The one-line error for a build the disk refused: full, read-only or
    not writable (the compiler's or assembler's own line, or the OSError,
    names a temporary file instead)."""
    text = f"{exc} {getattr(exc, 'output', '')}"
    reason = disk_reason(exc)
    if reason is None and ("No space left" in text or "Disk quota" in text):
        reason = "no space left on the disk"
    if reason in ("no space left on the disk", "disk quota exceeded"):
        return RuntimeError(
            f"no space left in the kernel cache {cache_dir}: free some space "
            "there, or set QWEN3_KERNEL_CACHE to a folder on another disk"
        )
    if reason is None:
        return None
    return RuntimeError(
        f"cannot write into the kernel cache {cache_dir} ({reason}): set "
        "QWEN3_KERNEL_CACHE to a folder of your own on a disk you can write to"
    )


def verified(path: Path) -> bool:
    """Whether `path` is ours, private, and the library its build recorded
    (always hashed: the file is small and is about to run)."""
    try:
        check_private_dir(path)
        record = read_record(path)
        return record is not None and (record["sha256"] == hash_file(path)["sha256"])
    except (OSError, RuntimeError):
        return False


def parse_layout(text: str) -> dict[str, tuple[str, ...]]:
    """`qwen3_step_layout()`'s "global:A,B,;layer:...;dims:..." as a dict."""
    sections = (section.partition(":") for section in text.split(";"))
    return {
        name: tuple(n for n in names.split(",") if n) for name, _, names in sections
    }


def load(path: Path, extra: Extra = Extra()) -> Library:
    """Open the library and bind its entry points; OSError/RuntimeError if
    it is not a library built from csrc/ with this ABI (utils.fast.native
    checks the table layout it reports against its own)."""
    lib = ctypes.CDLL(str(path))
    headers = [CSRC / "api.h", *(p for p in extra.sources if p.suffix == ".h")]
    try:
        for header in headers:
            for name, (argtypes, restype) in entry_points(header).items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = argtypes, restype
    except AttributeError as exc:
        raise RuntimeError(f"{path.name} lacks the kernel entry points") from exc
    version, abi = lib.qwen3_abi(), abi_version()
    if version & ~1 != abi:
        raise RuntimeError(f"{path.name} is kernel version {version:#x}, not {abi:#x}")
    layout = parse_layout(lib.qwen3_step_layout().decode("ascii"))
    return Library(lib, path, openmp=bool(version & 1), layout=layout)


def _sources(extra: Extra) -> list[Path]:
    own = sorted(p for p in CSRC.iterdir() if p.suffix in (".c", ".h"))
    return [*own, *extra.sources]


def _run_all(commands: list[list[str]]) -> None:
    """Run compiler commands side by side; the first one's first line of
    complaint on failure. All are started from this thread, one after the
    other, then waited for (processes forked from several threads at once
    can hang under qemu-user's emulation)."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for c in commands]  # fmt: skip
    try:
        for command, proc in zip(commands, procs, strict=True):
            out = proc.communicate(timeout=300)[0]
            if proc.returncode != 0:
                detail = (out or "").strip().splitlines() or [proc.returncode]
                error = RuntimeError(f"{Path(command[0]).name} failed: {detail[0]}")
                error.output = out  # type: ignore[attr-defined]  # all of it
                raise error
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _compile(compiler: str, flags: list[str], cache_dir: Path, extra: Extra) -> Path:
    """Compile the sources to a fresh file in `cache_dir`; returns its path.
    One compiler per source file, all at once, then one link:
    the first `--fast` run waits for the slowest file, not for their sum."""
    try:
        fd, out = tempfile.mkstemp(dir=cache_dir, prefix=".build-", suffix=".so")
    except OSError as exc:
        raise _disk_refused(cache_dir, exc) or exc from None
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".objects-") as objs:
            units = [str(p) for p in _sources(extra) if p.suffix == ".c"]
            objects = [f"{objs}/{i}.o" for i in range(len(units))]
            commands = [
                [compiler, *flags, "-c", unit, "-o", obj]
                for unit, obj in zip(units, objects, strict=True)
            ]
            _run_all(commands)
            _run_all([[compiler, *flags, *objects, "-o", out]])
    except BaseException as exc:  # Ctrl-C too: no half-built file is kept
        Path(out).unlink(missing_ok=True)
        if isinstance(exc, OSError | RuntimeError | subprocess.SubprocessError):
            raise _disk_refused(cache_dir, exc) or exc from None
        raise
    os.chmod(out, 0o755)  # the linker applies the umask (maybe group-writable)
    return Path(out)


def _cached_or_fresh(
    compiler: str, flags: list[str], cache_dir: Path, target: Path, extra: Extra
) -> Library:
    """The verified library at `target`, else a fresh build renamed there."""
    if verified(target):
        try:
            return load(target, extra)
        except (OSError, RuntimeError):
            pass  # rebuilt below, under a new name, then renamed
    fresh = _compile(compiler, flags, cache_dir, extra)
    try:
        library = load(fresh, extra)  # loaded before the rename: never replaced
        digest = hash_file(fresh)["sha256"]
        os.replace(fresh, target)
        write_record(target, {"sha256": digest, "source": compiler})
    finally:
        fresh.unlink(missing_ok=True)
    return Library(library.lib, target, library.openmp, library.layout)


def build_and_load(cache_dir: Path, extra: Extra = Extra()) -> Library:
    """The cached library if it verifies and loads, else a fresh build:
    with OpenMP, or single-threaded where the compiler rejects -fopenmp."""
    compiler = find_compiler()
    if compiler is None:
        raise RuntimeError(
            "no C compiler found (install gcc, e.g. `sudo apt install "
            "build-essential`, or set CC)"
        )
    prepare_cache(cache_dir)
    ident = _compiler_id(compiler).encode()
    source = b"\0".join(p.name.encode() + b"\0" + p.read_bytes()
                        for p in _sources(extra))  # fmt: skip
    added = [f"-I{d}" for d in extra.include_dirs] + [f"-D{d}" for d in extra.defines]
    error: Exception | None = None
    for omp in openmp_flags():
        flags = [*_FLAGS, *_ISA_FLAGS[machine()], *omp, *added]
        key = hashlib.sha256(b"\0".join([source, ident, " ".join(flags).encode()]))
        target = cache_dir / f"qwen3_kernels_{key.hexdigest()[:16]}.so"
        try:
            library = _cached_or_fresh(compiler, flags, cache_dir, target, extra)
        except RuntimeError as exc:
            error = error or exc
            continue
        if not omp:
            _log.warning(
                "%s rejected %s (%s); the kernels run on one thread",
                Path(compiler).name, _OPENMP, error,
            )  # fmt: skip
        return library
    assert error is not None
    raise error


@functools.cache
def _library_for(cache_dir: str, extra: Extra) -> Library | None:
    reason = unsupported_reason()
    if reason is None:
        try:
            return build_and_load(Path(cache_dir), extra)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            reason = first_line(exc, 400)  # two paths and the fix
    _log.warning("using torch's matmul instead of the C kernels (%s)", reason)
    return None


def get_library(extra: Extra = Extra()) -> Library | None:
    """The library for this machine (with `extra` added), built on first
    use (once per cache folder and process); None, after one line on
    stderr saying why, where it cannot be built or loaded."""
    return _library_for(str(kernel_cache_dir()), extra)
