"""Decode steps, and prefill / decode / generate with them (gpt-fast style).

A decode step turns one token (b, 1) at one position into the next token
and the logits: the model's own forward (`EagerStep`), a torch.compile'd
step or block (`CompiledStep`) or one C call (`utils.fast.native`).
`FastQwen3` is the model with a chosen step; `generate` streams tokens
like the book's `generate_text_basic_stream_cache`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import torch
from torch import Tensor

from utils.fast.model import StaticQwen3, block_forward, greedy_step
from utils.fast.native import NativeStep, unsupported_reason
from utils.generation import Picker, check_generation_inputs
from utils.log import get_logger

_log = get_logger(__name__)


class DecodeStep(Protocol):
    """`step(model, cur_token (b, 1), input_pos (1,), kv_len)` -> (next token
    (b, 1), logits (b, vocab)); static-shape steps ignore `kv_len`."""

    kind: str  # "eager", "compiled" or "native"
    fresh_outputs: bool  # each call returns new tensors (no copies needed)

    def __call__(
        self, model: StaticQwen3, cur_token: Tensor, input_pos: Tensor, kv_len=None
    ) -> tuple[Tensor, Tensor]: ...


class EagerStep:
    """The model's own forward, over `kv_len` cache slots when given."""

    kind = "eager"
    fresh_outputs = False  # a model's forward may hand out its own buffers

    def __call__(self, model, cur_token, input_pos, kv_len=None):
        return greedy_step(model, cur_token, input_pos, kv_len)


EAGER = EagerStep()


class CompiledStep:
    """Calls a compiled step, `compiled(model, cur_token, input_pos)`: the
    whole step, or the eager step with a compiled layer (scope "block").
    If compiling fails (e.g. no C++ compiler) it says so in one line on
    stderr and runs the eager step from then on (`failed`)."""

    kind = "compiled"
    fresh_outputs = False  # CUDA graphs reuse their output memory

    def __init__(self, compiled: Callable) -> None:
        self.compiled = compiled
        self.failed = False

    def __call__(self, model, cur_token, input_pos, kv_len=None):
        if not self.failed:
            try:
                return self.compiled(model, cur_token, input_pos)
            except Exception as exc:  # noqa: BLE001 - any compiler failure
                self._fail(exc)
        return greedy_step(model, cur_token, input_pos, kv_len)

    def _fail(self, exc: Exception) -> None:
        from utils.compile import compile_hint
        from utils.errors import first_line

        self.failed = True
        _log.warning(
            "torch.compile failed (%s); using the eager decode step. %s",
            first_line(exc, 200), compile_hint(exc),
        )  # fmt: skip


def _renew_native_step(model: FastQwen3, incompatible: Any) -> None:
    # a native step points at the weights: renew it when they are replaced
    step = model.decode_step
    if isinstance(step, NativeStep):
        model.decode_step = NativeStep(model, kernels=step.forced)


