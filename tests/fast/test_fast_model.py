"""utils.fast.model: the static-cache model holds the book's weights (same
keys, shared tensors, tied head) and sizes its cache to the request."""

from __future__ import annotations

from reasoning_from_scratch.ch02 import generate_text_basic_stream_cache as book_gen

from tests.tiny import (
    PROMPT,
    book_model,
    fast_model,
    tiny_config,
    tiny_state_dict,
    tokens,
)
from utils.fast import FastQwen3, cache_length_for, generate

TINY = tiny_config(context_length=512)


def test_state_dict_keys_and_weight_sharing(fast_tiny):
    book, fast = fast_tiny
    assert fast.state_dict().keys() == book.state_dict().keys()
    assert fast.tok_emb.weight.data_ptr() == book.tok_emb.weight.data_ptr()
    att_f, att_b = fast.trf_blocks[1].att, book.trf_blocks[1].att
    assert att_f.W_key.weight.data_ptr() == att_b.W_key.weight.data_ptr()


def test_load_state_dict_into_fresh_model_and_tied_head():
    sd = tiny_state_dict(3, TINY)
    book = book_model(sd, TINY)
    fast = FastQwen3(TINY)
    fast.load_state_dict(sd)
    assert tokens(generate(fast, PROMPT, 25)) == tokens(book_gen(book, PROMPT, 25))

    tied = {k: v for k, v in sd.items() if k != "out_head.weight"}
    fast_tied = fast_model(TINY, tied)
    assert fast_tied.out_head.weight is fast_tied.tok_emb.weight


def test_cache_is_sized_to_the_request_not_the_context(fast_tiny):
    _, fast = fast_tiny
    list(generate(fast, PROMPT, 10))
    b, groups, length, head_dim = fast.trf_blocks[0].att.k_cache.shape
    assert (b, groups, head_dim) == (1, TINY["n_kv_groups"], TINY["head_dim"])
    assert length == cache_length_for(PROMPT.shape[1] + 10, TINY["context_length"])
    assert PROMPT.shape[1] + 10 <= length < TINY["context_length"]
    assert cache_length_for(500, 512) == 512
    assert cache_length_for(512, 512) == 512
