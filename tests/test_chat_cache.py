"""qwen3-chat keeps its KV cache between turns: each answer is the answer a
fresh prefill of the same token ids gives (the cache changes speed, never
tokens), a turn prefills only its own tokens, the cache rolls back where the
template drops an earlier answer's thinking, and /clear frees it.

The tiny float32 model with the real vocabulary: the book's KV cache and the
fast model's static cache (eager: the exact path's code; float32 keeps the
comparison free of bf16 rounding in other shapes)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from tests._view_fixtures import load_tokenizer, standin_files, tiny_model
from utils.chat_cache import ChatCache, common_prefix
from utils.cli import commands as cli
from utils.fast import FastQwen3
from utils.fast import generate as fast_generate
from utils.generation import generate_text_basic_stream_cache
from utils.qwen3_tokenizer import IM_END_ID
from utils.streaming import GreedyStreamer

MESSAGES = ["Hello there", "What is a cache?", "Say more.", "Why?", "Thanks!"]
THINK_END = 151668  # </think>


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path, _ = standin_files(tmp_path_factory, "reasoning", tokenizer_only=True)
    return load_tokenizer(path)


def thinking_model():
    """The tiny model, rigged to write `</think>` now and then: its logit
    follows one feature of the final hidden state, so it comes at positions
    the whole context decides (a cache that held wrong keys would move it)."""
    model = tiny_model(seed=3)
    with torch.no_grad():
        model.out_head.weight[THINK_END] = 0
        model.out_head.weight[THINK_END, 5] = 2.0
    return model


def fresh_answer(model, prompt: list[int], budget: int, fast: bool) -> list[int]:
    """The answer a fresh prefill of `prompt` gives (a new cache)."""
    ids = torch.tensor([prompt])
    if fast:
        gen = fast_generate(FastQwen3.from_book_model(model), ids, budget, IM_END_ID)
    else:
        gen = generate_text_basic_stream_cache(model, ids, budget, IM_END_ID)
    return [int(t) for t in gen]


def converse(session, messages=MESSAGES):
    """Each turn's (prompt ids, info, what the cache prefilled)."""
    turns = []
    for text in messages:
        prompt = session.ids + session.turn_ids(text)
        info = session.reply(text, lambda s: None)
        turns.append((prompt, info, session.kept.prefilled))
    return turns


@pytest.mark.parametrize("fast", [False, True], ids=["book", "fast"])
@pytest.mark.parametrize("thinking", [False, True], ids=["no_think", "think"])
def test_each_answer_equals_a_fresh_prefill(tok, fast, thinking):
    model = thinking_model() if thinking else tiny_model()
    session = cli.ChatSession(
        tok, GreedyStreamer(model), torch.device("cpu"), 256, 12, fast=fast
    )
    session.thinking = thinking
    turns = converse(session)
    for i, (prompt, info, prefilled) in enumerate(turns):
        answer = info["answer_ids"]
        budget = min(12, 256 - len(prompt))
        assert answer == fresh_answer(model, prompt, budget, fast), f"turn {i + 1}"
        assert info["first_token_s"] > 0
        if i == 0:
            assert prefilled == len(prompt)
            continue
        last_prompt, last_info, _ = turns[i - 1]
        previous = last_info["answer_ids"]
        if THINK_END in previous:
            # rolled back to the end of the last answer's opening
            assert prefilled == len(prompt) - len(last_prompt)
        else:  # the last answer's last id, the end of its turn, the new turn
            own = len(session.turn_ids(MESSAGES[i])) + 2
            assert prefilled == own + (previous[-1:] != [IM_END_ID])
    answers = [info["answer_ids"] for _, info, _ in turns]
    assert len({t for a in answers for t in a}) > 10  # not one repeated token
    if thinking:  # the roll-back ran, and answers went on after thinking
        assert sum(THINK_END in a[:-1] for a in answers) >= 3
    assert len(session.ids) == session.history_tokens() > len(turns[-1][0])


def test_an_answer_keeps_its_generated_ids(tok):
    """The conversation's ids hold each answer as generated, not its text
    encoded again; with thinking, only what follows `</think>`."""
    session = cli.ChatSession(
        tok, GreedyStreamer(thinking_model()), torch.device("cpu"), 256, 12
    )
    session.thinking = True
    for text in MESSAGES[:3]:
        before = session.ids + session.turn_ids(text)
        answer = session.reply(text, lambda s: None)["answer_ids"]
        kept = answer
        if THINK_END in answer:
            kept = answer[len(answer) - answer[::-1].index(THINK_END) :]
            while kept and tok.decode(kept[:1]).strip("\n") == "":
                kept = kept[1:]
        assert session.ids == before + kept + [IM_END_ID, 198]
        assert session.messages[-1] == ("assistant", tok.decode(kept))


