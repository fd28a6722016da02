"""utils.cpu_matvec: the decode kernels compute exactly what their C code
documents, eager results equal F.linear on every CPU, and the kernel cache
can neither be poisoned nor crash Python.

The exactness references are float32 sums emulated here in the order each
kernel documents (an exactly rounded fused multiply-add, then the documented
reduction tree), so they hold whichever path PyTorch's own matmul takes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reasoning_from_scratch.ch02 import generate_text_basic_stream_cache as book_gen
from tiny import (
    PROMPT,
    book_model,
    skip_if_inductor_cannot_build,
    tiny_config,
    tiny_state_dict,
    tokens,
)

from utils import cpu_matvec
from utils.fast_decode import FastQwen3, decode_one_token, generate, prefill
from utils.fileio import atomic_write_bytes
from utils.quantize import Int8Linear, quantize_int8

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def kernels():
    loaded = cpu_matvec.get_kernels()
    if loaded is None:
        pytest.skip("the AVX2 kernel cannot be built on this machine")
    return loaded


# ---------------------------------------------------------------------------
# Emulated references: the kernels' documented float32 summation orders
# ---------------------------------------------------------------------------


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fma(a, b, c), rounded once (a*b must be exact in float64)."""
    p, c64 = a.double() * b.double(), c.double()
    hi = c64 + p
    back = hi - c64
    lo = (c64 - (hi - back)) + (p - back)  # hi + lo == c + a*b exactly
    r = hi.float()
    inf = torch.full_like(r, float("inf"))
    side = torch.where(hi > r.double(), inf, -inf)
    other = torch.nextafter(r, side)  # the float32 on hi's other side
    tie = ((r.double() + other.double()) / 2 == hi) & (lo != 0)
    nearer = torch.where(lo > 0, torch.maximum(r, other), torch.minimum(r, other))
    return torch.where(tie, nearer, r)


def lanes(v: torch.Tensor) -> torch.Tensor:
    """The kernels' horizontal sum of 8 float32 lanes (last dim)."""
    return ((v[:, 0] + v[:, 4]) + (v[:, 2] + v[:, 6])) + (
        (v[:, 1] + v[:, 5]) + (v[:, 3] + v[:, 7])
    )


ORDER16 = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


def reference(x: torch.Tensor, w: torch.Tensor, kind: str, scales=None):
    """What kernel `kind` ("exact", "fast", "int8") returns for rows `w`."""
    x32 = x.float()
    width = 64 if kind == "exact" else 16
    cols = list(range(width)) if kind != "fast" else ORDER16
    acc = torch.zeros(w.shape[0], width)
    for start in range(0, w.shape[1], width):
        idx = [start + c for c in cols]
        acc = fma32(x32[idx], w[:, idx], acc)
    if kind == "exact":  # 8 accumulators of 8 lanes, folded pairwise
        s = list(acc.view(-1, 8, 8).unbind(1))
        for i in range(4):
            s[i] = s[i] + s[i + 4]
        for i in range(2):
            s[i] = s[i] + s[i + 2]
        total = lanes(s[0] + s[1])
    else:  # two accumulators of 8 lanes
        total = lanes(acc[:, :8] + acc[:, 8:])
    if scales is not None:
        total = total * scales
    return total.to(x.dtype)


def int8_reference(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor):
    """What the int8 kernel returns: x rounded to int16 with one float32
    scale, exact int32 lane sums (lane j: columns 2j, 2j+1 of each 16),
    converted to float32 and added every 1024 columns, lanes summed, then
    times the x scale and the row scales."""
    x32 = x.float()
    amax = x32.abs().max()
    inv = torch.tensor(32767.0) / amax
    qx = torch.round(x32 * inv).clamp(-32767, 32767).long()
    xs = amax / torch.tensor(32767.0)
    prod = w.long() * qx  # (n, k), exact
    f = torch.zeros(w.shape[0], 8)
    for c in range(0, w.shape[1], 1024):
        chunk = prod[:, c : c + 1024].reshape(w.shape[0], -1, 8, 2)
        f = f + chunk.sum(dim=(1, 3)).float()
    return ((lanes(f) * xs) * scales).to(x.dtype)


def rows_to_check(n: int) -> torch.Tensor:
    """All rows, or a sample of 3,000 (the reference is slow in Python)."""
    if n <= 3000:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(n))[:3000]


