"""Picking the next token: greedy (the chapter's argmax) or sampled.

Chapter 2 always takes the most likely token. The book's later chapters
sample instead (`reasoning_from_scratch.ch04`): divide the logits by a
temperature, softmax, keep the smallest set of most likely tokens whose
probability reaches top-p, then draw one token. `TokenPicker` does exactly
that with the package's own functions, plus an optional top-k cut of the
logits first; temperature 0 is the greedy `torch.argmax`, bit for bit.

Each picker draws from its own `torch.Generator`, seeded from (seed,
prompt id, sample index) by `row_seed`: a row draws the same tokens from
the same logits whatever else ran beside it (the batched decoder gives a
row the logits it gets alone, so a seed repeats across batch sizes).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass

import torch
from reasoning_from_scratch.ch04 import scale_logits_by_temperature, top_p_filter


@dataclass(frozen=True)
class Sampling:
    """How to pick tokens: temperature 0 is greedy (argmax); else sample
    at `temperature`, from the `top_k` most likely tokens (None: all), then
    the top-p nucleus (None or 1: all); `seed` None draws a fresh one."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        problem = sampling_problem(self.temperature, self.top_k, self.top_p)
        if problem:
            raise ValueError(problem)

    @classmethod
    def of_boxes(cls, temperature: float, top_k: int, top_p: float, seed: int):
        """From a form's boxes, where top-k 0 and top-p 1 mean all tokens."""
        return cls(float(temperature), int(top_k) or None,
                   float(top_p) if top_p < 1 else None, int(seed))  # fmt: skip

    @property
    def greedy(self) -> bool:
        """Whether this picks the argmax (temperature 0)."""
        return self.temperature == 0

    def picker(self, prompt_id: object = 0, sample: int = 0) -> TokenPicker:
        """The picker of one row: sample number `sample` of prompt `prompt_id`."""
        return TokenPicker(self, prompt_id, sample)


def sampling_problem(temperature: float, top_k: int | None, top_p: float | None) -> str:
    """What is wrong with these settings, as a sentence that says what to
    use instead ("" when they are fine)."""
    if not (isinstance(temperature, int | float) and math.isfinite(temperature)):
        return f"temperature must be a number >= 0, got {temperature!r}"
    if temperature < 0:
        return f"temperature must be >= 0 (0: greedy), got {temperature}"
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or top_k < 1):  # fmt: skip
        return f"top-k must be a whole number >= 1, got {top_k!r}"
    if top_p is not None and not (isinstance(top_p, int | float) and 0 < top_p <= 1):
        return f"top-p must be in (0, 1], got {top_p!r}"
    return ""


def row_seed(seed: int, prompt_id: object, sample: int) -> int:
    """A 63-bit seed for one row from the run's seed, the prompt's id and
    the sample's number: the same triple, the same seed, on every machine."""
    text = f"{seed}\x00{prompt_id}\x00{sample}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


class TokenPicker:
    """Picks one row's next token from its logits (1, vocab) or (vocab,):
    greedy, or sampled with the row's own generator (see module)."""

    def __init__(self, sampling: Sampling, prompt_id: object = 0, sample: int = 0):
        self.sampling = sampling
        self.generator: torch.Generator | None = None
        if not sampling.greedy:
            seed = sampling.seed if sampling.seed is not None else secrets.randbits(62)
            self.generator = torch.Generator().manual_seed(
                row_seed(seed, prompt_id, sample)
            )

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token, shape (1, 1), on the logits' device."""
        logits = logits.reshape(1, -1)
        if self.generator is None:
            return torch.argmax(logits, dim=-1, keepdim=True)
        s = self.sampling
        if s.top_k is not None and s.top_k < logits.shape[-1]:
            kth = torch.topk(logits, s.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -torch.inf)
        probas = torch.softmax(scale_logits_by_temperature(logits, s.temperature), -1)
        probas = top_p_filter(probas, s.top_p)
        token = torch.multinomial(probas.cpu(), 1, generator=self.generator)
        return token.to(logits.device)


GREEDY = Sampling()  # the chapter's argmax
