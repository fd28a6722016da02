"""`torch.compile` with a safety net for notebooks.

`torch.compile` is lazy: it returns at once and only builds kernels on the
first call, which is where a missing C++ compiler, missing Python headers or
an unsupported backend shows up. `try_compile` therefore runs a warm-up call
and, if compiling fails, explains why and hands back the eager model so the
notebook can carry on.

Every compile here first applies the book's dynamo setting
(`apply_book_dynamo_setting`), so compiled models behave as in Chapter 2,
and keeps inductor's compiled code apart per `ATEN_CPU_CAPABILITY`
(`separate_inductor_cache`).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import platform
import re
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from utils import linksafe, settings
from utils.device import torch_version
from utils.log import get_logger

_log = get_logger(__name__)
_shared_said: set[str] = set()  # inductor folders already reported as shared

# (substrings of the error text, case-sensitive; advice); first match wins
_HINTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("Python.h",),
        "The Python development headers are missing. On Debian/Ubuntu run "
        "`sudo apt install python3-dev build-essential` (use the python3.X-dev "
        "package that matches your Python), on Fedora `sudo dnf install "
        "python3-devel gcc-c++`; then restart the kernel.",
    ),
    (
        ("InvalidCxxCompiler", "C++ compiler", "No such file or directory: 'g++'"),
        "No working C++ compiler was found. Linux: `sudo apt install "
        "build-essential`; macOS: `xcode-select --install`; Windows: install "
        "the Visual Studio Build Tools ('Desktop development with C++') and "
        "start Jupyter from the 'x64 Native Tools Command Prompt'.",
    ),
    (
        ("cl is not found", "cl.exe"),
        "torch.compile on Windows needs the MSVC compiler `cl.exe`: install "
        "the Visual Studio Build Tools ('Desktop development with C++') and "
        "start Jupyter from the 'x64 Native Tools Command Prompt'.",
    ),
    (
        ("triton", "Triton"),
        "The GPU backend needs Triton: `pip install triton` on Linux, "
        "`pip install triton-windows` on Windows. GPUs older than compute "
        "capability 7.0 are not supported by Triton; eager mode still works.",
    ),
    (
        ("MPS", "'mps'", "mps:"),
        "torch.compile support for Apple's MPS backend is still experimental. "
        "Update PyTorch, or compile on the CPU, or stay in eager mode.",
    ),
    (
        ("CppCompileError", "C++ compile error"),
        "The generated C++ code did not compile. Check that a recent C++ "
        "compiler (gcc/clang/MSVC) and the Python headers are installed.",
    ),
)

_GENERIC_HINT = (
    "Check that a C++ compiler and the Python development headers are "
    "installed (see ch02/02_setup-tips/troubleshooting.md). Eager mode gives "
    "the same results, only slower."
)


@dataclass
class CompileResult:
    """What `try_compile` produced: the model to use and whether it compiled."""

    model: torch.nn.Module
    compiled: bool
    error: str | None = None
    hint: str | None = None

    def __iter__(self):
        # Allows `model, compiled = try_compile(...)`
        return iter((self.model, self.compiled))


BOOK_SETTING_MIN_TORCH = (2, 8)


def _default_inductor_dir() -> str:
    """Inductor's default cache folder, by its own rule (`default_cache_dir`
    in torch/_inductor/runtime/cache_dir_utils.py). Computed here: importing
    inductor sets TORCHINDUCTOR_CACHE_DIR to it as a side effect."""
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, OSError):  # no name for this uid
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")


def separate_inductor_cache() -> str:
    """Point inductor at a subfolder per `ATEN_CPU_CAPABILITY` of its cache
    folder (the reader's `TORCHINDUCTOR_CACHE_DIR`, else inductor's default),
    and return the subfolder.

    Why: inductor's FX-graph cache does not key on the capability, and code
    compiled under one capability, reused by a process running under
    another, crashes it with SIGBUS (torch 2.10): in inductor's default
    folder and in one a reader shares between runs alike. Called before
    every compile here. A variable that already names one of our
    `capability-*` subfolders (set by this process, or inherited by a child
    that may run under another capability) counts as the folder above it."""
    given = os.path.normpath(settings.text("TORCHINDUCTOR_CACHE_DIR") or ".")
    if given == ".":
        base = os.path.normpath(_default_inductor_dir())
    elif os.path.basename(given).startswith("capability-"):
        base = os.path.dirname(given)
    else:
        base = given
    capability = (settings.text("ATEN_CPU_CAPABILITY") or "native").lower()
    folder = _private_if_shared(os.path.join(base, f"capability-{capability}"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


def _private_if_shared(folder: str) -> str:
    """`folder`, or where another user could change it (inductor loads the
    compiled code it finds there: its default lives in /tmp, where another
    user may make `torchinductor_<you>` first) the same subfolder under this
    project's own cache, said once (`utils.linksafe.untrusted_reason`)."""
    with contextlib.suppress(OSError):  # inductor says it if it cannot
        os.makedirs(folder, exist_ok=True)
    reason = linksafe.untrusted_reason(folder)
    if reason is None:
        return folder
    private = str(settings.cache_root() / "inductor" / os.path.basename(folder))
    if folder not in _shared_said:
        _shared_said.add(folder)
        _log.warning(
            f"{folder}: not used for compiled code ({reason}); using {private}"
        )
    return private


