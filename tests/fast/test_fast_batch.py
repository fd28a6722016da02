"""utils.fast.batch: many sequences on the native step, each row's logits
the bits it gets decoded alone (`generate`), whatever the batch size, the
slot, the neighbours' lengths, when they joined and the thread count."""

from __future__ import annotations

import pytest
import torch

import utils.fast.batch as batch_module
import utils.fast.build as build
from tests.tiny import fast_model, tiny_config, tiny_state_dict
from utils.fast import BatchDecoder, Request, generate, quantize_int8
from utils.fast.threads import pin_step_threads
from utils.sampling import Sampling

pytestmark = pytest.mark.skipif(
    build.unsupported_reason() is not None,
    reason="the native step needs the C kernels (x86-64 with AVX2, or AArch64)",
)

# Wide enough that the products and the attention are shared between two
# threads (team.c: one thread below 65,536 multiply-adds)
WIDE = tiny_config(
    context_length=512, dtype=torch.bfloat16, emb_dim=128, hidden_dim=512, head_dim=32
)
LENGTHS = (5, 40, 17, 33, 8, 61, 3)  # prompt lengths
NEW = (12, 30, 7, 15, 25, 9, 18)  # new tokens: 40 + 30 outgrows a 64-slot cache


@pytest.fixture(scope="module")
def models():
    """The wide model on the native step: bf16 and int8, the table's
    kernels and the first ones (AVX2 or NEON: what every CPU runs)."""
    sd = tiny_state_dict(0, WIDE)
    out = {}
    for int8 in (False, True):
        for kernels in (None, "default"):
            model = fast_model(WIDE, sd)
            model.use_fused_prefill()  # as the native paths build it
            if int8:
                quantize_int8(model)
            assert model.use_native_step(kernels=kernels)
            out[int8, kernels] = model
    return out


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in LENGTHS]


def recorder(store: list[torch.Tensor], picker=None):
    """A picker that keeps each step's logits, then picks as `picker`
    (None: argmax)."""

    def pick(logits):
        store.append(logits.reshape(-1).clone())
        if picker is not None:
            return picker(logits)
        return torch.argmax(logits.reshape(1, -1), dim=-1, keepdim=True)

    return pick


def alone(model, ids, new, eos=None, picker=None):
    """Tokens and per-step logits of one prompt decoded by `generate`."""
    store = []
    gen = generate(model, torch.tensor([ids]), new, eos, picker=recorder(store, picker))
    return [int(t) for t in gen], store


def batched(model, batch_size, requests, eos=None):
    """Tokens and end per request key from one BatchDecoder run."""
    got, ends = {r.key: [] for r in requests}, {}
    for event in BatchDecoder(model, batch_size, eos).run(requests):
        if event.token is None:
            ends[event.key] = event.reason
        else:
            got[event.key].append(event.token)
    return got, ends


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    if len(a) != len(b):
        return False
    pairs = zip(a, b, strict=True)
    return all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in pairs)


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("kernels", [None, "default"], ids=["table", "first"])
def test_every_rows_logits_are_its_bits_alone(models, int8, kernels, unpinned):
    model = models[int8, kernels]
    ps = prompts()
    # an end-of-sequence token the first prompt meets early: rows end at
    # different steps and waiting prompts take their slots
    eos = alone(model, ps[0], NEW[0])[0][3]
    ref = [alone(model, p, n, eos) for p, n in zip(ps, NEW, strict=True)]
    assert any(len(t) < n for (t, _), n in zip(ref, NEW, strict=True))  # some end early
    for threads in (1, 2):
        pin_step_threads(threads)
        for size in (1, 3, 7):
            stores = [[] for _ in ps]
            reqs = [Request(i, p, n, recorder(stores[i]))
                    for i, (p, n) in enumerate(zip(ps, NEW, strict=True))]  # fmt: skip
            got, ends = batched(model, size, reqs, eos)
            differing = [
                i for i, (toks, logits) in enumerate(ref)
                if got[i] != toks or not same_bits(logits, stores[i])
            ]  # fmt: skip
            assert differing == [], (threads, size)
            assert all(ends[i] == ("eos" if len(ref[i][0]) < NEW[i] else "length")
                       for i in range(len(ps)))  # fmt: skip


def test_greedy_rows_take_the_steps_argmax(models):
    model = models[True, None]
    ps = prompts()
    ref = [alone(model, p, n)[0] for p, n in zip(ps, NEW, strict=True)]
    reqs = [Request(i, p, n) for i, (p, n) in enumerate(zip(ps, NEW, strict=True))]
    got, _ = batched(model, 4, reqs)
    assert [got[i] for i in range(len(ps))] == ref


