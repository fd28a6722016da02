"""Decode speed per batch size (`python -m utils.benchmark --batch-size 1,4,8`).

A decode step reads every weight once whatever the number of rows, so on a
laptop the first rows of a batch come almost free (memory-bound) until the
arithmetic catches up (compute-bound). Per mode and batch size this times
the decode of `max_new_tokens` tokens for a batch of copies of the prompt,
from the first new token of every row (the prefills done) to the last: total
tokens/sec, tokens/sec per sequence, the total as a multiple of batch 1's,
and the peak memory while it ran (`PeakMemory`).

The modes: `kv_cache` (the book's generator with its KV cache, a batch of
equal prompts), `book_batched` (the book's padding-aware batched model,
`reasoning_from_scratch.qwen3_batched`), and the fast engine's batches on the
native step, `fast_native` and `fast_native_int8` (`utils.fast.BatchDecoder`:
each row's tokens those it gets alone).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from utils.benchmark.modes import PeakMemory

BATCH_MODES = ("kv_cache", "book_batched", "fast_native", "fast_native_int8")


def parse_sizes(text: str) -> list[int]:
    """ "1,4,8,16" as [1, 4, 8, 16]; ValueError saying what to write."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or max(sizes) > 256:
        raise ValueError(
            f"--batch-size takes sizes 1 to 256 like 1,4,8,16, got {text!r}"
        )
    return sorted(set(sizes))


def batch_modes(modes: Sequence[str] | None, device: torch.device) -> list[str]:
    """The batch modes asked for (ValueError naming the choices), or those
    that run on `device` (the fast engine's: a CPU with the C kernels)."""
    if modes is None or list(modes) == ["all"]:
        from utils.fast import get_path

        return [m for m in BATCH_MODES if not m.startswith("fast")
                or get_path(m).unavailable(device) is None]  # fmt: skip
    bad = [m for m in modes if m not in BATCH_MODES]
    if bad or not modes:
        raise ValueError(f"with --batch-size, --modes takes {', '.join(BATCH_MODES)}"
                         f" (got {', '.join(bad) or 'none'})")  # fmt: skip
    return list(dict.fromkeys(modes))


def _book_stream(model, ids: torch.Tensor, n: int) -> Iterator[Any]:
    from utils.generation import generate_text_basic_stream_cache

    return generate_text_basic_stream_cache(model, ids, n)


def _batched_stream(model, ids: torch.Tensor, n: int) -> Iterator[Any]:
    from reasoning_from_scratch.qwen3_batched import (
        generate_text_basic_batched_stream_cache,
    )

    return generate_text_basic_batched_stream_cache(model, ids, n)


def _fast_stream(model, ids: torch.Tensor, n: int) -> Iterator[Any]:
    """The fast engine's events as one step's tokens at a time: a list per
    step once every row has its first token."""
    from utils.fast import BatchDecoder, Request

    size, prompt = ids.shape[0], ids[0].tolist()
    step: list[int] = []
    requests = [Request(i, prompt, n) for i in range(size)]
    for event in BatchDecoder(model, size).run(requests):
        if event.token is None:
            continue
        step.append(event.token)
        if len(step) == size:
            yield step
            step = []


def _builder(mode: str) -> tuple[Callable[[Any], Any], Callable[..., Iterator]]:
    """(build(book_model), stream(model, ids, n)) of a batch mode."""
    if mode == "kv_cache":
        return (lambda book: book), _book_stream
    if mode == "book_batched":
        from utils.models import batched_book_model

        return batched_book_model, _batched_stream
    if mode in ("fast_native", "fast_native_int8"):
        from utils.fast import get_path

        return get_path(mode).build, _fast_stream
    raise ValueError(f"no batch mode {mode!r}; choose from {', '.join(BATCH_MODES)}")


def time_batch(model, stream, ids: torch.Tensor, n: int) -> tuple[float, int]:
    """Seconds from the first step's tokens to the last, and the tokens
    decoded in between (every row's after its first)."""
    start, steps = None, 0
    with torch.inference_mode():
        for _ in stream(model, ids, n):
            if start is None:
                start = time.perf_counter()
            else:
                steps += 1
    if start is None or steps == 0:
        raise ValueError("time_batch needs at least two new tokens per row")
    return time.perf_counter() - start, steps * ids.shape[0]


def batch_rows(
    book_model: torch.nn.Module,
    modes: Sequence[str],
    sizes: Sequence[int],
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    say: Callable[[str], Any] | None = None,
    standin: bool = False,
) -> list[dict[str, Any]]:
    """One row per mode and batch size (see module), modes in turn, each
    built once from `book_model` (which is left as it was); `standin`
    marks the rows as measured on stand-in weights."""
    device, say = prompt_ids.device, say or (lambda _: None)
    rows = []
    for mode in modes:
        build, stream = _builder(mode)
        model = build(book_model)
        for size in sizes:
            ids = prompt_ids.expand(size, -1).contiguous()
            say(f"{mode}: batch of {size}, {max_new_tokens} tokens a row ...")
            with PeakMemory(device) as mem:
                seconds, tokens = time_batch(model, stream, ids, max_new_tokens)
            rows.append({
                "mode": mode, "batch_size": size,
                "total_tokens_per_sec": tokens / seconds,
                "tokens_per_sec_per_sequence": tokens / seconds / size,
                "peak_mem_bytes": mem.peak, "device": str(device),
                "standin": standin,
            })  # fmt: skip
        del model
    for row in rows:
        first = next(r for r in rows if r["mode"] == row["mode"])
        row["vs_batch_1"] = row["total_tokens_per_sec"] / first["total_tokens_per_sec"]
    return rows


def format_batch_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a table of at most 80 columns."""
    lines = [
        f"{'mode':<18} {'batch':>5} {'total tok/s':>12} {'tok/s per seq':>14} "
        f"{'x first':>8} {'peak memory':>12}",
        "-" * 74,
    ]
    for r in rows:
        lines.append(
            f"{r['mode']:<18} {r['batch_size']:>5} {r['total_tokens_per_sec']:>12.1f} "
            f"{r['tokens_per_sec_per_sequence']:>14.1f} {r['vs_batch_1']:>7.2f}x "
            f"{r['peak_mem_bytes'] / 1024**3:>9.2f} GB"
        )
    return "\n".join(lines)