# (rows, columns): remainders of the four-row groups, one and two threads'
# worth of rows, and the real model's shapes
SHAPES = [(1, 64), (3, 128), (7, 64), (1000, 64), (4099, 192), (3072, 1024),
          (1024, 3072), (151936, 1024)]  # fmt: skip


@pytest.mark.parametrize("n,k", SHAPES)
def test_bf16_kernels_match_their_documented_sums(kernels, n, k):
    gen = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=gen) * 3).to(torch.bfloat16)
    rows = rows_to_check(n)
    for x_dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(k, generator=gen).to(x_dtype)
        for kind in ("exact", "fast"):
            got = kernels.matvec(x, w, exact=kind == "exact")
            assert got.dtype == x_dtype and got.shape == (n,)
            want = reference(x, w[rows], kind)
            assert torch.equal(got[rows], want), (kind, x_dtype)
    # and both are correctly computed dot products (float64 check)
    ref = w.double() @ x.double()
    bound = 1e-5 * (w.double().abs() @ x.double().abs()).max()
    assert (got.double() - ref).abs().max() <= bound


@pytest.mark.parametrize("n,k", [(5, 16), (1000, 64), (3072, 1024), (7, 3072)])
def test_int8_kernel_matches_its_documented_sums(kernels, n, k):
    gen = torch.Generator().manual_seed(n)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, generator=gen) + 0.01
    for x_dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, k, generator=gen).to(x_dtype)
        got = cpu_matvec.int8_linear(x, w, scales)
        assert got.dtype == x_dtype and got.shape == (1, n)
        assert torch.equal(got[0], int8_reference(x[0], w, scales))
    # and close to the float product of the same weights (x's 16-bit rounding)
    ref = (w.double() @ x[0].double()) * scales.double()
    bound = 1e-4 * ((w.double().abs() @ x[0].double().abs()) * scales).max()
    assert (got[0].double() - ref).abs().max() <= bound + 1e-2 * ref.abs().max() * (
        x_dtype == torch.bfloat16
    )


@pytest.mark.parametrize("sizes", [(2048, 1024, 1024), (5, 1000, 3), (3072, 3072)])
def test_grouped_call_equals_one_call_per_matrix(kernels, sizes):
    """matvec_multi: the same bits as one matvec per weight, concatenated,
    whichever thread gets which rows (the split crosses matrix borders)."""
    gen = torch.Generator().manual_seed(sum(sizes))
    k = 1024
    x = torch.randn(k, generator=gen).to(torch.bfloat16)
    ws = [torch.randn(n, k, generator=gen).to(torch.bfloat16) for n in sizes]
    for exact in (False, True):
        got = kernels.matvec_multi(x, ws, exact=exact)
        want = torch.cat([kernels.matvec(x, w, exact=exact) for w in ws])
        assert torch.equal(got, want)
    qs = [
        torch.randint(-127, 128, w.shape, generator=gen, dtype=torch.int8) for w in ws
    ]
    ss = [torch.rand(n, generator=gen) for n in sizes]
    got = kernels.matvec_multi(x, qs, ss)
    assert torch.equal(
        got, torch.cat([kernels.matvec(x, q, s) for q, s in zip(qs, ss, strict=True)])
    )
    pieces = cpu_matvec.linear_group(x.view(1, k), ws)
    assert [p.shape for p in pieces] == [(1, n) for n in sizes]
    for piece, w in zip(pieces, ws, strict=True):
        assert torch.equal(piece, cpu_matvec.linear(x.view(1, k), w))
    with pytest.raises(ValueError, match="scales"):
        kernels.matvec_multi(x, qs, ss[:1])
    with pytest.raises(ValueError, match="dtype"):
        kernels.matvec_multi(x, [ws[0], qs[0]])


def test_int8_kernel_propagates_nan_and_inf(kernels):
    """A non-finite input must not vanish in the fixed-point rounding."""
    w = torch.ones(8, 64, dtype=torch.int8)
    scales = torch.ones(8)
    for bad in (float("nan"), float("inf")):
        x = torch.ones(64)
        x[3] = bad
        got = kernels.matvec(x, w, scales)
        assert not torch.isfinite(got).any()
    assert torch.equal(kernels.matvec(torch.zeros(64), w, scales), torch.zeros(8))