def test_clear_frees_the_cache(tok):
    model = tiny_model()
    for fast in (False, True):
        streamer = GreedyStreamer(model)
        session = cli.ChatSession(tok, streamer, torch.device("cpu"), 256, 4, fast=fast)
        converse(session, MESSAGES[:2])
        if fast:
            fast_model = next(iter(streamer._built.values()))
            held = weakref.ref(fast_model.trf_blocks[0].att.k_cache)
        else:
            held = weakref.ref(session.kept._book_cache.get(0)[0])
        session.clear()
        gc.collect()
        assert held() is None and session.kept.ids == [] and session.ids == []
        ((prompt, info, prefilled),) = converse(session, MESSAGES[:1])
        assert prefilled == len(prompt)  # a new conversation, from the start
        assert info["answer_ids"] == fresh_answer(model, prompt, 4, fast)


def test_a_generation_that_reuses_the_fast_cache_is_noticed(tok):
    """Another generation on the same fast model set its cache up afresh:
    the next turn prefills everything instead of trusting stale keys."""
    model = tiny_model()
    streamer = GreedyStreamer(model)
    session = cli.ChatSession(tok, streamer, torch.device("cpu"), 256, 6, fast=True)
    converse(session, MESSAGES[:1])
    list(streamer.stream(torch.tensor([[7, 8, 9] * 30]), 5, fast=True))
    ((prompt, info, prefilled),) = converse(session, MESSAGES[1:2])
    assert prefilled == len(prompt)
    assert info["answer_ids"] == fresh_answer(model, prompt, 6, True)


@pytest.mark.parametrize("fast", [False, True], ids=["book", "fast"])
def test_a_turn_cut_short_claims_only_what_went_through(tok, fast):
    """Ctrl-C inside a forward pass (one layer's cache written, the next
    not) and a stream closed early: the cache claims only finished tokens,
    and the next turn equals a fresh prefill."""
    model = tiny_model()
    kept, streamer = ChatCache(), GreedyStreamer(model)
    prompt = tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    stream = streamer.stream(torch.tensor([prompt]), 8, fast=fast, kept=kept)
    answer = [next(stream) for _ in range(3)]
    stream.close()  # Ctrl-C between tokens
    assert kept.ids == prompt + answer[:2]
    layer = model.trf_blocks[1]
    if fast:
        layer = next(iter(streamer._built.values())).trf_blocks[1]

    def interrupt(module, args):
        raise KeyboardInterrupt

    longer = prompt + answer + tok.encode("<|im_end|>\n<|im_start|>user\nAnd?")
    hook = layer.register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        list(streamer.stream(torch.tensor([longer]), 8, fast=fast, kept=kept))
    hook.remove()
    assert kept.ids == prompt + answer[:2]  # the prefill never finished
    again = streamer.stream(torch.tensor([longer]), 8, fast=fast, kept=kept)
    got = [int(t) for t in again]
    assert kept.prefilled == len(longer) - len(prompt) - 2
    assert got == fresh_answer(model, longer, 8, fast)


def test_no_cache_runs_every_step_on_the_whole_sequence(tok):
    """--no-cache: nothing to keep; the kept cache is emptied, the answers
    are the plain generator's."""
    model = tiny_model()
    session = cli.ChatSession(
        tok, GreedyStreamer(model), torch.device("cpu"), 256, 4, cache=False
    )
    turns = converse(session, MESSAGES[:2])
    assert session.kept.ids == [] and session.kept.prefilled == 0
    for prompt, info, _ in turns:
        assert info["answer_ids"] == fresh_answer(model, prompt, 4, False)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2, 3]) == 2


def test_the_bonus_script_times_the_first_token_of_each_stream():
    """ch02/03_fast-decoding/chat_ttft.py's clock: tokens pass through, one
    (wall, CPU) time per stream, the inner stream closed when cut short."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "ch02" / "03_fast-decoding" / "chat_ttft.py"
    spec = importlib.util.spec_from_file_location("chat_ttft", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model = tiny_model()
    clock = script.FirstTokenClock(GreedyStreamer(model))
    assert clock.model is model  # the loop reads the streamer's model
    prompt = torch.tensor([[1, 2, 3]])
    want = list(GreedyStreamer(model).stream(prompt, 4))
    assert list(clock.stream(prompt, 4)) == want and len(want) == 4
    cut = clock.stream(prompt, 4)
    next(cut)
    cut.close()
    assert len(clock.times) == 2 and all(w > 0 and c >= 0 for w, c in clock.times)


def test_the_fast_cache_grows_between_turns_not_before_an_answer(tok):
    """After each turn the fast cache has room for a next turn of 256
    tokens and its answer, so the next answer runs in that same cache (no
    copy before its first token); the answers stay a fresh prefill's."""
    model = tiny_model()
    model.cfg = {**model.cfg, "context_length": 1024}
    streamer = GreedyStreamer(model)
    session = cli.ChatSession(tok, streamer, torch.device("cpu"), 1024, 8, fast=True)

    def cache():
        return next(iter(streamer._built.values())).trf_blocks[0].att.k_cache

    before, during = None, []
    for i, text in enumerate(MESSAGES[:3]):
        prompt = session.ids + session.turn_ids(text)
        during.clear()
        info = session.reply(text, lambda piece: during.append(cache()))
        if i:
            assert during and all(c is before for c in during)
        before = cache()
        assert before.shape[2] >= len(session.ids) + 256 + 8
        assert info["answer_ids"] == fresh_answer(model, prompt, 8, True)
