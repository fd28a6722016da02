"""`utils.compile`: the book's dynamo setting on every compile, the fallback
to eager mode when compiling fails, and notebook 06's listings."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tiny import tiny_config
from utils import compile as compile_module
from utils.compile import (
    BOOK_SETTING_MIN_TORCH,
    CompileResult,
    apply_book_dynamo_setting,
    book_compile,
    compile_hint,
    compiler_works,
    separate_inductor_cache,
    try_compile,
)
from utils.device import torch_version

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = (
    Path(__file__).resolve().parents[1]
    / "ch02"
    / "01_main-chapter-code"
    / "06_compile.ipynb"
)


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * 2


def _failing_backend(message: str):
    def backend(gm, example_inputs):
        raise RuntimeError(message)

    return backend


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # start from PyTorch's default and restore the value afterwards
    with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=False):
        torch._dynamo.reset()
        yield
        torch._dynamo.reset()


def _recording_compile(seen):
    def fake_compile(model, **kwargs):
        seen.append(torch._dynamo.config.allow_unspec_int_on_nn_module)
        return model

    return fake_compile


def test_try_compile_applies_the_books_setting_first(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", _recording_compile(seen))
    model, x = _Tiny(), torch.randn(2, 8)
    assert try_compile(model, lambda m: m(x), quiet=True).compiled
    assert book_compile(model) is model
    assert seen == [True, True]  # this project pins torch >= 2.8


def test_setting_is_left_alone_before_torch_2_8(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.7.1+cpu")
    assert torch_version() == (2, 7) < BOOK_SETTING_MIN_TORCH
    assert apply_book_dynamo_setting() is False
    assert torch._dynamo.config.allow_unspec_int_on_nn_module is False
    monkeypatch.setattr(torch, "__version__", "2.10.0a0+git")
    assert torch_version() == (2, 10)
    assert apply_book_dynamo_setting() is True
    assert torch._dynamo.config.allow_unspec_int_on_nn_module is True


def _graphs_for_generation(
    book_setting: bool, new_tokens: int, cache: bool = True
) -> int:
    """Graphs dynamo builds for the book's generator (eager backend: dynamo's
    tracing and guards without inductor's slow code generation)."""
    from reasoning_from_scratch.qwen3 import Qwen3Model
    from torch._dynamo.utils import counters

    from utils.generation import (
        generate_text_basic_stream,
        generate_text_basic_stream_cache,
    )

    torch.manual_seed(0)
    model = Qwen3Model(tiny_config(vocab_size=300)).eval()
    if book_setting:
        compiled = book_compile(model, backend="eager")
    else:
        compiled = torch.compile(model, backend="eager")
    counters.clear()
    prompt = torch.tensor([[5, 6, 7, 8]])
    generate = generate_text_basic_stream_cache if cache else generate_text_basic_stream
    tokens = list(generate(compiled, prompt, new_tokens))
    assert len(tokens) == new_tokens
    return counters["stats"]["unique_graphs"]


@pytest.mark.heavy_under_emulation
@pytest.mark.slow  # inductor compiles
def test_book_setting_stops_a_recompile_per_token():
    """With the setting: prompt, first token, then one graph with a symbolic
    cache length for all later tokens. Without it: one more graph per token
    (up to recompile_limit). No cache: the prompt's length, then a symbolic
    length."""
    assert _graphs_for_generation(True, 7) == 3
    torch._dynamo.reset()
    assert _graphs_for_generation(True, 7, cache=False) == 2
    torch._dynamo.reset()
    torch._dynamo.config.allow_unspec_int_on_nn_module = False
    assert _graphs_for_generation(False, 7) > 3


@pytest.mark.slow  # compiles a toy model with inductor
def test_compiler_works_reports_a_broken_toolchain(monkeypatch, capsys):
    def broken_compile(model, **kwargs):
        raise RuntimeError("fatal error: Python.h: No such file or directory")

    monkeypatch.setattr(torch, "compile", broken_compile)
    assert compiler_works("cpu") is False
    out = capsys.readouterr()
    assert "python3-dev" in out.err and out.out == ""
    monkeypatch.setattr(torch, "compile", lambda m, **kw: m)
    assert compiler_works("cpu", quiet=True) is True