class FastQwen3(StaticQwen3):
    """`StaticQwen3` with the decode step that `generate` uses: eager by
    default, compiled (`compile_decode`) or native (`use_native_step`)."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__(cfg)
        self.decode_step: DecodeStep = EAGER  # what decode_one_token runs
        self.native_prefill = False  # see use_native_prefill
        self.compile_scope: str | None = None  # "step" or "block" once compiled
        self.register_load_state_dict_post_hook(_renew_native_step)

    def on_layers_replaced(self) -> None:
        """Drop a compiled or native step that saw the old layers (called by
        `quantize_int8`)."""
        self.decode_step, self.compile_scope = EAGER, None

    def compile_decode(
        self,
        mode: str | None = None,
        options: Mapping[str, Any] | None = None,
        scope: str = "step",
    ) -> FastQwen3:
        """Compile the decode step used by `generate`: scope="step", the whole
        step as one graph (fastest per token; CUDA graphs on CUDA); "block",
        the transformer block compiled once for every layer, the rest eager
        (a fraction of the compile time). If compiling fails, generation
        falls back to eager with a one-line message."""
        if scope not in ("step", "block"):
            raise ValueError(f'scope must be "step" or "block", got {scope!r}')
        from utils.compile import separate_inductor_cache

        if mode is None and options is None and self.device.type == "cuda":
            mode = "reduce-overhead" if scope == "step" else None
        options = dict(options) if options else None
        separate_inductor_cache()  # compiled code kept apart per CPU capability
        compile_fn = functools.partial(
            torch.compile, fullgraph=True, dynamic=False, mode=mode, options=options
        )
        if scope == "block":  # static shapes: no kv_len
            block_fn = compile_fn(block_forward)
            step = functools.partial(greedy_step, block_fn=block_fn)
        else:
            step = compile_fn(greedy_step)
        self.decode_step, self.compile_scope = CompiledStep(step), scope
        return self

    def decode_compiled(self) -> bool:
        """Whether `generate` will use a compiled decode step."""
        step = self.decode_step
        return isinstance(step, CompiledStep) and not step.failed

    def native_unsupported_reason(self) -> str | None:
        """Why the native step cannot run this model here (None: it can)."""
        return unsupported_reason(self)

    def use_native_step(self, enabled: bool = True, kernels: str | None = None) -> bool:
        """Run each decode step (batch 1, CPU) as one C call (close to, not
        bit-equal with, eager), in place of a compiled step; `kernels`
        forces kernels (see `NativeStep`). Returns whether it is on; where
        it cannot run, says why in one line and keeps the current step."""
        if not enabled:
            if self.decode_native():
                self.decode_step = EAGER
            return False
        reason = unsupported_reason(self)
        if reason is not None:
            _log.warning("native decode step off (%s)", reason)
            return False
        self.decode_step = NativeStep(self, kernels=kernels)
        self.compile_scope = None
        return True

    def decode_native(self) -> bool:
        """Whether `generate` will use the native (one C call) decode step."""
        return isinstance(self.decode_step, NativeStep)

    def use_native_prefill(self, enabled: bool = True) -> None:
        """Prefill one sequence's prompt through the native step's rows
        (`NativeStep.prefill`: each token the decode step's bits, on the
        step's own thread team, which yields a busy core instead of
        spinning) wherever the native step runs; elsewhere as before."""
        self.native_prefill = enabled

    def release_cache(self) -> None:
        """Drop the KV cache, so its memory is freed (a chat's /clear)."""
        super().release_cache()
        if isinstance(self.decode_step, NativeStep):
            self.decode_step.drop_cache()


@torch.inference_mode()
def prefill(model: StaticQwen3, token_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Run the prompt (b, t) from position 0, filling the cache; returns the
    greedy next token (b, 1) and the last position's logits (b, vocab)."""
    return prefill_at(model, token_ids, 0)


@torch.inference_mode()
def prefill_at(
    model: StaticQwen3, token_ids: Tensor, start: int
) -> tuple[Tensor, Tensor]:
    """`prefill` for tokens (b, t) at positions start.. whose cache already
    holds positions 0..start-1 (a chat's next turn prefills only its own
    tokens); the same returns. A model set to `use_native_prefill` runs a
    prompt of one sequence through its native step's rows."""
    model.use_cpu_matvec()
    step = getattr(model, "decode_step", None)
    if (
        getattr(model, "native_prefill", False)
        and isinstance(step, NativeStep)
        and token_ids.shape[0] == 1
        and token_ids.is_cpu
        and model.cpu_matvec_wanted
    ):
        return step.prefill(model, token_ids, start)
    end = start + token_ids.shape[1]
    input_pos = torch.arange(start, end, device=token_ids.device)
    return greedy_step(model, token_ids, input_pos, end)


@torch.inference_mode()
def decode_one_token(
    model: StaticQwen3, cur_token: Tensor, input_pos: Tensor, kv_len: int | None = None
) -> tuple[Tensor, Tensor]:
    """One decode step: token (b, 1) at position `input_pos` (shape (1,)) ->
    (next token (b, 1), logits (b, vocab)), with the model's decode step
    (eager for a plain StaticQwen3: over `kv_len` cache slots when given)."""
    step = getattr(model, "decode_step", EAGER)
    next_token, logits = step(model, cur_token, input_pos, kv_len)
    if getattr(step, "fresh_outputs", False):
        return next_token, logits
    # CUDA graphs reuse their output memory on the next replay: keep copies
    return next_token.clone(), logits.clone()


def generate(
    model: FastQwen3,
    token_ids: Tensor,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    start: int = 0,
    picker: Picker | None = None,
) -> Iterator[Tensor]:
    """Yield greedy tokens (shape (batch, 1)) like the book's
    `generate_text_basic_stream_cache`: stop when every sequence produced
    `eos_token_id`, never yielding it or anything after it. `start` > 0:
    the model's cache already holds the keys/values of the first `start`
    tokens (an earlier generation on it, `cache_epoch` unchanged since);
    only the rest is prefilled. `picker` (batch 1): picks each token from
    the logits instead of argmax (`utils.sampling.TokenPicker`)."""
    if not isinstance(model, FastQwen3):
        raise TypeError(
            "generate() needs a FastQwen3; wrap the book's model with "
            "FastQwen3.from_book_model(model)"
        )
    check_generation_inputs(model, token_ids, max_new_tokens)
    if not 0 <= start < token_ids.shape[1]:
        raise ValueError(f"start must be in [0, {token_ids.shape[1]}), got {start}")
    if picker is not None and token_ids.shape[0] != 1:
        raise ValueError("a picker picks for one sequence: give a batch of one")
    return _generate(model, token_ids, max_new_tokens, eos_token_id, start, picker)


@torch.inference_mode()
def _all_eos(token: Tensor, eos_token_id: int) -> bool:
    """Whether every row's token is EOS; on CPU through one `tolist`, where
    `torch.all(token == eos)` takes three torch calls (each slow with the
    caches cold after a step's weights streamed through)."""
    if token.is_cpu:
        return all(t == eos_token_id for row in token.tolist() for t in row)
    return bool(torch.all(token == eos_token_id))


def _generate(model, token_ids, max_new_tokens, eos_token_id, start=0, picker=None):
    if max_new_tokens == 0:
        return
    model.eval()
    batch, prompt_len = token_ids.shape
    device = token_ids.device
    model.setup_cache(batch, prompt_len + max_new_tokens, device, keep=start)

    def pick(token_and_logits):
        token, logits = token_and_logits
        return token if picker is None else picker(logits)

    def step(token, input_pos, kv_len):
        return pick(decode_one_token(model, token, input_pos, kv_len))

    # On asynchronous devices, queue step i+1 before looking at token i: the
    # EOS check then waits for a token that is already done while the device
    # keeps working. On CPU nothing runs ahead, so compute only on demand.
    look_ahead = device.type != "cpu"

    if start:
        token = pick(prefill_at(model, token_ids[:, start:], start))
    else:
        token = pick(prefill(model, token_ids))
    input_pos = torch.tensor([prompt_len], device=device)
    for i in range(max_new_tokens):
        more = i + 1 < max_new_tokens
        if more and look_ahead:
            upcoming = step(token, input_pos, prompt_len + i + 1)
        if eos_token_id is not None and _all_eos(token, eos_token_id):
            break
        yield token
        if more and not look_ahead:
            upcoming = step(token, input_pos, prompt_len + i + 1)
        if more:
            token = upcoming
            input_pos = input_pos + 1
