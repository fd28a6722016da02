"""Many sequences decoded together on the native step (continuous batching).

Every live sequence has a slot: its own KV cache, sized for its prompt and
its new tokens so far (grown by doubling, never the context length for
every slot). One step runs every live sequence as one row of
`NativeStep.rows`: each weight is read once per step for all rows, and each
row's logits are the bits it gets alone. A sequence that stops frees its
slot; the next waiting one is prefilled alone (`prefill`, as `generate`
does) into a fresh slot and joins the next step. So a row never depends on
its batch: greedy tokens are `generate`'s, and a sampled row draws what it
draws alone (its own generator, `utils.sampling`).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from utils.fast.model import cache_length_for
from utils.fast.native import NativeStep
from utils.fast.steps import FastQwen3, prefill
from utils.generation import Picker

# New tokens a slot's first cache holds beyond its prompt (then doubled)
FIRST_NEW = 128


@dataclass
class Request:
    """One sequence to decode: the caller's `key`, the prompt's token ids,
    how many new tokens at most, and a picker (logits (1, vocab) -> token
    (1, 1); None: greedy, the step's own argmax)."""

    key: Hashable
    token_ids: list[int]
    max_new_tokens: int
    picker: Picker | None = None

    def pick(self, logits: Tensor, greedy_token: int | None = None) -> int:
        """The next token from the logits (1, vocab): the picker's, or the
        argmax (`greedy_token` where the step already took it)."""
        if self.picker is not None:
            return int(self.picker(logits))
        if greedy_token is None:
            return int(torch.argmax(logits, dim=-1))
        return greedy_token


@dataclass(frozen=True)
class Event:
    """A new `token` of sequence `key`, or (token None) its end and why:
    "eos" (it produced the end-of-sequence token, not passed on) or
    "length" (max_new_tokens reached)."""

    key: Hashable
    token: int | None
    reason: str | None = None


@dataclass
class _Row:
    request: Request
    cache: list[Tensor]  # per layer keys, values: (1, kv groups, slots, head_dim)
    token: int  # the newest token, fed to the next step
    pos: int  # its position
    produced: int = 1
    limit: int = field(init=False)  # the most slots it can need

    def __post_init__(self) -> None:
        self.limit = self.pos + self.request.max_new_tokens - 1


class BatchDecoder:
    """Decodes requests `batch_size` at a time on a fast model's native
    step (see module); `eos_token_id` ends a sequence. `run` streams the
    events in the order they happen."""

    def __init__(
        self, model: FastQwen3, batch_size: int, eos_token_id: int | None = None
    ) -> None:
        if not (isinstance(model, FastQwen3) and model.decode_native()):
            raise ValueError(
                "batched decoding needs a fast model on the native step "
                "(FastQwen3.use_native_step(), a CPU with the C kernels)"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.model, self.batch_size, self.eos = model, batch_size, eos_token_id
        self._last: tuple[tuple[int, ...], list[Tensor], Tensor] | None = None

    def run(self, requests: Iterable[Request]) -> Iterator[Event]:
        """Every request's tokens and end, as events (see `Event`)."""
        waiting, live = iter(requests), []
        while True:
            while len(live) < self.batch_size:
                request = next(waiting, None)
                if request is None:
                    break
                yield from self._admit(request, live)
            if not live:
                return
            yield from self._step(live)

    @torch.inference_mode()
    def _prefill(self, ids: list[int], slots: int) -> tuple[list[Tensor], Tensor]:
        """The prompt's cache (a fresh slot) and last logits; the last
        prompt's are copied (the samples of one prompt share a prefill)."""
        key = tuple(ids)
        last = self._last
        if last is not None and last[0] == key and last[1][0].shape[2] >= slots:
            # slots past the prompt are written before they are read
            return [t.clone() for t in last[1]], last[2]
        model = self.model
        model.release_cache()  # a new cache, never one a slot holds
        model.setup_cache(1, slots)
        _, logits = prefill(model, torch.tensor([ids]))
        cache = [t for b in model.trf_blocks for t in (b.att.k_cache, b.att.v_cache)]
        model.release_cache()
        self._last = (key, cache, logits)
        return cache, logits

    def _admit(self, request: Request, live: list[_Row]) -> Iterator[Event]:
        """Prefill one request into a new slot: its first token, and a row
        of `live` unless it ended there."""
        n, new = len(request.token_ids), request.max_new_tokens
        if new == 0:
            yield Event(request.key, None, "length")
            return
        context = self.model.cfg["context_length"]
        if n == 0 or n + new > context:
            raise ValueError(
                f"request {request.key!r}: prompt ({n} tokens) + max_new_tokens "
                f"({new}) must be 1..{context} tokens"
            )
        slots = cache_length_for(n + min(new, FIRST_NEW), context)
        cache, logits = self._prefill(request.token_ids, slots)
        token = request.pick(logits)
        yield from self._emit(_Row(request, cache, token, n), live)

    def _emit(self, row: _Row, live: list[_Row]) -> Iterator[Event]:
        """Row's newest token (or its end), keeping it in `live` while it
        goes on."""
        key = row.request.key
        if row.token == self.eos:
            yield Event(key, None, "eos")
        else:
            yield Event(key, row.token)
            if row.produced < row.request.max_new_tokens:
                live.append(row)
                return
            yield Event(key, None, "length")

    def _step(self, live: list[_Row]) -> Iterator[Event]:
        """One native step for every live row, then each row's next token."""
        for row in live:
            _grow(row, self.model.cfg["context_length"])
        rows = list(live)
        live.clear()
        step: NativeStep = self.model.decode_step  # type: ignore[assignment]
        greedy, logits = step.rows(
            self.model, [r.token for r in rows], [r.pos for r in rows],
            [r.cache for r in rows],
        )  # fmt: skip
        for i, row in enumerate(rows):
            row.token = row.request.pick(logits[i : i + 1], greedy[i])
            row.pos, row.produced = row.pos + 1, row.produced + 1
            yield from self._emit(row, live)


def _grow(row: _Row, context: int) -> None:
    """Room in the row's cache for its position: at least twice the slots
    (rounded as `cache_length_for`), never more than it can need."""
    slots = row.cache[0].shape[2]
    if row.pos < slots:
        return
    length = min(cache_length_for(max(row.pos + 1, 2 * slots), context),
                 cache_length_for(row.limit + 1, context))  # fmt: skip
    grown = []
    for t in row.cache:
        new = torch.zeros(t.shape[0], t.shape[1], length, t.shape[3], dtype=t.dtype)
        new[:, :, :slots] = t
        grown.append(new)
    row.cache = grown


@torch.inference_mode()
def step_rates(
    model: FastQwen3, sizes: Iterable[int], steps: int = 2
) -> dict[int, float]:
    """Tokens per second of one native step of each batch size in `sizes`
    on this machine now (rows at the start of caches of 64 slots; one
    step to warm up, then the best of `steps`): what a batch size gives
    before a run, to choose one."""
    cfg, rates = model.cfg, {}
    step: NativeStep = model.decode_step  # type: ignore[assignment]
    shape = (1, cfg["n_kv_groups"], 64, model.head_dim)
    for size in sizes:
        per_row = 2 * cfg["n_layers"]
        caches = [
            [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(per_row)]
            for _ in range(size)
        ]
        best = float("inf")
        for i in range(steps + 1):
            start = time.perf_counter()
            step.rows(model, [0] * size, [8] * size, caches)
            if i:
                best = min(best, time.perf_counter() - start)
        rates[size] = size / best
    return rates