def test_a_seed_gives_a_row_the_same_samples_in_any_batch(models):
    model = models[False, None]
    sampling = Sampling(temperature=1.5, top_k=50, top_p=0.95, seed=7)
    ps = prompts()
    ref = [alone(model, p, n, picker=sampling.picker(i, 0))[0]
           for i, (p, n) in enumerate(zip(ps, NEW, strict=True))]  # fmt: skip
    for size in (2, 7):
        reqs = [Request(i, p, n, sampling.picker(i, 0))
                for i, (p, n) in enumerate(zip(ps, NEW, strict=True))]  # fmt: skip
        got, _ = batched(model, size, reqs)
        assert [got[i] for i in range(len(ps))] == ref
    # and it samples: another sample of the same prompt goes elsewhere
    other = alone(model, ps[1], NEW[1], picker=sampling.picker(1, 1))[0]
    assert other != ref[1]


def test_samples_of_one_prompt_share_its_prefill_and_stay_apart(models, monkeypatch):
    model = models[True, None]
    calls = []
    real = batch_module.prefill
    monkeypatch.setattr(batch_module, "prefill", lambda *a: calls.append(1) or real(*a))
    sampling = Sampling(temperature=1.0, seed=3)
    ids = prompts()[1]
    reqs = [Request(s, ids, 20, sampling.picker("p", s)) for s in range(4)]
    got, _ = batched(model, 4, reqs)
    assert len(calls) == 1
    assert [got[s] for s in range(4)] == [
        alone(model, ids, 20, picker=sampling.picker("p", s))[0] for s in range(4)
    ]
    assert len({tuple(t) for t in got.values()}) > 1


def test_a_slots_cache_holds_what_its_row_needs(models, monkeypatch):
    seen = []
    real = batch_module._grow

    def grow(row, context):
        real(row, context)
        seen.append((row.pos, row.cache[0].shape[2]))

    monkeypatch.setattr(batch_module, "_grow", grow)
    model = models[False, None]
    ps = prompts()
    batched(model, 2, [Request(0, ps[1], 30), Request(1, ps[0], 5)])
    assert seen and all(pos < slots for pos, slots in seen)
    # 40 prompt tokens + 30 new: more than the first 64 slots, never the
    # context length (512)
    assert max(slots for _, slots in seen) == 128


def test_zero_new_tokens_ends_at_once_and_bad_requests_are_refused(models):
    model = models[False, None]
    assert batched(model, 2, [Request("a", [1, 2], 0)]) == ({"a": []}, {"a": "length"})
    with pytest.raises(ValueError, match="request 'b'.*512"):
        batched(model, 2, [Request("b", [1] * 500, 20)])
    with pytest.raises(ValueError, match="native step"):
        BatchDecoder(fast_model(WIDE, tiny_state_dict(0, WIDE)), 2)


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_a_native_prefill_gives_each_prompt_token_the_decode_steps_bits(
    models, int8, unpinned
):
    """Prompt rows through the rows step (three calls of PREFILL_ROWS
    rows, then a chat's next turn from position 150): the logits and cache
    the decode step gives the tokens one by one."""
    from utils.fast import decode_one_token, prefill_at

    model = models[int8, None]
    ids = torch.tensor([prompts()[5] * 3])[:, :170]  # 170 tokens
    for threads in (1, 2):
        pin_step_threads(threads)
        model.setup_cache(1, 200)
        with torch.inference_mode():
            for p in range(ids.shape[1]):
                token, want = decode_one_token(model, ids[:, p : p + 1],
                                               torch.tensor([p]))  # fmt: skip
        keys = model.trf_blocks[1].att.k_cache[:, :, :170].clone()
        model.use_native_prefill()
        try:
            model.release_cache()
            model.setup_cache(1, 200)
            prefill_at(model, ids[:, :150], 0)
            got_token, got = prefill_at(model, ids[:, 150:], 150)
        finally:
            model.use_native_prefill(False)
        assert got.shape == (1, WIDE["vocab_size"]) and torch.equal(got_token, token)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        same = model.trf_blocks[1].att.k_cache[:, :, :170]
        assert torch.equal(same.view(torch.int16), keys.view(torch.int16))


def test_only_int8_paths_prefill_natively():
    from utils.fast import get_path
    from utils.models import load_book_model

    sd = tiny_state_dict(0, WIDE)
    for name, native in (("fast_native_int8", True), ("fast_native", False),
                         ("fast_fastest_int8", True)):  # fmt: skip
        fast = get_path(name).build(load_book_model(sd, cfg=WIDE))
        assert fast.native_prefill is native, name
