"""A tiny Qwen3 configuration shared by the tests (float32, CPU-fast)."""

import functools
from typing import Any

import torch


def tiny_config(**overrides: Any) -> dict[str, Any]:
    """A Qwen3 config small enough for unit tests; GQA and qk-norm stay on
    (4 query heads share 2 key/value groups) so every code path runs."""
    cfg: dict[str, Any] = {
        "vocab_size": 1000,
        "context_length": 256,
        "emb_dim": 64,
        "n_heads": 4,
        "n_layers": 2,
        "hidden_dim": 128,
        "head_dim": 16,
        "qk_norm": True,
        "n_kv_groups": 2,
        "rope_base": 1_000_000.0,
        "dtype": torch.float32,
    }
    unknown = set(overrides) - set(cfg)
    if unknown:
        raise KeyError(f"not Qwen3 config keys: {sorted(unknown)}")
    cfg.update(overrides)
    return cfg


# A prompt of six token ids for the generation tests
PROMPT = torch.tensor([[1, 5, 7, 9, 11, 300]])


def tiny_state_dict(seed: int = 0, cfg: dict[str, Any] | None = None) -> dict:
    """Random weights (std 0.1) for `cfg` (default: tiny, context 512) large
    enough that greedy text varies a lot, so token comparisons mean something."""
    from utils.download.standin import standin_state_dict

    cfg = cfg or tiny_config(context_length=512)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in standin_state_dict(cfg, seed).items():
        noise = torch.randn(t.shape, generator=gen)
        value = 1 + 0.1 * noise if name.endswith("scale") else 0.1 * noise
        out[name] = value.to(cfg["dtype"])
    return out


def book_model(state_dict: dict, cfg: dict[str, Any]) -> torch.nn.Module:
    """The book's Qwen3Model holding `state_dict` without a random init."""
    from reasoning_from_scratch.qwen3 import Qwen3Model, compute_rope_params

    with torch.device("meta"):
        model = Qwen3Model(cfg)
    model.load_state_dict(state_dict, assign=True)
    head_dim = cfg["head_dim"] or cfg["emb_dim"] // cfg["n_heads"]
    model.cos, model.sin = compute_rope_params(
        head_dim, theta_base=cfg["rope_base"], context_length=cfg["context_length"]
    )
    return model.eval()


def fast_model(cfg: dict[str, Any], state_dict: dict) -> torch.nn.Module:
    """A FastQwen3 holding `state_dict` (tied without `out_head.weight`),
    built the one way the code builds it: from the book's model."""
    from utils.fast import FastQwen3
    from utils.models import load_book_model

    return FastQwen3.from_book_model(load_book_model(state_dict, cfg=cfg))


def tokens(stream) -> list[list[int]]:
    """Collect a (batch, 1)-token stream into lists of ids per sequence."""
    out = list(stream)
    if not out:
        return []
    return torch.cat(out, dim=1).tolist()


def skip_if_inductor_cannot_build(compiled: bool) -> None:
    """Skip the rest of a test when a decode step fell back to eager because
    inductor's C++ does not build under ATEN_CPU_CAPABILITY=default (torch
    2.10 emits `at::vec` code there). Anywhere else a fallback fails."""
    import os

    import pytest

    if not compiled and os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "default":
        pytest.skip("inductor's C++ does not build with ATEN_CPU_CAPABILITY=default")


@functools.cache
def benchmark_inputs() -> tuple[dict[str, Any], dict, torch.Tensor]:
    """(config, stand-in weights, prompt) of the benchmark's tiny runs: the
    tiny config with a vocabulary of 500, made once."""
    from utils.download.standin import standin_state_dict

    cfg = tiny_config(vocab_size=500)
    return cfg, standin_state_dict(cfg, 0), torch.tensor([[3, 1, 4, 1, 5]])


def tiny_run(modes: list[str], **overrides) -> list[dict]:
    """run_benchmark on the tiny model: float32, 3 tokens, one repeat, quiet,
    a 4 MiB read-speed probe; keyword arguments override these."""
    from utils.benchmark import runner as benchmark

    cfg, state_dict, prompt = benchmark_inputs()
    kwargs = {
        "device": "cpu",
        "dtype": "float32",
        "max_new_tokens": 3,
        "repeats": 1,
        "cfg": cfg,
        "state_dict": state_dict,
        "token_ids": prompt,
        "quiet": True,
        "bandwidth_bytes": 1 << 22,
        **overrides,
    }
    return benchmark.run_benchmark(modes=modes, **kwargs)
