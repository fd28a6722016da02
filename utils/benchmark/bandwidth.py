"""How a decode step compares with the machine's memory speed.

A decode step reads every weight once, so the memory's read speed bounds
it; on a shared machine that speed changes from one second to the next.
So a step is timed beside a `torch.sum` over exactly the bytes it reads,
right after it (`time_beside_sum`, `paired_share`): the ratio says how
close to the memory's speed of that moment the step ran.

It lives beside the benchmark, not in the fast decoder (`utils.fast`):
the benchmark measures every mode with it, the book's and ours alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from utils.device import synchronize

PAIRED_ROUNDS = 30  # decode steps each timed beside a torch.sum of its bytes

_NOT_WEIGHTS = ("cache", "cos", "sin", "positions", "mask", "inv_freq")


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter and weight
    buffer once (shared tensors once), of an embedding table only one row
    unless the same tensor is also the output layer."""
    seen, embedding_ptrs, total, row_bytes = set(), set(), 0, 0
    for module in model.modules():
        embedding = isinstance(module, torch.nn.Embedding) or getattr(
            module, "is_embedding", False
        )
        tensors = list(module.named_parameters(recurse=False))
        tensors += list(module.named_buffers(recurse=False))
        for name, t in tensors:
            if embedding and t.dim() == 2:
                embedding_ptrs.add(t.data_ptr())
            if any(word in name for word in _NOT_WEIGHTS):
                continue
            if embedding:
                if t.dim() == 2:
                    row_bytes = max(row_bytes, t[0].numel() * t.element_size())
            elif t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    tied = bool(embedding_ptrs & seen)
    return total + (0 if tied else row_bytes)


def read_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """A float32 buffer of ones, `nbytes` long (at least one value), for
    `torch.sum` to read. On a CPU it lies on 2 MB pages where Linux gives
    them, as the native step's weights do (on 4 KB pages it reads slower,
    and would make a step look faster than memory)."""
    count = max(nbytes // 4, 1)
    from utils.fast import huge_page_empty, huge_pages_enabled

    if device.type == "cpu" and huge_pages_enabled():
        return huge_page_empty(count * 4).view(torch.float32).fill_(1.0)
    return torch.ones(count, device=device)


def time_beside_sum(
    step: Callable[[], Any], buffer: torch.Tensor, device: torch.device
) -> tuple[float, float]:
    """(seconds of one `step()`, seconds of one `torch.sum(buffer)` right
    after it): one round of a step timed beside a pure read of its bytes."""
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    mid = time.perf_counter()
    torch.sum(buffer)
    synchronize(device)
    return mid - start, time.perf_counter() - mid


def paired_share(
    stream: Callable[[], Iterable[Any]],
    nbytes: int,
    device: torch.device,
    rounds: int = PAIRED_ROUNDS,
) -> tuple[float, float] | None:
    """(share, GB/s) over up to `rounds` decode steps of one generation:
    the median of (step's read speed) / (the speed of a `torch.sum` over
    `nbytes`, timed right after it), 1.0 being the memory's speed of the
    moment, and the median speed of those sums. None with under 3 steps."""
    tokens = iter(stream())
    if next(tokens, None) is None:  # the first token is the prompt's
        return None
    buffer = read_buffer(nbytes, device)
    torch.sum(buffer)  # start the threads
    end = object()
    last: list[Any] = [None]

    def step() -> None:
        last[0] = next(tokens, end)

    ratios, sums = [], []
    for _ in range(rounds):
        step_s, sum_s = time_beside_sum(step, buffer, device)
        if last[0] is end:
            break
        ratios.append(sum_s / max(step_s, 1e-12))
        sums.append(sum_s)
    if hasattr(tokens, "close"):  # a generator: stop it here
        tokens.close()
    if len(ratios) < 3:
        return None
    return statistics.median(ratios), nbytes / statistics.median(sums) / 1e9


def measure_read_bandwidth(
    device: torch.device, size_bytes: int = 1 << 30, repeats: int = 5
) -> float:
    """The memory read speed in bytes/s: best of `repeats` `torch.sum` over
    a float32 buffer of `size_bytes` on `device` (`read_buffer`)."""
    buf = read_buffer(size_bytes, device)
    torch.sum(buf)  # warm-up: start the threads
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        torch.sum(buf)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return size_bytes / best