def test_eager_linear_gives_torchs_bits_on_every_cpu(kernels, monkeypatch):
    """Eager `linear` must equal F.linear bit for bit: through the exact
    kernel where torch rounds like it (its AVX2 path), else F.linear."""
    on_aten_avx2 = (
        torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT")
        and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )
    if on_aten_avx2:  # here the kernel must really be used
        assert cpu_matvec.kernel_rounds_like_torch()
    calls = []
    real = kernels.matvec
    monkeypatch.setattr(
        cpu_matvec._LOADED["kernels"].__class__,
        "matvec",
        lambda self, *a, **kw: calls.append(kw) or real(*a, **kw),
    )
    gen = torch.Generator().manual_seed(5)
    for n, k in [(7, 128), (2048, 1024), (1024, 3072)]:
        for trial in range(3):
            w = (torch.randn(n, k, generator=gen) * 10**trial).to(torch.bfloat16)
            x = torch.randn(1, 1, k, generator=gen).to(torch.bfloat16)
            assert torch.equal(cpu_matvec.linear(x, w), F.linear(x, w))
    assert bool(calls) is cpu_matvec.kernel_rounds_like_torch()


def test_where_torch_rounds_differently_eager_uses_torch(kernels, monkeypatch):
    """Simulates an AVX-512 BF16 CPU (oneDNN): the probe says no."""
    monkeypatch.setattr(cpu_matvec, "_PROBES", {True: False, False: False})
    monkeypatch.setattr(
        cpu_matvec._LOADED["kernels"].__class__,
        "matvec",
        lambda *a, **kw: pytest.fail("eager call used the kernel"),
    )
    w = torch.randn(64, 128, dtype=torch.bfloat16)
    x = torch.randn(1, 128, dtype=torch.bfloat16)
    assert torch.equal(cpu_matvec.linear(x, w), F.linear(x, w))


def test_wrong_operands_raise_clear_errors(kernels):
    w = torch.randint(-127, 128, (1000, 64), dtype=torch.int8)
    x = torch.randn(1, 64)
    with pytest.raises(ValueError, match=r"scales must be .*\(1000,\)"):
        cpu_matvec.int8_linear(x, w, torch.ones(1))
    with pytest.raises(ValueError, match="contiguous"):
        cpu_matvec.int8_linear(x, w, torch.ones(1000, 2)[:, 0])
    with pytest.raises(ValueError, match="one CPU row"):
        cpu_matvec.int8_linear(torch.randn(2, 64), w, torch.ones(1000))
    with pytest.raises(ValueError, match="scales must be"):
        kernels.matvec(x[0], w, torch.ones(1000, dtype=torch.float64))
    wb = torch.randn(32, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"x must be \(64,\)"):
        kernels.matvec(torch.randn(32), wb)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.matvec(torch.randn(64, 2)[:, 0], wb)
    with pytest.raises(ValueError, match="multiple of 64"):
        kernels.matvec(torch.randn(48), torch.zeros(4, 48).bfloat16(), exact=True)
    with pytest.raises(ValueError, match="bf16 weight"):
        kernels.matvec(torch.randn(64), torch.zeros(4, 64))


def test_shapes_the_kernel_does_not_take_use_torch():
    w = torch.randn(32, 24, dtype=torch.bfloat16)  # 24 columns: not 16k
    x = torch.randn(1, 24, dtype=torch.bfloat16)
    assert not cpu_matvec.supports(x, w)
    assert torch.equal(cpu_matvec.linear(x, w), F.linear(x, w))
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    x2 = torch.randn(2, 64, dtype=torch.bfloat16)  # two rows: a matmul
    assert not cpu_matvec.supports(x2, w)
    assert torch.equal(cpu_matvec.linear(x2, w), F.linear(x2, w))
    assert not cpu_matvec.supports(x2[:1], w.t())  # not contiguous


# ---------------------------------------------------------------------------
# The kernel cache
# ---------------------------------------------------------------------------


