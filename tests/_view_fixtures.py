"""Shared files for the token-view, widget and CLI tests.

Stand-ins are written once per test session into one temporary folder (and
its own stand-in cache, unless QWEN3_STANDIN_CACHE is already set), so the
tokenizer and the 0.6B stand-in weights are built at most once.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import torch
from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B, Qwen3Model, Qwen3Tokenizer

from tests.tiny import tiny_config
from utils.download.standin import CACHE_ENV

# the tiny config with the real vocabulary, so the real tokenizer fits
TINY_CFG = tiny_config(vocab_size=QWEN_CONFIG_06_B["vocab_size"])


def standin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's stand-in folder (the same path for every caller)."""
    root = tmp_path_factory.getbasetemp() / "qwen3-view-standins"
    root.mkdir(exist_ok=True)
    return root


def standin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for subprocesses and in-process downloads."""
    root = standin_root(tmp_path_factory)
    env = dict(os.environ)
    env["QWEN3_STANDIN"] = "1"
    env.setdefault(CACHE_ENV, str(root / "cache"))
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def standin_files(
    tmp_path_factory: pytest.TempPathFactory, kind: str, tokenizer_only: bool
) -> tuple[Path, Path | None]:
    """Write (or reuse) the stand-in files of `kind` in the session folder."""
    from utils.download.fetch import download_qwen3_small

    env = standin_env(tmp_path_factory)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QWEN3_STANDIN", "1")
        mp.setenv(CACHE_ENV, env[CACHE_ENV])
        files = download_qwen3_small(
            kind, tokenizer_only=tokenizer_only, out_dir=standin_root(tmp_path_factory)
        )
    return files.tokenizer, files.model


def tiny_model(seed: int = 0) -> Qwen3Model:
    """A small random Qwen3 with the real vocabulary (float32, CPU)."""
    torch.manual_seed(seed)
    model = Qwen3Model(TINY_CFG)
    # Spread the logits so greedy choices are clear-cut
    with torch.no_grad():
        model.final_norm.scale.fill_(8.0)
    return model.eval()


def unknown_id_model() -> Qwen3Model:
    """A tiny model whose every greedy pick is 151771 or 151772: ids its
    output head has but the tokenizer (151,669 ids) does not."""
    model = tiny_model(seed=1)
    with torch.no_grad():
        model.final_norm.scale.zero_()
        model.final_norm.scale[0] = 1.0  # only feature 0 reaches the head
        model.out_head.weight.zero_()
        model.out_head.weight[151771, 0] = 50.0
        model.out_head.weight[151772, 0] = -50.0
    return model


def load_tokenizer(path: Path, **kwargs) -> Qwen3Tokenizer:
    """The book's tokenizer for `path`, one object per file version and
    settings: parsing its 6 MB of JSON is the slow part, and no test changes
    a tokenizer it is given."""
    st = Path(path).stat()
    settings = tuple(sorted(kwargs.items()))
    return _load_tokenizer(str(path), st.st_size, st.st_mtime_ns, settings)


@functools.lru_cache(maxsize=16)
def _load_tokenizer(
    path: str, size: int, mtime_ns: int, settings: tuple
) -> Qwen3Tokenizer:
    """Size and time only key the cache: a rewritten file loads afresh."""
    return Qwen3Tokenizer(path, **dict(settings))


# A Python program that runs a command (`chat` or `generate`) on the tiny
# model; argv: the tokenizer path, the command, its arguments.
CLI_DRIVER = r"""
import sys
import torch
sys.path.insert(0, sys.argv[1])
from tests._view_fixtures import load_tokenizer, tiny_model
from utils.cli import commands as cli
from utils.streaming import GreedyStreamer

model = tiny_model()

def fake_load(args, kind, **kw):
    tok = load_tokenizer(sys.argv[1], **kw)
    return cli.Loaded(tok, model, torch.device("cpu"), GreedyStreamer(model), True)

cli.load = fake_load
main = {"chat": cli.chat_main, "generate": cli.generate_main}[sys.argv[2]]
sys.exit(main(sys.argv[3:]))
"""
