"""The whole decode step as one C call (beyond Chapter 2; CPU, batch 1).

The eager fast path makes about a hundred small torch calls per token
(norms, RoPE, cache writes, attention, activations) around the
matrix-vector kernels; on a 2-core CPU those calls cost as much as reading
the weights. torch.compile removes most of them but takes seconds to
minutes to compile. `qwen3_decode_step` in `cpu_matvec.c` runs the same
step, embedding to logits, in one call with no compile at all.

Why our own C instead of a library: llama.cpp-style runtimes need their
own weight files; this step reads the book's model in place (the same
bf16 or int8 tensors and KV cache), so prefill, eager and compiled steps
can be mixed freely.

Numerics: bf16 is rounded at the same points as the book's model, but the
float32 sums inside the small operations (norms, softmax, attention) run in
their own order, so tokens are close to the eager path's, not guaranteed
equal (measured with `scripts/agreement.py`).
"""

from __future__ import annotations

import array
from typing import Any

import torch

from utils import cpu_matvec

__all__ = ["NativeStep", "unsupported_reason"]

# Pointer slots, in the order of the enums in cpu_matvec.c
_GLOBAL_SLOTS = 7  # emb, emb scales, final norm, head, head scales, cos, sin
_LAYER_SLOTS = 20  # 4 norms, 7 (weight, scales) pairs, k cache, v cache
_GROUPS = (("W_query", "W_key", "W_value"), ("out_proj",), ("fc1", "fc2"), ("fc3",))