def library_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_build_is_cached_with_a_record_and_leaves_nothing_else(kernels, tmp_path):
    cache = tmp_path / "new" / "kernels"
    first = cpu_matvec._build_and_load(cache)
    name = first.path.name
    assert library_files(cache) == [name, name + ".sha256"]
    assert cache.stat().st_mode & 0o077 == 0  # created private
    mtime = first.path.stat().st_mtime_ns
    again = cpu_matvec._build_and_load(cache)
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
    import torch, torch.nn.functional as F
    from utils import cpu_matvec
    k = cpu_matvec.get_kernels()
    w = torch.randn(300, 128).bfloat16()
    x = torch.randn(128).bfloat16()
    print("path", k.path)
    print("same", torch.equal(k.matvec(x, w, exact=True), F.linear(x, w)))
"""


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
        (tmp_path / (target.name + ".sha256")).unlink()
    second = run_python(USE_KERNEL, tmp_path)
    assert second.returncode == 0, second.stderr  # no SIGBUS (-7) or crash
    assert f"path {target}" in second.stdout and "same True" in second.stdout
    assert "using torch's matmul" not in second.stdout
    assert cpu_matvec._verified(target)


def test_library_without_the_entry_points_is_rebuilt(kernels, tmp_path, capsys):
    target = cpu_matvec._build_and_load(tmp_path).path
    src = tmp_path / "other.c"
    src.write_text("int something_else(void) { return 1; }\n")
    other = tmp_path / "other.so"
    cc = cpu_matvec._find_compiler()
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(other)], check=True)
    os.replace(other, target)
    atomic_write_bytes(
        tmp_path / (target.name + ".sha256"), cpu_matvec._sha256(target).encode()
    )
    src.unlink()
    rebuilt = cpu_matvec._build_and_load(tmp_path)
    assert rebuilt.path == target and cpu_matvec._verified(target)
    x, w = torch.randn(64), torch.randn(8, 64).bfloat16()
    assert torch.equal(rebuilt.matvec(x, w), reference(x, w, "fast"))


def test_folder_others_can_write_is_refused(kernels, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(RuntimeError, match="writable by other users"):
        cpu_matvec._build_and_load(shared)
    assert list(shared.iterdir()) == []
    proc = run_python(USE_KERNEL.replace('print("path', "#"), shared)
    assert "using torch's matmul instead of the AVX2 kernel" in proc.stdout
    assert "chmod go-w" in proc.stdout


def test_compiler_without_openmp_builds_single_threaded(kernels, tmp_path, capsys):
    fake = tmp_path / "bin" / "cc-no-openmp"
    fake.parent.mkdir()
    real = cpu_matvec._find_compiler()
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
        single = cpu_matvec._build_and_load(tmp_path / "cache")
    finally:
        os.environ.pop("CC")
        if saved is not None:
            os.environ["CC"] = saved
    assert not single.openmp
    out = capsys.readouterr().out
    assert "rejected -fopenmp" in out and "unsupported option" in out
    # the compiler is part of the key: not the default build's file name
    assert single.path.name != kernels.path.name
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(3000, 1024, generator=gen).to(torch.bfloat16)
    x = torch.randn(1024, generator=gen).to(torch.bfloat16)
    want = kernels.matvec(x, w, exact=True)
    assert torch.equal(single.matvec(x, w, exact=True), want)


def test_no_compiler_means_torch_matmul_with_one_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QWEN3_KERNEL_CACHE", str(tmp_path / "fresh"))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to find here
    assert cpu_matvec.get_kernels() is None
    assert cpu_matvec.get_kernels() is None
    out = capsys.readouterr().out
    assert out.count("cpu_matvec: using torch's matmul") == 1
    if cpu_matvec._unsupported_reason() is None:
        assert "no C compiler found" in out
    fresh = tmp_path / "fresh"
    assert not fresh.exists() or not any(fresh.iterdir())
    # A model built now generates with torch's matmul, the same tokens
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    fast = FastQwen3.from_state_dict(cfg, tiny_state_dict(cfg=cfg))
    got = tokens(generate(fast, PROMPT, 10))
    assert not fast.cpu_matvec_active()
    monkeypatch.undo()
    if cpu_matvec.get_kernels() is not None:
        assert tokens(generate(fast, PROMPT, 10)) == got
        assert fast.cpu_matvec_active()


def test_kernel_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("QWEN3_KERNEL_CACHE", str(tmp_path))
    assert cpu_matvec.kernel_cache_dir() == tmp_path
    monkeypatch.delenv("QWEN3_KERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cpu_matvec.kernel_cache_dir() == tmp_path / "xdg/qwen3-ch02/kernels"


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("torch_rounds_alike", [None, False])
def test_bf16_model_with_kernel_gives_the_books_tokens(
    kernels, monkeypatch, torch_rounds_alike
):
    """On every CPU: None = as probed here; False = as on AVX-512 BF16."""
    if torch_rounds_alike is not None:
        probes = {True: torch_rounds_alike, False: torch_rounds_alike}
        monkeypatch.setattr(cpu_matvec, "_PROBES", probes)
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(cfg=cfg)
    book = book_model(sd, cfg)
    fast = FastQwen3.from_book_model(book)
    want = tokens(book_gen(book, PROMPT, 40))
    assert len(set(want[0])) > 5
    assert tokens(generate(fast, PROMPT, 40)) == want
    assert fast.cpu_matvec_active()
    assert not fast.use_cpu_matvec(False)
    assert tokens(generate(fast, PROMPT, 40)) == want
    assert not fast.cpu_matvec_active()
    assert fast.use_cpu_matvec(True)


def test_compiled_decode_calls_the_kernel_and_matches_eager(kernels, monkeypatch):
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(1, cfg)
    want = tokens(generate(FastQwen3.from_state_dict(cfg, sd), PROMPT, 20))
    fast = FastQwen3.from_state_dict(cfg, sd).compile_decode()
    calls = []
    real, real_cat = cpu_matvec._matvec_impl, cpu_matvec._matvec_cat_impl

    def counting(x, w, scales=None):  # the registered operators call these
        calls.append(1)
        return real(x, w, scales)

    def counting_cat(x, ws, scales=None):
        calls.append(len(ws))
        return real_cat(x, ws, scales)

    monkeypatch.setattr(cpu_matvec, "_matvec_impl", counting)
    monkeypatch.setattr(cpu_matvec, "_matvec_cat_impl", counting_cat)
    assert tokens(generate(fast, PROMPT, 20)) == want
    skip_if_inductor_cannot_build(fast.decode_compiled())
    assert fast.decode_compiled() and fast.cpu_matvec_active()
    # 19 compiled decode steps x (2 layers x (q/k/v, out, gate/up, down)
    # + the head): 9 kernel calls covering 15 matrices
    assert len(calls) >= 19 * 9 and sum(calls) >= 19 * 15
    assert calls.count(3) >= 19 * 2 and calls.count(2) >= 19 * 2


def greedy_picks(model: FastQwen3, seq: list[int]) -> list[int]:
    """The model's greedy choice at each step when fed PROMPT + seq."""
    model.setup_cache(1, PROMPT.shape[1] + len(seq))
    tok, _ = prefill(model, PROMPT)
    picks = [int(tok)]
    pos = torch.tensor([PROMPT.shape[1]])
    for t in seq[:-1]:
        tok, _ = decode_one_token(model, torch.tensor([[t]]), pos, int(pos) + 1)
        picks.append(int(tok))
        pos = pos + 1
    return picks


