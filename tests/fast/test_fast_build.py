"""utils.fast.build: the C library is built once, cached under a key of its
sources, compiler and flags, loaded only when its recorded SHA-256 matches,
rebuilt (never crashing Python) when it is damaged or foreign, and reports
the decode step's table layout that csrc/step_layout.h defines. Its entry
points and their types come from the prototypes in csrc/api.h alone; the
test build adds tests/fast/csrc's, the reader's library has none of them."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import utils.fast.build as build
from tests.tiny import PROMPT, fast_model, tiny_config, tiny_state_dict, tokens
from utils.download import provenance
from utils.fast import generate, get_kernels
from utils.fast.kernels import Kernels
from utils.fileio import atomic_write_bytes

REPO = Path(__file__).resolve().parents[2]


def library_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.slow  # builds the C library
def test_build_is_cached_with_a_record_and_leaves_nothing_else(kernels, tmp_path):
    cache = tmp_path / "new" / "kernels"
    first = build.build_and_load(cache)
    name = first.path.name
    assert library_files(cache) == [f".{name}.verified.json", name]
    assert cache.stat().st_mode & 0o077 == 0  # created private
    mtime = first.path.stat().st_mtime_ns
    again = build.build_and_load(cache)
    assert again.path == first.path and first.path.stat().st_mtime_ns == mtime
    assert again.openmp


def run_python(code: str, cache: Path, **env: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with the kernel cache at `cache`."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env={**os.environ, "QWEN3_KERNEL_CACHE": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


USE_KERNEL = """
    import torch
    from utils.fast import get_kernels
    k = get_kernels()
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(300, 128, generator=gen).bfloat16()
    x = torch.randn(128, generator=gen).bfloat16()
    print("path", k.path)
    print("bits", k.matvec(x, [w], exact=True).view(torch.int16).tolist())
"""


def expected_bits(kernels) -> str:
    """What USE_KERNEL prints when the library computes what ours does."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(300, 128, generator=gen).bfloat16()
    x = torch.randn(128, generator=gen).bfloat16()
    return f"bits {kernels.matvec(x, [w], exact=True).view(torch.int16).tolist()}"


@pytest.mark.slow  # fresh interpreters
@pytest.mark.parametrize("damage", ["truncated", "garbage", "no record"])
def test_damaged_library_is_rebuilt_in_a_fresh_process(kernels, tmp_path, damage):
    first = run_python(USE_KERNEL, tmp_path)
    assert first.returncode == 0, first.stderr
    target = Path(first.stdout.split("path ")[1].split()[0])
    good = target.read_bytes()
    # replaced, not modified in place: this test process never maps it
    if damage == "truncated":
        atomic_write_bytes(target, good[: len(good) // 2])
    elif damage == "garbage":
        atomic_write_bytes(target, b"\x7fELF" + os.urandom(4000))
    else:
        provenance.record_path(target).unlink()
    second = run_python(USE_KERNEL, tmp_path)
    assert second.returncode == 0, second.stderr  # no SIGBUS (-7) or crash
    assert f"path {target}" in second.stdout and expected_bits(kernels) in second.stdout
    assert "using torch's matmul" not in second.stderr
    assert build.verified(target)


@pytest.mark.slow  # builds the C library
def test_library_without_the_entry_points_is_rebuilt(kernels, tmp_path, capsys):
    target = build.build_and_load(tmp_path).path
    src = tmp_path / "other.c"
    src.write_text("int something_else(void) { return 1; }\n")
    other = tmp_path / "other.so"
    cc = build.find_compiler()
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(other)], check=True)
    os.replace(other, target)
    digest = provenance.hash_file(target)["sha256"]
    provenance.write_record(target, {"sha256": digest})
    src.unlink()
    rebuilt = build.build_and_load(tmp_path)
    assert rebuilt.path == target and build.verified(target)
    x, w = torch.randn(64), torch.randn(8, 64).bfloat16()
    # the same bits as the session's kernels (checked against their sums)
    assert torch.equal(Kernels(rebuilt).matvec(x, [w]), kernels.matvec(x, [w]))