def _listing_cells() -> dict[str, str]:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    found = {}
    for cell in cells:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and src.startswith("# Listing 2."):
            found[src.split()[2]] = src
    return found


def test_notebook_listings_compile_with_the_books_setting():
    listings = _listing_cells()
    assert set(listings) == {"2.5", "2.6"}
    # The book compiles in its own block, right before Listing 2.5
    code = [
        "".join(c["source"])
        for c in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
        if c["cell_type"] == "code"
    ]
    (compile_cell,) = [s for s in code if "allow_unspec_int_on_nn_module" in s]
    assert code.index(compile_cell) < code.index(listings["2.5"])
    tree = ast.parse(compile_cell)
    setting = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and ast.unparse(node.targets[0])
        == "torch._dynamo.config.allow_unspec_int_on_nn_module"
        and ast.unparse(node.value) == "True"
    ]
    guards = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and ast.unparse(node.test) == "(major, minor) >= (2, 8)"
        and setting
        and setting[0] in node.body
    ]
    compiles = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.compile"
    ]
    assert len(setting) == 1 and len(guards) == 1 and len(compiles) == 1
    assert setting[0].lineno < compiles[0].lineno  # set before compiling
    # Both listings: a warm-up run, then two timed runs, each with stats
    for name, gen in (
        ("2.5", "generate_text_basic_stream("),
        ("2.6", "generate_text_basic_stream_cache("),
    ):
        src = listings[name]
        assert "for i in range(3):" in src and gen in src
        assert "model=model_compiled" in src
        assert 'Warm-up run")' in src and 'Timed run {i}:")' in src
        assert "generate_stats(" in src


def test_compiles_and_matches_eager():
    model, x = _Tiny(), torch.randn(3, 8)
    result = try_compile(model, lambda m: m(x), backend="eager")
    assert result.compiled and result.error is None
    assert result.model is not model  # the compiled wrapper
    torch.testing.assert_close(result.model(x), model(x), rtol=0, atol=0)


def test_backend_failure_falls_back_to_eager(capsys):
    model, x = _Tiny(), torch.randn(3, 8)
    calls = []

    def warmup(m):
        calls.append(m)
        return m(x)

    backend = _failing_backend("fatal error: Python.h: No such file or directory")
    result = try_compile(model, warmup, backend=backend)
    assert not result.compiled
    assert result.model is model
    assert "Python.h" in result.error
    assert "python3-dev" in result.hint
    # The warm-up ran once compiled (and failed), then once in eager mode
    assert len(calls) == 2 and calls[-1] is model
    captured = capsys.readouterr()
    out = captured.err  # diagnostics: stderr, never the reader's stdout
    assert captured.out == "" and "torch.compile failed" in out and "eager" in out
    model_out, compiled = result  # tuple-style unpacking
    assert model_out is model and compiled is False


def test_monkeypatched_compile_failure_is_quiet_when_asked(monkeypatch, capsys):
    def broken_compile(model, **kwargs):
        raise RuntimeError("Dynamo is not supported on this Python version")

    monkeypatch.setattr(torch, "compile", broken_compile)
    model, x = _Tiny(), torch.randn(2, 8)
    result = try_compile(model, lambda m: m(x), quiet=True)
    assert isinstance(result, CompileResult)
    assert not result.compiled and result.model is model
    assert capsys.readouterr() == ("", "")


def test_error_unrelated_to_compiling_is_raised():
    model = _Tiny()
    bad_input = torch.randn(2, 5)  # wrong feature size: fails in eager too
    with pytest.raises(RuntimeError):
        try_compile(model, lambda m: m(bad_input), backend="eager", quiet=True)


