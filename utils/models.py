"""The book's Qwen3 model with loaded weights: the one place that builds it.

Every command, script and check that needs the book's `Qwen3Model` holding
weights comes here, so loading works (and fails) the same way everywhere:

* `read_checkpoint` opens a `.pth` file with `weights_only=True` and turns
  any failure into one line naming the file (`CheckpointError`);
* `shape_problems` is the one check of keys and shapes against
  `Qwen3Model(cfg)`, built on the meta device (nothing is allocated);
* `load_book_model` builds the model on the meta device and assigns the
  loaded tensors (no random init, no second copy), ties the output head to
  the embedding where the checkpoint has none of its own, and recomputes
  the RoPE tables, which checkpoints do not hold.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class CheckpointError(ValueError):
    """A weights file that cannot be used; `str()` is one line naming it."""


def book_config(
    cfg: Mapping[str, Any] | None = None, dtype: torch.dtype | None = None
) -> dict[str, Any]:
    """A copy of `cfg` (default: the book's `QWEN_CONFIG_06_B`), with
    `dtype` replacing its dtype when given."""
    from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B

    out = dict(QWEN_CONFIG_06_B if cfg is None else cfg)
    if dtype is not None:
        out["dtype"] = dtype
    return out


def expected_shapes(cfg: Mapping[str, Any] | None = None) -> dict[str, tuple]:
    """Key -> shape of the book's `Qwen3Model(cfg)` (default: 0.6B)."""
    from reasoning_from_scratch.qwen3 import Qwen3Model

    with torch.device("meta"):
        model = Qwen3Model(book_config(cfg))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def shape_problems(
    state_dict: Mapping[str, Any],
    cfg: Mapping[str, Any] | None = None,
    tied_head_ok: bool = False,
) -> list[str]:
    """Every key of `state_dict` that is missing, unexpected or of the wrong
    shape for `Qwen3Model(cfg)`; empty when it fits. `tied_head_ok`
    accepts a checkpoint without `out_head.weight` (the head is then the
    embedding, as in Qwen3's tied checkpoints)."""
    expected = expected_shapes(cfg)
    got = {k: tuple(getattr(v, "shape", ())) for k, v in state_dict.items()}
    if tied_head_ok and "out_head.weight" not in got:
        expected.pop("out_head.weight", None)
    problems = [f"missing {k}" for k in expected if k not in got]
    problems += [f"unexpected {k}" for k in got if k not in expected]
    problems += [
        f"{k} has shape {got[k]}, expected {shape}"
        for k, shape in expected.items()
        if k in got and got[k] != shape
    ]
    return problems


def summarize_problems(problems: list[str], shown: int = 3) -> str:
    """The first `shown` problems joined by "; ", and how many more."""
    more = f" (+{len(problems) - shown} more)" if len(problems) > shown else ""
    return "; ".join(problems[:shown]) + more


def load_error_text(exc: BaseException) -> str:
    """What went wrong when torch.load failed, in a few words: no ANSI
    codes and none of torch's advice on loading untrusted files."""
    from utils.errors import first_line

    text = _ANSI.sub("", str(exc)).strip()
    if "Weights only load failed" in text:
        return (
            "it holds Python objects, not only tensors, and "
            "torch.load(weights_only=True) refuses to run them"
        )
    if "central directory" in text or "zip archive" in text:
        return "it is not a complete PyTorch zip checkpoint (truncated?)"
    first = (text.splitlines() or [""])[0].split(" This file can still be loaded")
    return first_line(exc, 160 + len(type(exc).__name__) + 2, text=first[0])


def read_checkpoint(
    path: str | os.PathLike, mmap: bool = True
) -> Mapping[str, torch.Tensor]:
    """The state dict in a `.pth` file, loaded with `weights_only=True`
    (memory-mapped by default: nothing is read until used). Raises
    `CheckpointError` with one line naming the file."""
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path} is not a PyTorch zip checkpoint ({path.stat().st_size} "
            "bytes; truncated or damaged)"
        )
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # noqa: BLE001 - any failure: not usable
        raise CheckpointError(f"{path}: {load_error_text(exc)}") from None
    if not isinstance(sd, Mapping):
        raise CheckpointError(f"{path} holds a {type(sd).__name__}, not weights")
    return sd


