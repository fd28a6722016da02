"""The fast decoder's one door: a registry of decode paths.

The benchmark, the commands, the panel's streamer and the bonus scripts ask
the one registry (`utils.streaming.generation_paths`: the book's paths, then
these); none decides paths itself. A new fast path is one `DecodePath` entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from utils.fast.steps import generate
from utils.log import get_logger

_log = get_logger(__name__)


@dataclass(frozen=True)
class DecodePath:
    """One way to decode with the fast model (`FastQwen3`): static KV cache,
    plus int8 weights, a compiled step or block, the native C step, or the
    fastest kind that runs here (`fastest`: the native step where it can
    run, else the compiled block)."""

    name: str
    summary: str
    int8: bool = False
    compile: str | None = None  # "step" or "block": what compile_decode compiles
    native: bool = False
    fastest: bool = False  # native where it runs, else the compiled block
    in_default_run: bool = True  # run by the benchmark when no modes are named
    family: ClassVar[str] = "fast"

    @property
    def needs(self) -> frozenset[str]:  # "cpu": int8, native kernels: CPUs only
        wants = {"cache": True, "compile": self.compile, "native": self.native,
                 "cpu": self.int8 or self.native}  # fmt: skip
        return frozenset(name for name, on in wants.items() if on)

    def unavailable(self, device: torch.device | str) -> str | None:
        """Why this path cannot run on `device` here (None: it can)."""
        if "cpu" in self.needs and torch.device(device).type != "cpu":
            return "its kernels run on a CPU only"
        if self.native:
            from utils.fast.kernels import get_kernels

            if get_kernels() is None:
                return "the C kernels are not available here (see the line above)"
        return None

    def build(self, book_model: torch.nn.Module, adopt: bool = False) -> Any:
        """The fast model for `book_model` on this path (weights shared, not
        copied). `adopt`: the book model is left empty, so int8
        quantization can free each bf16 matrix as it goes."""
        from utils.fast.quantize import quantize_int8
        from utils.fast.steps import FastQwen3

        fast = FastQwen3.from_book_model(book_model)
        if adopt:  # drop the book model's references to the weights
            for module in book_model.modules():
                for name in list(module._parameters):
                    module._parameters[name] = None
        if self.int8 or self.native or self.fastest:  # not the book's bits anyway
            fast.use_fused_prefill()
        if self.int8:
            quantize_int8(fast)
            note = "approximate, tokens can differ from bf16's"
            _log.info("%s: weight-only int8, half the bytes; %s", self.name, note)
        if self.compile:
            fast.compile_decode(scope=self.compile)
        # fastest by a rule, not a race: on every CPU we measured, the native
        # step beat the compiled one per token and needs no compile time
        # (ch02/03_fast-decoding/README.md); timing both cost seconds and,
        # on a busy machine, could pick the slower
        reason = fast.native_unsupported_reason() if self.fastest else None
        if (self.native or self.fastest) and reason is None and fast.use_native_step():
            _log.info("%s: the native step, one C call per token (%s)", self.name,
                      describe_step(fast))  # fmt: skip
            # int8 prompts: the same multi-row kernel as torch's prefill runs,
            # on the step's team (about as fast on a quiet machine, twice as
            # fast beside a busy process); bf16 prompts stay with torch, whose
            # oneDNN products are far faster than the exact kernel's order
            fast.use_native_prefill(self.int8)
        elif self.fastest:
            fast.compile_decode(scope="block")
            _log.info("%s: the compiled block (native step off: %s)", self.name, reason)
        return fast

    def stream(
        self, model: Any, *args: Any, picker: Any = None
    ) -> Iterator[torch.Tensor]:
        """Tokens (token_ids, max_new_tokens, eos) from what `build` made:
        greedy, or `picker`'s choice."""
        return generate(model, *args, picker=picker)


PATHS: tuple[DecodePath, ...] = (
    DecodePath("fast", "static cache, eager"),
    DecodePath("fast_compiled", "static cache, compiled decode step",
               compile="step"),
    DecodePath("fast_block_compiled",
               "static cache, one compiled block for all layers", compile="block"),
    DecodePath("fast_int8", "static cache, int8 weights, compiled (approximate)",
               int8=True, compile="step"),
    DecodePath("fast_native", "static cache, whole step in one C call (CPU)",
               native=True),
    DecodePath("fast_native_int8",
               "one C call per step, int8 weights (approximate)",
               int8=True, native=True),
    DecodePath("fast_eager_int8", "static cache, int8 weights, eager (approximate)",
               int8=True, in_default_run=False),
    DecodePath("fast_fastest",
               "the native step where it runs, else the compiled block",
               fastest=True, in_default_run=False),
    DecodePath("fast_fastest_int8",
               "int8 weights, the native step where it runs, else compiled",
               int8=True, fastest=True, in_default_run=False),
)  # fmt: skip

_BY_NAME = {p.name: p for p in PATHS}


def get_path(name: str) -> DecodePath:
    """The path called `name`; ValueError naming the choices otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"no decode path {name!r}; choose from {', '.join(_BY_NAME)}"
        ) from None


def path_for(
    device: torch.device | str,
    int8: bool = False,
    compile: bool = False,
    say: Callable[[str], Any] | None = None,
) -> DecodePath:
    """The path the command line's `--fast [--int8] [--compile]` and the
    generation panel's switches mean on `device`: with compile, the fastest
    kind that runs here (`DecodePath.fastest`); else on a CPU the native
    step where it can run (else `say`, default the logger, gets one line
    saying why); else eager. ValueError for int8 off the CPU."""
    int8_tag = "_int8" if int8 else ""
    if int8 and get_path("fast_eager_int8").unavailable(device):  # off the CPU
        raise ValueError("int8 weights run on a CPU only; use --device cpu")
    if compile:
        return get_path(f"fast_fastest{int8_tag}")
    native = get_path(f"fast_native{int8_tag}")
    if torch.device(device).type == "cpu":
        reason = native.unavailable(device)
        if reason is None:
            return native
        (say or _log.warning)(f"native decode step off ({reason})")
    return get_path("fast_eager_int8" if int8 else "fast")


def describe_step(model: Any) -> str | None:
    """The kernels a fast model's native step runs (e.g. "bf16_exact_avx2"),
    None for any other step."""
    step = getattr(model, "decode_step", None)
    return step.describe() if hasattr(step, "describe") else None
