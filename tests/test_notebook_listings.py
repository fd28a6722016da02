"""The generators typed in the chapter notebooks match the `utils` copies.

Notebooks 04 and 05 define the book's listings in cells so the reader sees
them; later notebooks import the same functions from `utils.generation`.
These tests pull the definitions out of the .ipynb files and check that both
yield the same tokens and stop at the end-of-sequence token the same way, so
notebook and module cannot drift apart.
"""

import ast
from pathlib import Path

import nbformat
import pytest
import torch
from reasoning_from_scratch import ch02 as book
from reasoning_from_scratch.qwen3 import KVCache, Qwen3Model
from tiny import tiny_config

from utils import generation

NB_DIR = Path(__file__).resolve().parent.parent / "ch02" / "01_main-chapter-code"

TINY_CFG = tiny_config(context_length=64, rope_base=10_000.0)


def load_function(notebook: str, name: str):
    """Exec only the `def name(...)` found in the notebook's code cells."""
    nb = nbformat.read(NB_DIR / notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code" or f"def {name}(" not in cell.source:
            continue
        tree = ast.parse(cell.source)
        defs = [
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == name
        ]
        if defs:
            namespace = {"torch": torch, "KVCache": KVCache}
            module = ast.Module(body=defs, type_ignores=[])
            exec(compile(module, f"{notebook}:{name}", "exec"), namespace)
            return namespace[name]
    raise AssertionError(f"{notebook} has no cell defining {name}()")


@pytest.fixture(scope="module")
def listings():
    return {
        "plain": load_function("04_generate.ipynb", "generate_text_basic_stream"),
        "cache": load_function("05_kv-cache.ipynb", "generate_text_basic_stream_cache"),
    }


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(123)
    return Qwen3Model(TINY_CFG)


@pytest.fixture(scope="module")
def prompt():
    gen = torch.Generator().manual_seed(7)
    return torch.randint(0, TINY_CFG["vocab_size"], (1, 6), generator=gen)


def tokens(fn, model, ids, n, eos=None) -> list[list[int]]:
    return [t.tolist() for t in fn(model, ids, n, eos_token_id=eos)]


@pytest.mark.parametrize("n", [0, 1, 12])
def test_notebook_listings_match_utils_and_book(listings, model, prompt, n):
    plain = tokens(listings["plain"], model, prompt, n)
    cache = tokens(listings["cache"], model, prompt, n)
    assert len(plain) == n
    assert plain == tokens(generation.generate_text_basic_stream, model, prompt, n)
    assert cache == tokens(
        generation.generate_text_basic_stream_cache, model, prompt, n
    )
    assert plain == tokens(book.generate_text_basic_stream, model, prompt, n)
    # A cache changes the work done, not the result
    assert cache == plain


def test_listings_run_without_autograd(listings, model, prompt):
    for fn in listings.values():
        token = next(fn(model, prompt, 1))
        assert token.shape == (1, 1)
        assert torch.is_inference(token), "missing @torch.inference_mode()"


@pytest.mark.parametrize("kind", ["plain", "cache"])
def test_eos_stop_matches_utils(listings, model, prompt, kind):
    utils_fn = {
        "plain": generation.generate_text_basic_stream,
        "cache": generation.generate_text_basic_stream_cache,
    }[kind]
    full = [t[0][0] for t in tokens(listings[kind], model, prompt, 12)]
    for eos in (full[0], full[4], -1):
        got = tokens(listings[kind], model, prompt, 12, eos=eos)
        assert got == tokens(utils_fn, model, prompt, 12, eos=eos)
        # Stops right before the first EOS; the EOS itself is never yielded
        expected = full[: full.index(eos)] if eos in full else full
        assert [t[0][0] for t in got] == expected


def test_batched_eos_waits_for_every_row(listings, model):
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, TINY_CFG["vocab_size"], (2, 5), generator=gen)
    steps = tokens(listings["plain"], model, ids, 6)  # [[[row0], [row1]], ...]
    (row0,), (row1,) = steps[0]
    assert row0 != row1, "pick another seed: both rows start alike"
    for kind in ("plain", "cache"):
        utils_fn = getattr(generation, listings[kind].__name__)
        got = tokens(listings[kind], model, ids, 6, eos=row0)
        assert got == tokens(utils_fn, model, ids, 6, eos=row0)
        # Only row 0 produced the EOS, so generation goes on for both rows
        assert got[0] == [[row0], [row1]]
