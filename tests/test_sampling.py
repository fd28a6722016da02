"""utils.sampling: greedy is the chapter's argmax, bit for bit; sampling
follows the book's later chapter (its own temperature and top-p functions)
and a seed repeats a row's draws."""

from __future__ import annotations

import pytest
import torch
from reasoning_from_scratch.ch04 import scale_logits_by_temperature, top_p_filter

import utils.sampling as sampling_module
from utils.sampling import GREEDY, Sampling, row_seed, sampling_problem


def logits(seed: int = 0, vocab: int = 50) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(1, vocab, generator=gen)).to(torch.bfloat16)


def test_temperature_zero_is_argmax_first_maximum():
    x = torch.tensor([[1.0, 5.0, 5.0, -2.0]], dtype=torch.bfloat16)
    assert GREEDY.greedy and GREEDY.picker().generator is None
    assert GREEDY.picker()(x).tolist() == [[1]]
    y = logits(3)
    assert torch.equal(GREEDY.picker()(y), torch.argmax(y, dim=-1, keepdim=True))


def test_the_draw_is_from_the_books_distribution(monkeypatch):
    seen = []
    real = torch.multinomial

    def spy(probas, n, generator=None):
        seen.append(probas)
        return real(probas, n, generator=generator)

    monkeypatch.setattr(sampling_module.torch, "multinomial", spy)
    x = logits(1)
    Sampling(temperature=0.7, top_p=0.8, seed=1).picker()(x)
    want = top_p_filter(torch.softmax(scale_logits_by_temperature(x, 0.7), -1), 0.8)
    assert torch.equal(seen[0], want)
    assert 1 < int((want > 0).sum()) < x.shape[1]  # the filter cut something


def test_top_k_keeps_the_k_most_likely_tokens():
    x = logits(2)
    best = set(torch.topk(x.float(), 3).indices[0].tolist())
    pick = Sampling(temperature=5.0, top_k=3, seed=0).picker()
    drawn = {int(pick(x)) for _ in range(200)}
    assert drawn == best  # all three drawn at this temperature, nothing else


def test_a_seed_repeats_a_rows_draws_and_rows_differ():
    x = logits(4)
    s = Sampling(temperature=1.0, seed=11)

    def draws(prompt_id, sample):
        pick = s.picker(prompt_id, sample)
        return [int(pick(x)) for _ in range(40)]

    assert draws("q1", 0) == draws("q1", 0)
    assert draws("q1", 0) != draws("q1", 1) != draws("q2", 0)
    assert row_seed(11, "q1", 0) == row_seed(11, "q1", 0) != row_seed(12, "q1", 0)
    assert 0 <= row_seed(11, "q1", 0) < 2**63


@pytest.mark.parametrize(
    "args, words",
    [((-1, None, None), ">= 0"), ((float("nan"), None, None), "number"),
     ((1, 0, None), "top-k"), ((1, 2.5, None), "top-k"), ((1, None, 0), "top-p"),
     ((1, None, 1.5), "top-p")],
)  # fmt: skip
def test_bad_settings_say_what_to_use(args, words):
    assert words in sampling_problem(*args)
    with pytest.raises(ValueError, match=words):
        Sampling(*args)
    assert sampling_problem(0.7, 40, 0.9) == ""