def test_int8_model_uses_the_kernel_and_stays_close(kernels):
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    sd = tiny_state_dict(2, cfg)
    fast = FastQwen3.from_state_dict(cfg, sd)
    q = quantize_int8(FastQwen3.from_state_dict(cfg, sd))
    assert isinstance(q.out_head, Int8Linear)
    assert q.out_head.scales.dtype == torch.float32
    x = torch.randn(1, 1, cfg["emb_dim"]).bfloat16()
    head = q.out_head
    ref = F.linear(x.float(), head.weight_int8.float() * head.scales[:, None])
    q.use_cpu_matvec(True)
    assert q.out_head.use_kernel
    with_kernel = q.out_head(x)
    q.use_cpu_matvec(False)
    without = q.out_head(x)
    assert (with_kernel.float() - ref).abs().max() <= 0.02 * ref.abs().max()
    assert (without.float() - ref).abs().max() <= 0.02 * ref.abs().max()
    q.use_cpu_matvec(True)
    seq = tokens(generate(fast, PROMPT, 30))[0]
    assert greedy_picks(fast, seq) == seq
    agree = sum(a == b for a, b in zip(greedy_picks(q, seq), seq, strict=True))
    assert agree >= 24  # teacher-forced top-1: most steps, int8 is approximate
    assert q.cpu_matvec_active()