def load_book_model(
    state_dict: Mapping[str, torch.Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    cfg: Mapping[str, Any] | None = None,
) -> torch.nn.Module:
    """The book's `Qwen3Model(cfg)` (default 0.6B, in `dtype` or the
    config's) holding `state_dict`'s tensors on `device`, in eval mode.

    Tensors already of that dtype and device are used as they are (no
    copy). A state dict without `out_head.weight` gets the embedding as
    its head. Raises `CheckpointError` when keys or shapes do not fit."""
    from reasoning_from_scratch.qwen3 import Qwen3Model, compute_rope_params

    cfg = book_config(cfg, dtype)
    problems = shape_problems(state_dict, cfg, tied_head_ok=True)
    if problems:
        raise CheckpointError(
            f"not the weights of this model: {summarize_problems(problems)}"
        )
    device = torch.device(device)
    sd = {k: v.to(device=device, dtype=cfg["dtype"]) for k, v in state_dict.items()}
    tied = "out_head.weight" not in sd
    if tied:
        sd["out_head.weight"] = sd["tok_emb.weight"]
    with torch.device("meta"):
        model = Qwen3Model(cfg)
    model.load_state_dict(sd, assign=True)
    if tied or sd["out_head.weight"].data_ptr() == sd["tok_emb.weight"].data_ptr():
        model.out_head.weight = model.tok_emb.weight  # one shared Parameter
    head_dim = cfg["head_dim"] or cfg["emb_dim"] // cfg["n_heads"]
    cos, sin = compute_rope_params(
        head_dim, theta_base=cfg["rope_base"], context_length=cfg["context_length"]
    )
    model.cos, model.sin = cos.to(device), sin.to(device)
    return model.eval()


def batched_book_model(
    book_model: torch.nn.Module, float32_upcast: bool = True
) -> torch.nn.Module:
    """The book's padding-aware batched model
    (`reasoning_from_scratch.qwen3_batched.Qwen3Model`) holding a loaded
    book model's weights (shared, not copied), in eval mode: the book's way
    to run several prompts at once, left-padded with an attention mask."""
    from reasoning_from_scratch.qwen3_batched import Qwen3Model as BatchedQwen3

    with torch.device("meta"):
        model = BatchedQwen3(book_model.cfg, float32_upcast=float32_upcast)
    model.load_state_dict(book_model.state_dict(keep_vars=True), assign=True)
    if book_model.out_head.weight is book_model.tok_emb.weight:
        model.out_head.weight = model.tok_emb.weight
    model.cos, model.sin = book_model.cos, book_model.sin
    return model.eval()


def left_padded(
    prompts: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths as one (batch, longest) tensor padded
    on the left with `pad_id`, and the attention mask (True: a real token),
    as the book's batched generators take them."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest - len(prompt) :] = True
    return ids.to(device), mask.to(device)


def load_book_model_file(
    path: str | os.PathLike,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    cfg: Mapping[str, Any] | None = None,
) -> torch.nn.Module:
    """`load_book_model` on the weights in `path`; every failure is a
    `CheckpointError` whose one line names the file."""
    sd = read_checkpoint(path)
    try:
        return load_book_model(sd, device, dtype, cfg)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def prefill_attention_bytes(cfg: Mapping[str, Any], num_tokens: int) -> int:
    """Memory the attention of one layer needs to run a prompt of
    `num_tokens` at once: the book's model (and the fast path's prefill)
    hold the full score matrix, heads x tokens x tokens, about three times
    at its peak (scores, masked scores, softmax), plus the boolean mask."""
    itemsize = torch.empty((), dtype=cfg["dtype"]).element_size()
    scores = cfg["n_heads"] * num_tokens * num_tokens * itemsize
    return 3 * scores + 2 * num_tokens * num_tokens


def free_memory_bytes(device: torch.device) -> int | None:
    """Memory that can still be allocated on `device` (CPU: available RAM;
    CUDA: free device memory); None where it cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        import psutil

        return int(psutil.virtual_memory().available)
    return None


def check_prefill_fits(
    cfg: Mapping[str, Any], num_tokens: int, device: torch.device
) -> None:
    """Raise ValueError, before any work, when a prompt of `num_tokens` would
    need more memory for its attention than `device` has free; the message
    gives the limit and what to do."""
    free = free_memory_bytes(device)
    need = prefill_attention_bytes(cfg, num_tokens)
    if free is None or need <= 0.8 * free:
        return
    per_token2 = prefill_attention_bytes(cfg, 1000) / 1000**2
    most = int((0.8 * free / per_token2) ** 0.5)
    raise ValueError(
        f"the prompt is {num_tokens:,} tokens; running it needs about "
        f"{need / 1e9:.1f} GB for the attention scores, and {device.type} has "
        f"{free / 1e9:.1f} GB free: use a prompt of at most about {most:,} "
        "tokens here (shorten it, or /clear a long conversation)."
    )