@pytest.mark.slow  # a fresh interpreter
def test_folder_others_can_write_is_refused(kernels, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(RuntimeError, match="writable by other users"):
        build.build_and_load(shared)
    assert list(shared.iterdir()) == []
    proc = run_python(USE_KERNEL.replace('print("path', "#"), shared)
    assert proc.stdout == ""  # diagnostics go to stderr, never stdout
    assert "using torch's matmul instead of the C kernels" in proc.stderr
    assert "chmod go-w" in proc.stderr


@pytest.mark.slow  # builds the C library
def test_compiler_without_openmp_builds_single_threaded(kernels, tmp_path, capsys):
    fake = tmp_path / "bin" / "cc-no-openmp"
    fake.parent.mkdir()
    real = build.find_compiler()
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do if [ "$a" = -fopenmp ]; then\n'
        "  echo \"clang: error: unsupported option '-fopenmp'\" >&2; exit 1\n"
        "fi; done\n"
        f'exec {real} "$@"\n'
    )
    fake.chmod(0o755)
    os.environ["CC"], saved = str(fake), os.environ.get("CC")
    try:
        single = build.build_and_load(tmp_path / "cache")
    finally:
        os.environ.pop("CC")
        if saved is not None:
            os.environ["CC"] = saved
    assert not single.openmp
    out = capsys.readouterr()
    assert out.out == ""
    assert "rejected -fopenmp" in out.err and "unsupported option" in out.err
    # the compiler is part of the key: not the default build's file name
    assert single.path.name != kernels.path.name
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(3000, 1024, generator=gen).to(torch.bfloat16)
    x = torch.randn(1024, generator=gen).to(torch.bfloat16)
    want = kernels.matvec(x, [w], exact=True)
    assert torch.equal(Kernels(single).matvec(x, [w], exact=True), want)


def test_no_compiler_means_torch_matmul_with_one_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QWEN3_KERNEL_CACHE", str(tmp_path / "fresh"))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to find here
    assert get_kernels() is None
    assert get_kernels() is None
    captured = capsys.readouterr()
    out = captured.err
    assert captured.out == ""
    assert out.count("utils.fast.build: using torch's matmul") == 1
    if build.unsupported_reason() is None:
        assert "no C compiler found" in out
    fresh = tmp_path / "fresh"
    assert not fresh.exists() or not any(fresh.iterdir())
    # A model built now generates with torch's matmul, the same tokens
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    fast = fast_model(cfg, tiny_state_dict(cfg=cfg))
    got = tokens(generate(fast, PROMPT, 10))
    assert not fast.out_head.use_kernel
    monkeypatch.undo()
    if get_kernels() is not None:
        assert tokens(generate(fast, PROMPT, 10)) == got
        assert fast.out_head.use_kernel