def _weight(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, scales or None) of a KernelLinear or Int8Linear."""
    if hasattr(layer, "weight_int8"):
        return layer.weight_int8, layer.scales
    return layer.weight, None


def _norm_ok(norm: Any, eps: float) -> bool:
    return (
        norm is not None
        and getattr(norm, "shift", None) is None
        and getattr(norm, "qwen3_compatible", True)
        and float(norm.eps) == eps
    )


def unsupported_reason(model: Any) -> str | None:
    """Why the native step cannot run this FastQwen3 here (None: it can)."""
    if cpu_matvec.get_kernels() is None:
        return "the CPU kernels are not available here"
    if model._device().type != "cpu":
        return "it runs on the CPU only"
    if model._dtype() != torch.bfloat16:
        return f"it needs a bf16 model (this one is {model._dtype()})"
    cfg = model.cfg
    if cfg["emb_dim"] % 16 or cfg["hidden_dim"] % 16 or model.head_dim % 16:
        return "the model's sizes must be multiples of 16"
    eps = float(model.final_norm.eps)
    layers = [model.out_head]
    for block in model.trf_blocks:
        att, ff = block.att, block.ff
        norms = [block.norm1, block.norm2]
        if att.q_norm is not None:
            norms += [att.q_norm, att.k_norm]
        if not all(_norm_ok(n, eps) for n in norms):
            return "its RMSNorm layers differ from Qwen3's"
        for group in _GROUPS:
            mods = [getattr(att if hasattr(att, n) else ff, n) for n in group]
            kinds = {_weight(m)[1] is None for m in mods}
            if len(kinds) > 1:
                return "layers sharing an input mix int8 and bf16 weights"
            layers += mods
    for layer in layers:
        w, s = _weight(layer)
        if getattr(layer, "bias", None) is not None:
            return "its linear layers have biases"
        if w.dtype not in (torch.bfloat16, torch.int8) or not w.is_contiguous():
            return "its weights must be contiguous bf16 or int8"
        if s is not None and (s.dtype != torch.float32 or not s.is_contiguous()):
            return "its int8 scales must be contiguous float32"
    return None


def _f32(t: torch.Tensor, keep: list[torch.Tensor]) -> int:
    t = t.detach().to(torch.float32).contiguous()
    keep.append(t)
    return t.data_ptr()


class NativeStep:
    """A decode step for `FastQwen3` (same call as its compiled steps):
    `step(model, cur_token, input_pos) -> (next token (1, 1), logits)`.

    Batches other than 1 (and a model set to `use_cpu_matvec(False)`)
    take the eager step. `exact=True` sums the bf16 products in torch's
    AVX2 order (the eager kernel); False uses the faster-ordered one.
    It reads the weights the model had when it was made (and keeps them
    alive); `FastQwen3.load_state_dict` and `quantize_int8` renew or drop it."""

    failed = False  # the interface of fast_decode's compiled steps
    block_fn = None

    def __init__(self, model: Any, exact: bool = True) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"native decode step unavailable: {reason}")
        self.exact = exact
        # every tensor the table points at (weights, float32 norm copies)
        self._keep: list[torch.Tensor] = []
        cfg = model.cfg
        self._vocab = cfg["vocab_size"]
        dims = [
            cfg["n_layers"], cfg["emb_dim"], cfg["n_heads"], cfg["n_kv_groups"],
            model.head_dim, cfg["hidden_dim"], cfg["vocab_size"], 0,
        ]  # fmt: skip
        self._dims = array.array("l", dims)
        self._eps = float(model.final_norm.eps)
        self._table = array.array("Q", self._static_table(model))
        self._atts = [block.att for block in model.trf_blocks]
        # the cos/sin and cache tensors the table points at, held so their
        # memory cannot be freed and reused while the table names it
        self._cache_refs: tuple[torch.Tensor, ...] = ()
        self._keep_cache: tuple[torch.Tensor, ...] = ()
        self._next = array.array("l", [0])  # the argmax, written by C

    def _static_table(self, model: Any) -> list[int]:
        emb = model.tok_emb
        if hasattr(emb, "weight_int8"):
            emb_t = [emb.weight_int8, emb.scales]
        else:
            emb_t = [emb.weight]
        if not all(t.is_contiguous() for t in emb_t):
            raise ValueError("native decode step: the embedding must be contiguous")
        emb_ptrs = [emb_t[0].data_ptr(), emb_t[1].data_ptr() if len(emb_t) > 1 else 0]
        self._keep += emb_t  # C reads them: never freed while this step lives
        head_w, head_s = _weight(model.out_head)
        self._keep += [head_w] if head_s is None else [head_w, head_s]
        table = [
            *emb_ptrs,
            _f32(model.final_norm.scale, self._keep),
            head_w.data_ptr(),  # (kept below with the layers' weights)
            0 if head_s is None else head_s.data_ptr(),
            0,  # cos, sin: filled per cache
            0,
        ]
        for block in model.trf_blocks:
            att, ff = block.att, block.ff
            table += [
                _f32(block.norm1.scale, self._keep),
                _f32(block.norm2.scale, self._keep),
                0 if att.q_norm is None else _f32(att.q_norm.scale, self._keep),
                0 if att.k_norm is None else _f32(att.k_norm.scale, self._keep),
            ]
            for layer in (att.W_query, att.W_key, att.W_value, att.out_proj,
                          ff.fc1, ff.fc2, ff.fc3):  # fmt: skip
                w, s = _weight(layer)
                self._keep += [w] if s is None else [w, s]
                table += [w.data_ptr(), 0 if s is None else s.data_ptr()]
            table += [0, 0]  # k, v cache: filled per cache
        return table

    def _point_at_cache(self, model: Any) -> None:
        """Point the table at the model's current cache and cos/sin rows
        (checked by identity each step: a few microseconds)."""
        current = (model.cos, model.sin)
        current += tuple(t for a in self._atts for t in (a.k_cache, a.v_cache))
        held = self._cache_refs
        if len(held) == len(current) and all(
            a is b for a, b in zip(current, held, strict=True)
        ):
            return
        cos, sin = model.cos.contiguous(), model.sin.contiguous()
        caches = current[2:]
        if not all(t.is_contiguous() for t in caches):
            raise ValueError("the KV cache must be contiguous")
        self._table[5], self._table[6] = cos.data_ptr(), sin.data_ptr()
        for i in range(len(self._atts)):
            base = _GLOBAL_SLOTS + i * _LAYER_SLOTS
            self._table[base + 18] = caches[2 * i].data_ptr()
            self._table[base + 19] = caches[2 * i + 1].data_ptr()
        self._dims[7] = caches[0].shape[2]
        # the identity check needs the model's own objects; the pointers
        # may name contiguous copies: hold both
        self._cache_refs = current
        self._keep_cache = (cos, sin)

    def __call__(
        self, model: Any, cur_token: torch.Tensor, input_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from utils.fast_decode import _decode_one_token_impl

        cache = model.trf_blocks[0].att.k_cache
        usable = (
            cur_token.shape == (1, 1)
            and cur_token.device.type == "cpu"
            and model._kernel_wanted
            and cache is not None
            and cache.shape[0] == 1
            and cache.dtype == torch.bfloat16
        )
        if not usable:
            return _decode_one_token_impl(model, cur_token, input_pos)
        self._point_at_cache(model)
        pos, token = int(input_pos.reshape(-1)[0]), int(cur_token[0, 0])
        logits = torch.empty(1, self._vocab, dtype=torch.bfloat16)
        kernels = cpu_matvec.get_kernels()
        rc = kernels.lib.qwen3_decode_step(
            self._dims.buffer_info()[0], self._eps, self._table.buffer_info()[0],
            token, pos, int(self.exact), logits.data_ptr(),
            self._next.buffer_info()[0], torch.get_num_threads(),
        )  # fmt: skip
        if rc == 1:
            raise ValueError(
                f"native decode step: token {token} must be in [0, "
                f"{self._vocab}) and position {pos} inside the KV cache "
                f"({self._dims[7]} slots; call setup_cache for more)"
            )
        if rc:
            raise MemoryError("native decode step: out of memory")
        # torch.argmax's choice (first maximum, NaN first), made in C
        return torch.tensor([[self._next[0]]]), logits