def apply_book_dynamo_setting() -> bool:
    """The book's line before `torch.compile`: on PyTorch >= 2.8 set
    `torch._dynamo.config.allow_unspec_int_on_nn_module = True`.

    Without it dynamo bakes integer attributes of a module (the book's
    `self.current_pos`, which moves by one per cached token) into the graph
    as constants, so the KV-cache model recompiles at every step until
    `recompile_limit` and then runs eagerly. The setting is process-wide, as
    in the book. Returns True when it was set.
    """
    if torch_version() < BOOK_SETTING_MIN_TORCH:
        return False
    torch._dynamo.config.allow_unspec_int_on_nn_module = True
    return True


def book_compile(model: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """`torch.compile(model)` the way the book does it: the book's dynamo
    setting first (see `apply_book_dynamo_setting`), and its compiled code
    kept apart per CPU capability (`separate_inductor_cache`)."""
    apply_book_dynamo_setting()
    separate_inductor_cache()
    return torch.compile(model, **compile_kwargs)


def compile_hint(error: BaseException) -> str:
    """Advice on how to fix a compilation error, based on its text."""
    text = "".join(traceback.format_exception_only(type(error), error))
    cause = error.__cause__
    while cause is not None:
        text += "".join(traceback.format_exception_only(type(cause), cause))
        cause = cause.__cause__
    for needles, hint in _HINTS:
        if any(needle in text for needle in needles):
            return hint
    return _GENERIC_HINT


def _root_cause(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def _short(error: BaseException, limit: int = 300) -> str:
    """One line for the reader: the root cause and its most telling line
    (a compiler's `error:` line when there is one)."""
    from utils.errors import first_line

    root = _root_cause(error)
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    telling = [line for line in lines if "error:" in line.lower()]
    if not telling:
        return first_line(root, limit)
    msg = f"{type(root).__name__}: {telling[0]}"
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def try_compile(
    model: torch.nn.Module,
    warmup: Callable[[torch.nn.Module], Any],
    quiet: bool = False,
    **compile_kwargs: Any,
) -> CompileResult:
    """Compile `model` and run `warmup(compiled_model)` to build the kernels.

    If compiling fails, say the reason and a fix on stderr (unless `quiet`)
    and return the eager `model` instead. If `warmup` also fails in eager
    mode, the error has nothing to do with compiling and is raised.
    `compile_kwargs` go to `torch.compile` (e.g. `backend`, `mode`).
    Like the book, it sets `allow_unspec_int_on_nn_module` first (PyTorch
    >= 2.8) so the KV-cache model's moving position does not recompile
    `forward` at every step (see `apply_book_dynamo_setting`).
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model)!r}")
    if not callable(warmup):
        raise ValueError(
            "warmup must be a function that runs the model once, e.g. "
            "lambda m: m(token_ids)"
        )
    try:
        compiled = book_compile(model, **compile_kwargs)
        warmup(compiled)
    except Exception as exc:  # noqa: BLE001 - any compiler failure falls back
        error, hint = _short(exc), compile_hint(exc)
        torch._dynamo.reset()  # drop half-built graphs and guards
        warmup(model)  # raises if the problem is not the compiler
        if not quiet:
            _log.warning(
                "torch.compile failed on %s: %s\nHow to fix: %s\n"
                "Continuing with the uncompiled (eager) model.",
                platform.system(), error, hint,
            )  # fmt: skip
        return CompileResult(model=model, compiled=False, error=error, hint=hint)
    return CompileResult(model=compiled, compiled=True)


def compiler_works(device: torch.device | str = "cpu", quiet: bool = False) -> bool:
    """Compile and run a two-layer toy model on `device` (a few seconds):
    True if the toolchain works, else say why and how to fix it (stderr)."""
    torch.manual_seed(0)
    toy = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.SiLU())
    toy = toy.to(device)
    x = torch.randn(2, 16, device=device)
    with torch.no_grad():
        return try_compile(toy, lambda m: m(x), quiet=quiet).compiled
