"""Greedy text generation as written in Chapter 2 (listings 2.2-2.4).

The two generators stream one token at a time so a notebook can print text as
it appears. They pick the most likely next token (argmax), or let a picker
choose (`utils.sampling`, the book's later sampling), and stop early when
the model produces the end-of-sequence token. `generate_stats` reports speed
and memory the way the book's Table 2.1 does. `BOOK_PATHS` names the book's
four ways to generate (with or without the KV cache, compiled or not) as
entries of the project's one registry (`utils.streaming.generation_paths`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from reasoning_from_scratch.qwen3 import KVCache

from utils.device import peak_memory_bytes, reset_peak_memory

# picks one sequence's next token (1, 1) from its logits (1, vocab)
Picker = Callable[[torch.Tensor], torch.Tensor]


def check_generation_inputs(
    model: torch.nn.Module, token_ids: torch.Tensor, max_new_tokens: int
) -> None:
    """Raise a ValueError that says what to fix when generation cannot work."""
    if not isinstance(token_ids, torch.Tensor):
        raise ValueError(
            "token_ids must be a tensor, e.g. "
            "torch.tensor(tokenizer.encode(prompt)).unsqueeze(0)"
        )
    if token_ids.ndim != 2:
        raise ValueError(
            f"token_ids must have shape (batch, num_tokens), got "
            f"{tuple(token_ids.shape)}; add the batch dimension with "
            f".unsqueeze(0)"
        )
    if token_ids.shape[1] == 0:
        raise ValueError("The prompt is empty: encode at least one token.")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValueError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    cfg = getattr(model, "cfg", None)
    if cfg is not None and "context_length" in cfg:
        total = token_ids.shape[1] + max_new_tokens
        if total > cfg["context_length"]:
            raise ValueError(
                f"Prompt ({token_ids.shape[1]} tokens) + max_new_tokens "
                f"({max_new_tokens}) = {total} exceeds the model's context "
                f"length of {cfg['context_length']}; shorten the prompt or "
                f"ask for fewer new tokens."
            )


def _is_eos(next_token: torch.Tensor, eos_token_id: int | None) -> bool:
    return eos_token_id is not None and bool(torch.all(next_token == eos_token_id))


def _next_token(out: torch.Tensor, picker: Picker | None) -> torch.Tensor:
    """The chapter's argmax (batch, 1), or `picker`'s choice (a batch of 1)."""
    if picker is None:
        return torch.argmax(out, dim=-1, keepdim=True)
    return picker(out)


@torch.inference_mode()
def _stream(model, token_ids, max_new_tokens, eos_token_id, picker=None):
    model.eval()
    for _ in range(max_new_tokens):
        # Re-run the whole sequence and keep the logits of the last position
        out = model(token_ids)[:, -1]  # (batch, vocab_size)
        next_token = _next_token(out, picker)  # (batch, 1)
        if _is_eos(next_token, eos_token_id):
            break
        yield next_token
        token_ids = torch.cat([token_ids, next_token], dim=1)


def generate_text_basic_stream(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    picker: Picker | None = None,
) -> Iterator[torch.Tensor]:
    """Yield greedy next tokens (shape (batch, 1)) without a KV cache.

    Every step feeds the full sequence through the model again, which is
    simple but makes step t cost O(t) work. `picker` (a batch of 1): picks
    each token from the logits instead (`utils.sampling.TokenPicker`).
    """
    check_generation_inputs(model, token_ids, max_new_tokens)
    return _stream(model, token_ids, max_new_tokens, eos_token_id, picker)


def _stream_cache(model, token_ids, max_new_tokens, eos_token_id, picker=None):
    cache = KVCache(n_layers=model.cfg["n_layers"])
    return _stream_from(
        model, cache, 0, token_ids, max_new_tokens, eos_token_id, picker
    )


def truncate_kv_cache(model: torch.nn.Module, cache: KVCache, length: int) -> None:
    """Keep the keys/values of the first `length` positions in the book's
    `cache` and set the book's `model` to go on from there (e.g. a chat's
    next turn, or the end of a turn that Ctrl-C cut short)."""
    for i, entry in enumerate(cache.get_all()):
        if entry is not None:
            keys, values = entry
            kept = (keys[:, :, :length], values[:, :, :length])
            cache.update(i, kept if length else None)
    getattr(model, "_orig_mod", model).current_pos = length  # compiled or not


@torch.inference_mode()
def _stream_from(
    model, cache, start, token_ids, max_new_tokens, eos_token_id, picker=None
):
    model.eval()
    truncate_kv_cache(model, cache, start)
    # Prefill: the prompt (after the `start` tokens already in the cache)
    # goes through once and fills the cache
    out = model(token_ids[:, start:], cache=cache)[:, -1]
    for _ in range(max_new_tokens):
        next_token = _next_token(out, picker)
        if _is_eos(next_token, eos_token_id):
            break
        yield next_token
        # Decode: only the new token goes in; keys/values come from the cache
        out = model(next_token, cache=cache)[:, -1]


def generate_text_basic_stream_cache(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    picker: Picker | None = None,
) -> Iterator[torch.Tensor]:
    """Yield the same tokens as `generate_text_basic_stream`, using the book's
    KVCache so each step processes only the newest token (`picker`: as
    there)."""
    check_generation_inputs(model, token_ids, max_new_tokens)
    return _stream_cache(model, token_ids, max_new_tokens, eos_token_id, picker)


def generate_text_stream_from_cache(
    model: torch.nn.Module,
    cache: KVCache,
    start: int,
    token_ids: torch.Tensor,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    picker: Picker | None = None,
) -> Iterator[torch.Tensor]:
    """`generate_text_basic_stream_cache` with a cache that already holds the
    keys/values of `token_ids[:, :start]` (from an earlier generation with
    this cache and model): only the rest is prefilled. The same tokens as a
    fresh prefill of `token_ids`, up to float rounding (a chat keeps its
    cache between turns with this: `utils.chat_cache`)."""
    check_generation_inputs(model, token_ids, max_new_tokens)
    if not 0 <= start < token_ids.shape[1]:
        raise ValueError(f"start must be in [0, {token_ids.shape[1]}), got {start}")
    return _stream_from(
        model, cache, start, token_ids, max_new_tokens, eos_token_id, picker
    )


def stats_lines(stats: dict[str, Any], decimal_below: float = 1.0) -> list[str]:
    """The book's printed lines for a `generate_stats` result: time,
    tokens/sec (a whole number as in the book; one decimal below
    `decimal_below`: 1 in the notebooks, where the book's `int()` would print
    0; the commands pass 10, so 1.87 reads "1.9", not "1") and peak memory."""
    rate = stats["tokens_per_sec"]
    if not math.isfinite(rate):
        speed = "n/a tokens/sec (too short to time)"
    else:
        speed = f"{int(rate) if rate >= decimal_below else round(rate, 1)} tokens/sec"
    memory = f"{stats['memory_kind']}: {stats['peak_mem_bytes'] / 1024**3:.2f} GB"
    return [f"Time: {stats['time_s']:.2f} sec", speed, memory]


class PrintedStats(dict):
    """`generate_stats`' figures, a dict. Its lines are printed already (the
    book's function prints them and returns None), so Jupyter does not echo
    the dict again when the call ends a cell, as the book's Listing 2.3 cells
    do; `print(stats)` or `stats["time_s"]` read it as usual."""

    def _ipython_display_(self) -> None:
        """Shown as nothing: IPython calls this instead of printing Out[n]."""


def generate_stats(
    output_token_ids: torch.Tensor,
    tokenizer: Any,
    start_time: float,
    end_time: float,
    quiet: bool = False,
) -> dict[str, Any]:
    """Print (unless quiet) and return time, tokens/sec and peak memory for
    one generation run, as in the book's Table 2.1. A run too short for the
    clock (no elapsed time) reports the speed as NaN instead of failing."""
    total_time = max(end_time - start_time, 0.0)
    num_tokens = int(output_token_ids.numel())
    device = output_token_ids.device
    mem_bytes, mem_label = peak_memory_bytes(device)
    rate = num_tokens / total_time if total_time > 0 else math.nan
    stats = {
        "time_s": total_time,
        "num_tokens": num_tokens,
        "tokens_per_sec": rate,
        "peak_mem_bytes": mem_bytes,
        "memory_kind": mem_label,
        "device": str(device),
    }
    if not quiet:
        print("\n\n" + "\n".join(stats_lines(stats)))
    reset_peak_memory(device)
    return PrintedStats(stats)


# ---------------------------------------------------------------------------
# The book's ways to generate: entries of the one registry, beside the fast
# decoder's (utils.streaming.generation_paths; utils.fast.PATHS)
# ---------------------------------------------------------------------------


def _as_loaded(book_model: torch.nn.Module, adopt: bool = False) -> torch.nn.Module:
    return book_model


def _book_compiled(book_model: torch.nn.Module, adopt: bool = False) -> Any:
    from utils.compile import book_compile

    return book_compile(book_model)


@dataclass(frozen=True)
class BookPath:
    """One of the book's ways to generate: its generator with or without the
    KV cache (`needs` "cache"), on the model as loaded or compiled the
    book's way (`needs` "compile"). The same kind of entry as the fast
    decoder's `utils.fast.DecodePath`: `name`, `summary`, `needs`,
    `unavailable`, `build` and `stream`."""

    name: str
    summary: str
    needs: frozenset[str] = frozenset()
    family: ClassVar[str] = "book"
    int8: ClassVar[bool] = False
    in_default_run: ClassVar[bool] = True  # run by the benchmark when none named

    def unavailable(self, device: torch.device | str) -> str | None:
        """Why this path cannot run on `device` (never: the book's code runs
        on every device)."""
        return None

    @property
    def build(self) -> Callable[..., Any]:
        """`build(book_model, adopt=False)`: the model to stream from. The
        compiled paths share one builder, so a caller that keeps what each
        builder made compiles once for both."""
        return _book_compiled if "compile" in self.needs else _as_loaded

    def stream(
        self,
        model: torch.nn.Module,
        token_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_id: int | None = None,
        picker: Picker | None = None,
    ) -> Iterator[torch.Tensor]:
        """The book's generator on `model` (built by `build`); `picker`
        picks each token instead of argmax."""
        generator = generate_text_basic_stream
        if "cache" in self.needs:
            generator = generate_text_basic_stream_cache
        return generator(model, token_ids, max_new_tokens, eos_token_id, picker)


BOOK_PATHS: tuple[BookPath, ...] = (
    BookPath("regular", "book, no cache"),
    BookPath("regular_compiled", "book, no cache, torch.compile",
             frozenset({"compile"})),
    BookPath("kv_cache", "book KVCache", frozenset({"cache"})),
    BookPath("kv_cache_compiled", "book KVCache, torch.compile",
             frozenset({"cache", "compile"})),
)  # fmt: skip
