"""A conversation's KV cache, kept from one turn to the next.

`qwen3-chat` (`utils.cli.ChatSession`) sends the whole conversation as token
ids each turn. Keeping the cache, a turn prefills only what the cache does
not hold yet: the longest common prefix of the ids the cache holds and the
new prompt stays, the rest goes through the model. Where the chat template
drops an earlier answer's thinking, that prefix ends inside the last answer,
the cache is cut back there and prefilled from that point on. The answer
tokens themselves stay the same as a fresh prefill's (up to float rounding:
the same sums in other shapes), only sooner.

Two caches: the book's `KVCache` (keys and values cut with
`utils.generation.truncate_kv_cache`) and the fast model's static cache
(`utils.fast.generate(start=...)`), which other generations on the same
model may reuse: its `cache_epoch` tells.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class ChatCache:
    """The KV cache of one conversation and the token ids whose keys and
    values it holds (`ids`, positions 0, 1, ...); `prefilled` is what the
    last turn sent through the model at once."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.prefilled = 0
        self._model: Any = None
        self._book_cache: Any = None  # the book's KVCache
        self._epoch: int | None = None  # the fast model's, when ids were valid

    def clear(self) -> None:
        """Forget the conversation and free the cache's memory."""
        if self._fast_cache_is_ours(self._model):
            self._model.release_cache()
        self.ids, self.prefilled = [], 0
        self._model = self._book_cache = self._epoch = None

    def reserve(self, num_tokens: int) -> None:
        """Make the fast model's cache hold `num_tokens` positions (at most
        the context length), keeping what it holds: grown between turns,
        the copy does not delay the next turn's first token. (The book's
        cache grows a step at a time.)"""
        if self._fast_cache_is_ours(self._model) and self.ids:
            keep = len(self.ids)
            total = min(num_tokens, self._model.cfg["context_length"])
            self._model.setup_cache(1, max(total, keep), keep=keep)

    def _fast_cache_is_ours(self, model: Any) -> bool:
        """Whether the fast model's cache still holds what `ids` say (no
        other generation set it up since this one's last turn)."""
        epoch = getattr(model, "cache_epoch", None)
        return epoch is not None and epoch == self._epoch and model is self._model

    def stream(
        self,
        model: Any,
        token_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_id: int | None,
        fast: bool,
        picker: Any = None,
    ) -> Iterator[torch.Tensor]:
        """Tokens (1, 1) for the prompt `token_ids` (1, n) from the book's
        model (`fast` False: its KV cache) or a fast model, prefilling only
        the ids after the prefix the cache already holds: greedy, or
        `picker`'s choice."""
        if token_ids.shape[0] != 1:
            raise ValueError("a kept cache holds one conversation (batch of 1)")
        if model is not self._model or (fast and not self._fast_cache_is_ours(model)):
            self.ids, self._book_cache, self._model = [], None, model
        ids = token_ids[0].tolist()
        start = min(common_prefix(self.ids, ids), len(ids) - 1)
        if fast:
            from utils.fast import generate

            gen = generate(model, token_ids, max_new_tokens, eos_token_id,
                           start=start, picker=picker)  # fmt: skip
        else:
            from reasoning_from_scratch.qwen3 import KVCache

            from utils.generation import generate_text_stream_from_cache

            if self._book_cache is None:
                self._book_cache = KVCache(n_layers=model.cfg["n_layers"])
            gen = generate_text_stream_from_cache(
                model, self._book_cache, start, token_ids, max_new_tokens,
                eos_token_id, picker,
            )  # fmt: skip
        self.ids, self.prefilled = ids[:start], len(ids) - start
        return self._track(gen, ids, max_new_tokens, fast)

    def _track(
        self,
        gen: Iterator[torch.Tensor],
        ids: list[int],
        max_new_tokens: int,
        fast: bool,
    ) -> Iterator[torch.Tensor]:
        """Yield `gen`'s tokens, keeping `ids` to what surely went through
        the model: the prompt once a token came (the prefill is done), each
        token once the next one came; the last one only where the answer
        ended at the end-of-text id, which it produced. A stream cut short
        (Ctrl-C) claims no more; the next turn prefills the rest again."""
        count, last = 0, 0
        try:
            for token in gen:
                if count:
                    self.ids.append(last)
                else:
                    self.ids = list(ids)
                count, last = count + 1, int(token[0, 0])
                yield token
            if count == 0 and max_new_tokens > 0:
                self.ids = list(ids)  # the end-of-text id came at once
            elif 0 < count < max_new_tokens:
                self.ids.append(last)
        finally:
            gen.close()  # type: ignore[attr-defined]
            if fast:
                self._epoch = self._model.cache_epoch
