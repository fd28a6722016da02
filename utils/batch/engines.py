"""The two ways `qwen3-batch` decodes a batch, behind one interface:
`rates(sizes)` (tokens per second per batch size, measured now) and
`events(requests, batch_size, eos)` (`utils.fast.Event`s in the order they
happen).

`FastEngine`: the fast engine's continuous batches on the native step,
every row's tokens those it gets alone. `BookEngine`: the book's
padding-aware batched model in fixed groups, a row ending at its own
end-of-sequence token while the group goes on; on any device.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from utils.errors import UsageError


class FastEngine:
    """`utils.fast.BatchDecoder` on the native step (bf16 or int8)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    @classmethod
    def for_run(cls, run: Any, int8: bool) -> FastEngine:
        """The fast model built from the loaded book model (its weights taken
        over); a UsageError where the native step cannot run."""
        from utils.streaming import choose_path

        reasons: list[str] = []
        try:
            path = choose_path(run.device, fast=True, int8=int8, say=reasons.append)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if "native" not in path.needs:
            why = reasons[0] if reasons else f"not on {run.device}"
            raise UsageError(f"--fast batches run on the native step, which is off "
                             f"here ({why}); run without --fast")  # fmt: skip
        model = path.build(run.model, adopt=True)
        if not model.decode_native():
            why = model.native_unsupported_reason() or "see the line above"
            raise UsageError(f"--fast batches run on the native step, which cannot "
                             f"run this model ({why}); run without --fast")  # fmt: skip
        return cls(model)

    def rates(self, sizes: Iterable[int]) -> dict[int, float]:
        from utils.fast import step_rates

        return step_rates(self.model, sizes)

    def events(self, requests: Iterable[Any], size: int, eos: int | None) -> Iterator:
        from utils.fast import BatchDecoder

        return BatchDecoder(self.model, size, eos).run(requests)


class BookEngine:
    """The book's batched model (`utils.models.batched_book_model`) on the
    loaded model's weights, `size` requests at a time."""

    def __init__(self, run: Any) -> None:
        from utils.models import batched_book_model

        self.model = batched_book_model(run.model)
        self.device = run.device

    def rates(self, sizes: Iterable[int]) -> dict[int, float]:
        """Tokens per second of a decode step per batch size (after a
        16-token prefill; the best of two steps)."""
        from reasoning_from_scratch.qwen3 import KVCache

        rates = {}
        with torch.inference_mode():
            for size in sizes:
                cache = KVCache(n_layers=self.model.cfg["n_layers"])
                self.model(torch.zeros((size, 16), dtype=torch.long,
                                       device=self.device), cache=cache)  # fmt: skip
                best = float("inf")
                for _ in range(2):
                    start = time.perf_counter()
                    token = torch.zeros((size, 1), dtype=torch.long, device=self.device)
                    self.model(token, cache=cache)[:, -1].argmax(-1).tolist()
                    best = min(best, time.perf_counter() - start)
                rates[size] = size / best
        return rates

    def events(self, requests: Iterable[Any], size: int, eos: int | None) -> Iterator:
        group: list[Any] = []
        for request in requests:
            group.append(request)
            if len(group) == size:
                yield from self._group(group, eos)
                group = []
        if group:
            yield from self._group(group, eos)

    @torch.inference_mode()
    def _group(self, group: list[Any], eos: int | None) -> Iterator:
        from reasoning_from_scratch.qwen3 import KVCache

        from utils.fast import Event
        from utils.models import left_padded

        ids, mask = left_padded([r.token_ids for r in group], pad_id=eos or 0,
                                device=self.device)  # fmt: skip
        longest = ids.shape[1] + max(r.max_new_tokens for r in group)
        if longest > self.model.cfg["context_length"]:
            raise UsageError(f"a batch of prompts padded to {ids.shape[1]} tokens "
                             "plus their new tokens outgrows the context; use a "
                             "smaller --batch-size or fewer new tokens")  # fmt: skip
        cache = KVCache(n_layers=self.model.cfg["n_layers"])
        out = self.model(ids, cache=cache, attn_mask=mask)[:, -1]
        live, made = set(range(len(group))), [0] * len(group)
        last = [0] * len(group)
        while True:
            for i in sorted(live):
                request = group[i]
                last[i] = request.pick(out[i : i + 1])
                made[i] += last[i] != eos
                ended = _ended(last[i], eos, made[i], request.max_new_tokens)
                if last[i] != eos:
                    yield Event(request.key, last[i])
                if ended:
                    live.discard(i)
                    yield Event(request.key, None, ended)
            if not live:
                return
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            step = torch.tensor(last, device=self.device).view(-1, 1)
            out = self.model(step, cache=cache, attn_mask=mask)[:, -1]


def _ended(token: int, eos: int | None, made: int, most: int) -> str | None:
    if token == eos:
        return "eos"
    return "length" if made == most else None