def test_hints_match_error_kinds():
    assert "Visual Studio" in compile_hint(RuntimeError("cl is not found"))
    assert "triton" in compile_hint(RuntimeError("Cannot find a working triton"))
    assert "MPS" in compile_hint(RuntimeError("not implemented for 'mps'"))
    # The cause chain is searched too
    try:
        try:
            raise OSError("InvalidCxxCompiler: No working C++ compiler found")
        except OSError as inner:
            raise RuntimeError("backend failed") from inner
    except RuntimeError as outer:
        assert "xcode-select" in compile_hint(outer)
    generic = compile_hint(ValueError("something else entirely"))
    assert "Eager mode" in generic


def test_bad_arguments_have_clear_errors():
    with pytest.raises(ValueError, match="nn.Module"):
        try_compile(lambda x: x, lambda m: None)
    with pytest.raises(ValueError, match="warmup"):
        try_compile(_Tiny(), None)


def test_inductor_code_is_kept_apart_per_cpu_capability(monkeypatch, tmp_path):
    """Unset, set to inductor's own default (importing inductor writes it
    into the variable), or set by the reader to a folder of their own shared
    between runs, the cache becomes one subfolder per capability in it."""
    monkeypatch.setattr(compile_module, "_default_inductor_dir", lambda: str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    native = separate_inductor_cache()
    assert native == str(tmp_path / "capability-native")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2")
    assert separate_inductor_cache() == str(tmp_path / "capability-avx2")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "capability-avx2")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # the default
    assert separate_inductor_cache() == str(tmp_path / "capability-avx2")
    mine = tmp_path / "mine"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(mine))
    assert separate_inductor_cache() == str(mine / "capability-avx2")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(mine / "capability-avx2")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")  # a child inherits the variable
    assert separate_inductor_cache() == str(mine / "capability-native")


def test_an_inductor_folder_another_user_could_change_is_not_used(
    monkeypatch, tmp_path, capsys
):
    """Inductor loads the compiled code it finds in its cache: in a folder
    others may write, the same subfolder of our own cache is used instead."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared / "inductor"))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    private = tmp_path / "cache" / "qwen3-ch02" / "inductor"
    assert separate_inductor_cache() == str(private / "capability-avx2")
    err = capsys.readouterr().err
    assert f"{shared / 'inductor' / 'capability-avx2'}: not used for compiled" in err
    assert f"{shared} can be written by other users (mode 777)" in err
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # then: ours, quietly
    assert separate_inductor_cache() == str(private / "capability-default")
    assert capsys.readouterr().err == ""


COMPILE_AND_RUN = """
import torch
from utils.compile import book_compile
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
x = torch.randn(4, 64)
with torch.no_grad():
    print(float(book_compile(model)(x).sum()))
"""


@pytest.mark.slow  # two processes, each compiling with inductor
def test_compiling_under_one_capability_then_another_shares_no_code(tmp_path):
    """A reader's process compiling under ATEN_CPU_CAPABILITY=avx2 after one
    that compiled under the default, both with the reader's own
    TORCHINDUCTOR_CACHE_DIR, gets its own subfolder there, so it does not
    load the other's code (which crashed torch 2.10 with SIGBUS on AVX-512
    machines); the folder is the capability's whichever runs first. Inductor's
    default folder takes the same subfolders (the unit test above); one pair
    of compiling processes is enough for the mechanism."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY")}  # fmt: skip
    env["TMPDIR"] = str(tmp_path)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "torchinductor_mine")
    runs = []
    for capability in ("", "avx2"):
        run_env = dict(
            env, **({"ATEN_CPU_CAPABILITY": capability} if capability else {})
        )
        proc = subprocess.run(
            [sys.executable, "-c", COMPILE_AND_RUN], env=run_env, cwd=REPO,
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, (capability, proc.returncode, proc.stderr[-800:])
        runs.append(float(proc.stdout.split()[-1]))
    assert runs[0] == pytest.approx(runs[1], rel=1e-5)
    folders = sorted(p.name for p in tmp_path.glob("torchinductor_*/capability-*"))
    assert folders == ["capability-avx2", "capability-native"]
