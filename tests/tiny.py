"""A tiny Qwen3 configuration shared by the tests (float32, CPU-fast)."""

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
