"""Weight-only int8 layers for the fast decoder (APPROXIMATE).

Each linear layer's weight becomes int8 with one float32 scale per output
row (symmetric, absmax / 127); activations stay in the model's dtype. On
CPUs a decode row goes through the int8 kernel (`utils.fast.kernels`): half
the bytes of bf16, the input rounded to 16-bit fixed point. The token
embedding becomes int8 too (tied, as in Qwen3 0.6B: the head's table).
How close it stays to bf16: `ch02/03_fast-decoding/agreement.py`.
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from utils.fast.hugepages import huge_page_empty, page_out
from utils.fast.kernels import linear


def quantize_weight(
    weight: Tensor, rows_per_chunk: int = 256, out: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(int8 weight, float32 scales (rows,)) with weight ~= q * scales[:, None],
    in place on one small float32 chunk of rows at a time (large temporaries
    would stay in the process's heap). `out`, an int8 tensor of the weight's
    shape, receives q if given."""
    w = weight.detach()
    n_rows, n_cols = w.shape
    if out is None:
        out = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scales = torch.empty(n_rows, dtype=torch.float32, device=w.device)
    buf = torch.empty(
        (min(rows_per_chunk, n_rows), n_cols), dtype=torch.float32, device=w.device
    )
    for start in range(0, n_rows, rows_per_chunk):
        stop = min(start + rows_per_chunk, n_rows)
        rows = buf[: stop - start]
        rows.copy_(w[start:stop])
        low, high = torch.aminmax(rows, dim=1)
        s = torch.maximum(high, low.neg()).clamp_(min=1e-12).div_(127.0)
        rows.div_(s[:, None]).round_().clamp_(-127, 127)
        out[start:stop].copy_(rows)
        scales[start:stop] = s
    return out, scales


class Int8Linear(nn.Module):
    """Bias-free linear layer with int8 weights and per-row float32 scales."""

    use_kernel = False  # set by FastQwen3: single rows use the CPU kernel

    def __init__(self, weight_int8: Tensor, scales: Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8)  # (out, in)
        self.register_buffer("scales", scales)  # (out,) float32

    def forward(self, x: Tensor) -> Tensor:
        if self.use_kernel:
            out = linear(x, [self.weight_int8], [self.scales])
            if out is not None:
                return out[0]
        x2 = x.reshape(-1, self.in_features)
        scales = self.scales.to(x.dtype)
        if x.device.type == "cpu":
            # torch's fused int8-weight matmul (dequantises on the fly)
            out = torch._weight_int8pack_mm(x2, self.weight_int8, scales)
        else:
            out = F.linear(x2, self.weight_int8.to(x.dtype)) * scales
        return out.view(*x.shape[:-1], self.out_features)


class Int8Embedding(nn.Module):
    """Token embedding read from an int8 table with one float32 scale per
    row (tied weights: the output layer's int8 table)."""

    is_embedding = True  # one row read per token (see utils.benchmark.bandwidth)

    def __init__(self, weight_int8: Tensor, scales: Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight_int8.shape
        self.dtype = dtype  # what forward returns (the model's dtype)
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scales", scales)

    def forward(self, idx: Tensor) -> Tensor:
        rows = F.embedding(idx, self.weight_int8).to(torch.float32)
        return (rows * self.scales[idx].unsqueeze(-1)).to(self.dtype)


def int8_block(shapes: list[tuple[int, int]]) -> list[Tensor]:
    """Empty int8 CPU tensors of `shapes`, back to back (64-byte aligned) in
    one `huge_page_empty` block: the step streams them from 2 MB pages,
    which tensors allocated one by one rarely cover."""
    offsets, total = [], 0
    for rows, cols in shapes:
        offsets.append(total)
        total += (rows * cols + 63) // 64 * 64
    block = huge_page_empty(total).view(torch.int8)
    return [
        block[start : start + rows * cols].view(rows, cols)
        for start, (rows, cols) in zip(offsets, shapes, strict=True)
    ]


def quantize_int8(model: nn.Module, include_head: bool = True) -> nn.Module:
    """Replace the bias-free `nn.Linear` layers of `model` (in place) with
    `Int8Linear`, one at a time (`include_head=False` keeps `out_head`), and
    `tok_emb` with an `Int8Embedding` (tied: on the head's int8 table). On
    the CPU the int8 weights share one `int8_block`. Each bf16 weight is
    let go as its int8 copy exists, unless something else holds it (the
    book model); then `model.on_layers_replaced()`, if any, is called."""
    emb, head = getattr(model, "tok_emb", None), getattr(model, "out_head", None)
    emb = emb if isinstance(emb, nn.Embedding) else None
    tied = emb is not None and head is not None and head.weight is emb.weight
    # in the model's order (an untied embedding first, the head last)
    targets = (
        [("tok_emb", emb)] if emb is not None and not tied and include_head else []
    )
    targets += [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and module.bias is None
        and (include_head or name != "out_head")
    ]  # fmt: skip
    slots = _slots(targets)
    # The two largest matrices first (an untied embedding, then the head):
    # their bf16 pages and int8 copies are then the peak's only large parts
    targets.sort(key=lambda target: target[0] not in ("tok_emb", "out_head"))
    with torch.no_grad():
        for name, module in targets:
            q, scales = quantize_weight(module.weight, out=slots.get(name))
            if module is emb:  # untied
                model.tok_emb = Int8Embedding(q, scales, emb.weight.dtype)
            else:
                parent_name, _, attr = name.rpartition(".")
                parent = model.get_submodule(parent_name) if parent_name else model
                setattr(parent, attr, Int8Linear(q, scales))
            if tied and name == "out_head":
                model.tok_emb = Int8Embedding(q, scales, emb.weight.dtype)
                emb.weight = None
            _release(module)
            del module
    notify = getattr(model, "on_layers_replaced", None)
    if callable(notify):
        notify()
    return model


def _slots(targets: list[tuple[str, nn.Module]]) -> dict[str, Tensor]:
    """{layer name: its int8 tensor in one `int8_block`}, or {} unless
    every weight is on the CPU."""
    if not targets or any(m.weight.device.type != "cpu" for _, m in targets):
        return {}
    blocks = int8_block([tuple(m.weight.shape) for _, m in targets])
    return dict(zip([name for name, _ in targets], blocks, strict=True))


def _release(module: nn.Module) -> None:
    """Drop `module.weight`; page it out if nobody else holds it."""
    weight = module.weight
    module.weight = None
    if weight is not None and sys.getrefcount(weight) <= 2:  # only `weight`
        page_out(weight)