def test_kernel_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("QWEN3_KERNEL_CACHE", str(tmp_path))
    assert build.kernel_cache_dir() == tmp_path
    monkeypatch.delenv("QWEN3_KERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.kernel_cache_dir() == tmp_path / "xdg/qwen3-ch02/kernels"


def header_names(macro: str) -> list[str]:
    """The names an X-macro of csrc/step_layout.h lists, in order."""
    text = (build.CSRC / "step_layout.h").read_text()
    body = re.search(rf"#define {macro}\(X\)(.*?)\n\n", text, re.S).group(1)
    return re.findall(r"X\((\w+)\)", body)


def test_the_library_reports_the_layout_the_header_defines(kernels):
    layout = kernels.library.layout
    assert layout == {
        "global": tuple(header_names("QWEN3_GLOBAL_SLOTS")),
        "layer": tuple(header_names("QWEN3_LAYER_SLOTS")),
        "dims": tuple(header_names("QWEN3_DIMS")),
    }
    assert layout["global"][:2] == ("EMB", "EMB_SCALE") and len(layout["layer"]) == 20
    assert build.parse_layout("global:A,B,;layer:C,;dims:D,") == {
        "global": ("A", "B"),
        "layer": ("C",),
        "dims": ("D",),
    }


@pytest.mark.slow  # builds the C library
def test_every_source_file_is_part_of_the_cache_key(kernels, tmp_path, monkeypatch):
    """A changed header (here: the step layout) is a new library."""
    first = build.build_and_load(tmp_path / "a")
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    for p in build.CSRC.iterdir():
        if p.suffix in (".c", ".h"):
            (csrc / p.name).write_bytes(p.read_bytes())
    with open(csrc / "step_layout.h", "a") as f:
        f.write("/* changed */\n")
    monkeypatch.setattr(build, "CSRC", csrc)
    second = build.build_and_load(tmp_path / "a")
    assert second.path != first.path and second.layout == first.layout


def test_entry_points_come_from_the_c_prototypes(kernels, test_kernels):
    """api.h is the one place the exported functions are written: every
    prototype there is bound with its types, the test build adds testing.h's,
    and nothing of the test build is exported by the reader's library."""
    import ctypes

    api = build.entry_points(build.CSRC / "api.h")
    assert api["qwen3_abi"] == ([], ctypes.c_int)
    assert api["qwen3_kernels"] == ([], ctypes.c_char_p)
    step_args, step_result = api["qwen3_decode_step"]
    assert step_result is ctypes.c_int and len(step_args) == 9
    assert step_args[1] is ctypes.c_double and step_args[-1] is ctypes.c_int
    tests_only = build.entry_points(REPO / "tests" / "fast" / "csrc" / "testing.h")
    assert tests_only and not set(tests_only) & set(api)
    for name, (args, result) in api.items():
        fn = getattr(kernels.lib, name)
        assert (fn.argtypes, fn.restype) == (args, result), name
    for name in tests_only:
        assert hasattr(test_kernels.lib, name)
        assert not hasattr(kernels.lib, name), f"{name} in the reader's library"
    assert kernels.lib.qwen3_abi() & ~1 == build.abi_version()
    assert test_kernels.path != kernels.path


def test_prototype_parser_reads_types_by_position():
    import ctypes

    header = "QWEN3_API long f(const float *x, double e, int n);\nint g(void);\n"
    path = REPO / "tests" / "fast" / "csrc" / "testing.h"
    assert build.entry_points(path)  # the real header parses
    parsed = {}
    for line in header.splitlines():
        m = build._PROTOTYPE.match(line.replace(" f(", " qwen3_f("))
        if m:
            parsed[m.group(2)] = m.group(3)
    assert parsed == {"qwen3_f": "const float *x, double e, int n"}
    assert build._ctype("const float *") is ctypes.c_void_p
    assert build._ctype("const char *") is ctypes.c_char_p
    assert build._ctype("double ") is ctypes.c_double


def test_a_symlinked_kernel_cache_is_refused(kernels, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(RuntimeError, match="symbolic link"):
        build.build_and_load(link)
    assert list(real.iterdir()) == []


@pytest.mark.parametrize(
    "name, machine, refused",
    [("x86_64", "x86_64", False), ("AMD64", "x86_64", False),
     ("aarch64", "aarch64", False), ("arm64", "aarch64", False),
     ("riscv64", "riscv64", True), ("armv7l", "armv7l", True)],
)  # fmt: skip
def test_the_build_knows_x86_64_and_aarch64_by_any_name(
    monkeypatch, name, machine, refused
):
    """macOS says arm64 and Windows AMD64; a 32-bit ARM or a RISC-V CPU is
    refused with a reason, before any compiler runs."""
    monkeypatch.setattr(build.platform, "machine", lambda: name)
    monkeypatch.setattr(build.platform, "system", lambda: "Linux")
    monkeypatch.setattr(build.torch.cpu, "_is_avx2_supported", lambda: True)
    assert build.machine() == machine
    reason = build.unsupported_reason()
    assert (reason is not None) == refused
    if refused:
        assert "needs an x86-64 or AArch64 CPU" in reason and name in reason


def test_macos_tries_pytorchs_libomp_first(monkeypatch, tmp_path):
    """Apple's clang has no OpenMP runtime: on macOS the first way is the
    libomp of PyTorch's wheel (where it is there), then -fopenmp, then none
    (one thread)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libomp.dylib").touch()
    monkeypatch.setattr(build.torch, "__file__", str(tmp_path / "__init__.py"))
    monkeypatch.setattr(build.platform, "system", lambda: "Darwin")
    first, *rest = build.openmp_flags()
    assert first[:2] == ["-Xclang", "-fopenmp"] and "-lomp" in first
    assert f"-L{tmp_path / 'lib'}" in first
    assert rest == [["-fopenmp"], []]
    monkeypatch.setattr(build.platform, "system", lambda: "Linux")
    assert build.openmp_flags() == [["-fopenmp"], []]


# --------------------------------------------------------------------------
# A cache another user could change; a cache that cannot be made or filled
# --------------------------------------------------------------------------

NOBODY = 65534
needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root (a folder of another user, a tmpfs)",
)


@needs_root
def test_private_cache_under_a_folder_of_another_user_is_refused(tmp_path, caplog):
    """A private `kernels/` under a 0777 folder of uid 65534: that user could
    rename it away and put a folder with their library in its place between
    the check and the load. Refused before anything is built or loaded; the
    engine says so in one line and uses torch's matmul."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, NOBODY, NOBODY)
    shared.chmod(0o777)
    cache = shared / "kernels"
    cache.mkdir(mode=0o700)
    with pytest.raises(RuntimeError) as err:
        build.build_and_load(cache)
    message = str(err.value)
    assert f"{shared} belongs to another user (uid {NOBODY})" in message
    assert "QWEN3_KERNEL_CACHE" in message and "\n" not in message
    assert list(cache.iterdir()) == []  # nothing built there
    os.chown(shared, 0, 0)
    shared.chmod(0o1777)  # root's and sticky, like /tmp: others may not
    assert build.linksafe.untrusted_reason(cache) is None  # rename ours


@needs_root
def test_cache_in_a_folder_others_can_write_is_refused_by_the_engine(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    proc = run_python(USE_KERNEL.replace('print("path', "#"), shared / "kernels")
    assert proc.stdout == ""
    assert "using torch's matmul instead of the C kernels" in proc.stderr
    assert f"{shared} can be written by other users (mode 777)" in proc.stderr


def test_cache_path_that_is_a_file_says_so_in_one_line(tmp_path):
    cache = tmp_path / "kernels"
    cache.write_text("not a folder")
    for path in (cache, cache / "below"):
        with pytest.raises(RuntimeError) as err:
            build.build_and_load(path)
        assert str(err.value).startswith(f"the kernel cache {path} is a file")
        assert "QWEN3_KERNEL_CACHE" in str(err.value)


@pytest.fixture
def full_disk(tmpfs):
    """A 64 kB tmpfs, filled up (root only; unmounted afterwards)."""
    folder = tmpfs("64k", name="full")
    with contextlib.suppress(OSError), (folder / "filler").open("wb") as f:
        f.write(b"\0" * (1 << 20))
    return folder


@needs_root
@pytest.mark.skipif(build.find_compiler() is None, reason="no C compiler")
def test_cache_on_a_full_disk_names_the_folder_and_the_fix(full_disk):
    cache = full_disk / "kernels"
    with pytest.raises(RuntimeError) as err:
        build.build_and_load(cache)
    assert str(err.value) == (
        f"no space left in the kernel cache {cache}: free some space there, "
        "or set QWEN3_KERNEL_CACHE to a folder on another disk"
    )
    assert [p.name for p in cache.iterdir()] == []  # no half-built file left


@pytest.mark.skipif(build.find_compiler() is None, reason="no C compiler")
def test_ctrl_c_during_the_build_leaves_no_half_built_file(tmp_path, monkeypatch):
    """Ctrl-C while the compilers run: nothing half-made kept in the cache."""
    cache = tmp_path / "kernels"

    def interrupted(commands):
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "_run_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build.build_and_load(cache)
    assert library_files(cache) == []


CANNOT_WRITE = (
    "cannot write into the kernel cache {} ({}): set QWEN3_KERNEL_CACHE to a "
    "folder of your own on a disk you can write to"
)


def build_refusal(cache: Path) -> str:
    """The one line a build into `cache` fails with."""
    with pytest.raises(RuntimeError) as err:
        build.build_and_load(cache)
    return str(err.value)


@needs_root
@pytest.mark.skipif(build.find_compiler() is None, reason="no C compiler")
def test_cache_on_a_read_only_disk_names_the_folder_and_the_fix(tmpfs):
    cache = tmpfs("64k", "ro")
    assert build_refusal(cache) == CANNOT_WRITE.format(cache, "read-only file system")


@pytest.mark.skipif(build.find_compiler() is None, reason="no C compiler")
def test_cache_the_user_cannot_write_names_the_folder_not_a_temporary_file(
    tmp_path, monkeypatch
):
    import errno
    import tempfile

    def refused(dir, prefix, suffix):
        name = f"{dir}/{prefix}x1y2{suffix}"
        raise PermissionError(errno.EACCES, "Permission denied", name)

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    cache = tmp_path / "kernels"
    assert build_refusal(cache) == CANNOT_WRITE.format(cache, "permission denied")
