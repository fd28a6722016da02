"""`utils.compile.try_compile`: falls back to eager mode when compiling fails."""

import pytest
import torch

from utils.compile import CompileResult, compile_hint, try_compile


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
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


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
    out = capsys.readouterr().out
    assert "torch.compile failed" in out and "eager" in out
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
    assert capsys.readouterr().out == ""


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
