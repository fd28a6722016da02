"""Opt-in end-to-end check with the real Qwen3 0.6B base weights.

Skipped unless QWEN3_REAL_DOWNLOAD=1. It downloads about 1.5 GB (or reuses
verified files in QWEN3_REAL_DIR, default ~/.cache/qwen3-ch02-real) and checks that
greedy generation, with and without the KV cache, gives the answer the book
prints for its example prompt. Run it with:

    QWEN3_REAL_DOWNLOAD=1 uv run pytest tests/test_real_download.py -q
"""

import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    os.environ.get("QWEN3_REAL_DOWNLOAD") != "1",
    reason="downloads the real 1.5 GB model; set QWEN3_REAL_DOWNLOAD=1 to run",
)

PROMPT = "Explain large language models in a single sentence."
BOOK_ANSWER_START = (
    "Large language models are artificial intelligence systems that can "
    "understand, generate, and process human language"
)


@pytest.fixture(scope="module")
def real_model(monkeypatch_module):
    from reasoning_from_scratch.qwen3 import (
        QWEN_CONFIG_06_B,
        Qwen3Model,
        Qwen3Tokenizer,
    )

    from utils.device import get_device
    from utils.download.fetch import download_qwen3_small
    from utils.download.provenance import is_standin

    # conftest switches the stand-ins on for every test; this one needs the
    # real files
    monkeypatch_module.delenv("QWEN3_STANDIN", raising=False)
    default = Path.home() / ".cache" / "qwen3-ch02-real"
    out_dir = Path(os.environ.get("QWEN3_REAL_DIR", default))
    files = download_qwen3_small(kind="base", out_dir=out_dir)
    assert not files.standin
    assert not is_standin(files.model) and not is_standin(files.tokenizer)

    device = get_device()
    tokenizer = Qwen3Tokenizer(tokenizer_file_path=files.tokenizer)
    model = Qwen3Model(QWEN_CONFIG_06_B)
    model.load_state_dict(torch.load(files.model, weights_only=True))
    return model.to(device), tokenizer, device


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.mark.parametrize("use_cache", [False, True], ids=["no_cache", "kv_cache"])
def test_book_answer(real_model, use_cache):
    from utils.generation import (
        generate_text_basic_stream,
        generate_text_basic_stream_cache,
    )

    model, tokenizer, device = real_model
    generate = (
        generate_text_basic_stream_cache if use_cache else generate_text_basic_stream
    )
    ids = torch.tensor(tokenizer.encode(PROMPT), device=device).unsqueeze(0)
    new_ids = [
        t.item() for t in generate(model, ids, 40, eos_token_id=tokenizer.eos_token_id)
    ]
    text = tokenizer.decode(new_ids)
    assert text.strip().startswith(BOOK_ANSWER_START), text
