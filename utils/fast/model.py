"""The fast decoder's model: the book's Qwen3 with a static KV cache.

Same weights, state-dict keys and numerics as the book's `Qwen3Model`,
arranged as gpt-fast arranges them: the KV cache is allocated for prompt +
new tokens and written in place, the position is a tensor and the causal
mask a comparison with a precomputed `arange`, so every decode step has
the same shapes and can be compiled or replayed. Eager code runs the
book's operations in its order and dtypes (linear layers: `F.linear`'s
bits, `utils.fast.kernels.linear`). Running steps: `utils.fast.steps`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from reasoning_from_scratch.qwen3 import RMSNorm, compute_rope_params
from torch import Tensor

from utils.fast.dispatch import rows_kernel
from utils.fast.kernels import get_kernels, linear, use_rows_kernel
from utils.fast.quantize import Int8Linear

# Cache lengths are rounded up to this multiple, so nearby prompt lengths
# reuse one compiled decode step instead of recompiling for every length.
CACHE_ROUND = 64


def cache_length_for(num_tokens: int, context_length: int) -> int:
    """The KV-cache length used for `num_tokens` positions: rounded up to a
    multiple of CACHE_ROUND, never beyond the model's context length."""
    rounded = -(-num_tokens // CACHE_ROUND) * CACHE_ROUND
    return max(num_tokens, min(rounded, context_length))


class KernelLinear(nn.Linear):
    """`nn.Linear` whose single-row (decode) products may use the CPU
    kernel (bias-free layers only); the model sets `use_kernel`."""

    use_kernel = False

    def forward(self, x: Tensor) -> Tensor:
        if self.use_kernel and self.bias is None:
            out = linear(x, [self.weight])
            if out is not None:
                return out[0]
        return F.linear(x, self.weight, self.bias)


def project(x: Tensor, layers: list[nn.Module]) -> list[Tensor]:
    """`[layer(x) for layer in layers]` for bias-free layers sharing x
    (q/k/v, gate/up): one kernel call for a decode row where they all use
    the CPU kernel (all bf16 or all int8), with the same results."""
    if all(getattr(m, "use_kernel", False) for m in layers):
        if all(type(m) is KernelLinear and m.bias is None for m in layers):
            out = linear(x, [m.weight for m in layers])
        elif all(type(m) is Int8Linear for m in layers):
            weights = [m.weight_int8 for m in layers]
            out = linear(x, weights, [m.scales for m in layers])
        else:
            out = None
        if out is not None:
            return out
    return [m(x) for m in layers]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Split-halves RoPE. x: (b, heads, t, head_dim); cos/sin: (t, head_dim)
    float32, already gathered at the token positions."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    # float32 products as in the book, then back to the model dtype
    return (x * cos + rotated * sin).to(x.dtype)


class FeedForward(nn.Module):
    """SwiGLU feed-forward with the book's names fc1 (gate), fc2 (up), fc3."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        emb, hid, dt = cfg["emb_dim"], cfg["hidden_dim"], cfg["dtype"]
        self.fc1 = KernelLinear(emb, hid, bias=False, dtype=dt)
        self.fc2 = KernelLinear(emb, hid, bias=False, dtype=dt)
        self.fc3 = KernelLinear(hid, emb, bias=False, dtype=dt)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = project(x, [self.fc1, self.fc2])
        return self.fc3(F.silu(gate) * up)


class GroupedQueryAttention(nn.Module):
    """GQA that reads and writes a static KV cache held as buffers."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        self.num_heads = cfg["n_heads"]
        self.num_kv_groups = cfg["n_kv_groups"]
        if self.num_heads % self.num_kv_groups:
            raise ValueError("n_heads must be divisible by n_kv_groups")
        self.head_dim = cfg["head_dim"] or cfg["emb_dim"] // cfg["n_heads"]
        emb, dt = cfg["emb_dim"], cfg["dtype"]
        d_out = self.num_heads * self.head_dim
        d_kv = self.num_kv_groups * self.head_dim
        self.W_query = KernelLinear(emb, d_out, bias=False, dtype=dt)
        self.W_key = KernelLinear(emb, d_kv, bias=False, dtype=dt)
        self.W_value = KernelLinear(emb, d_kv, bias=False, dtype=dt)
        self.out_proj = KernelLinear(d_out, emb, bias=False, dtype=dt)
        if cfg["qk_norm"]:
            self.q_norm = RMSNorm(self.head_dim)
            self.k_norm = RMSNorm(self.head_dim)
        else:
            self.q_norm = self.k_norm = None
        self.fused = False  # several rows: one fused attention call (see below)
        # (b, kv_groups, cache_len, head_dim); allocated by setup_cache
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)

    def forward(self, x, cos, sin, mask, input_pos, kv_len=None) -> Tensor:
        b, t, _ = x.shape
        q, k, v = project(x, [self.W_query, self.W_key, self.W_value])
        q = q.reshape(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, self.num_kv_groups, self.head_dim).transpose(1, 2)
        v = v.reshape(b, t, self.num_kv_groups, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # new keys/values into their slots, in place (fixed shapes)
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        # kv_len (eager only) limits attention to the filled slots; the
        # compiled step reads the whole static cache, masked
        keys, values = self.k_cache[:, :, :kv_len], self.v_cache[:, :, :kv_len]
        if torch.compiler.is_compiling():
            # No copies of keys/values: the r query heads sharing a kv group
            # stacked on the token axis, (b, kv_groups, r*t, d), in one fused
            # attention call (float32 inside, skipping the book's bf16
            # rounding of the scores; faster than leaving them to inductor)
            r = self.num_heads // self.num_kv_groups
            q = q.reshape(b, self.num_kv_groups, r * t, self.head_dim)
            ctx = F.scaled_dot_product_attention(q, keys, values, attn_mask=~mask)
        elif self.fused and t > 1:  # a prompt: no copies, no score matrices
            ctx = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=~mask[:t], enable_gqa=True
            )
        else:
            ctx = self._book_attention(q, keys, values, mask[:t])
        ctx = ctx.view(b, self.num_heads, t, self.head_dim).transpose(1, 2)
        return self.out_proj(ctx.reshape(b, t, self.num_heads * self.head_dim))

    def _book_attention(self, q, keys, values, mask):
        """The book's attention operations, shapes, order and dtypes, so
        bf16 rounds alike and greedy tokens match the book's (stacking the
        heads instead gives other matmul shapes, which oneDNN may add in
        another order)."""
        r = self.num_heads // self.num_kv_groups
        keys = keys.repeat_interleave(r, dim=1)  # (b, heads, kv_len, d)
        values = values.repeat_interleave(r, dim=1)
        scores = q @ keys.transpose(2, 3)  # (b, heads, t, kv_len)
        scores = scores.masked_fill(mask, -torch.inf)
        weights = torch.softmax(scores / self.head_dim**0.5, dim=-1)
        return weights @ values  # (b, heads, t, d)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        self.att = GroupedQueryAttention(cfg)
        self.ff = FeedForward(cfg)
        self.norm1 = RMSNorm(cfg["emb_dim"])
        self.norm2 = RMSNorm(cfg["emb_dim"])

    def forward(self, x, cos, sin, mask, input_pos, kv_len=None):
        x = x + self.att(self.norm1(x), cos, sin, mask, input_pos, kv_len)
        return x + self.ff(self.norm2(x))


BlockFn = Callable[..., Tensor]


def block_forward(block, x, cos, sin, mask, input_pos, kv_len=None):
    """One transformer layer; one function for every layer, so a compiled
    block (`compile_decode(scope="block")`) is compiled only once."""
    return block(x, cos, sin, mask, input_pos, kv_len)


class StaticQwen3(nn.Module):
    """Qwen3 with a static KV cache; holds the book's `Qwen3Model` state dict
    (same keys) and computes the same function."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        self.cfg = dict(cfg)
        emb, vocab, dt = cfg["emb_dim"], cfg["vocab_size"], cfg["dtype"]
        self.tok_emb = nn.Embedding(vocab, emb, dtype=dt)
        self.trf_blocks = nn.ModuleList(
            [TransformerBlock(cfg) for _ in range(cfg["n_layers"])]
        )
        self.final_norm = RMSNorm(emb)
        self.out_head = KernelLinear(emb, vocab, bias=False, dtype=dt)
        self.head_dim = cfg["head_dim"] or emb // cfg["n_heads"]
        self.register_buffer("cos", None, persistent=False)
        self.register_buffer("sin", None, persistent=False)
        self.register_buffer("positions", None, persistent=False)
        # what `use_cpu_matvec` last asked for
        self.cpu_matvec_wanted = True
        self.fused_prefill = False  # see use_fused_prefill
        self.cache_epoch = 0  # counts caches set up afresh (see setup_cache)

    @classmethod
    def from_book_model(cls, model: nn.Module) -> StaticQwen3:
        """Wrap a book `Qwen3Model` (e.g. `utils.models.load_book_model`'s):
        parameters are shared, not copied, so both models see the same
        weights (and tying is kept)."""
        if not hasattr(model, "cfg") or not hasattr(model, "trf_blocks"):
            raise TypeError(
                "from_book_model expects the book's Qwen3Model (with .cfg); "
                f"got {type(model).__name__}"
            )
        with torch.device("meta"):  # no random init
            fast = cls(model.cfg)
        fast.load_state_dict(model.state_dict(keep_vars=True), strict=True, assign=True)
        if model.out_head.weight is model.tok_emb.weight:
            fast.out_head.weight = fast.tok_emb.weight
        return fast.eval()

    @property
    def device(self) -> torch.device:
        return self.final_norm.scale.device

    @property
    def activation_dtype(self) -> torch.dtype:
        """The activations' dtype (the embedding's, bf16 or int8-backed)."""
        emb = self.tok_emb
        return emb.dtype if hasattr(emb, "weight_int8") else emb.weight.dtype

    def use_fused_prefill(self, enabled: bool = True) -> None:
        """Prefill (several rows) with one fused attention call per layer
        (`scaled_dot_product_attention`, its own order of sums) and the
        output layer on the last row only: close to the book's prefill, not
        bit-equal, for the paths that are not exact anyway (native, int8).
        Off: the book's operations on every row (the exact paths)."""
        self.fused_prefill = enabled
        for block in self.trf_blocks:
            block.att.fused = enabled

    def use_cpu_matvec(self, enabled: bool | None = None) -> bool:
        """Whether decode steps on CPU use the matrix-vector kernels (by
        default they do; None: as last asked, applied again, the kernels
        being built on first use). Returns whether they are active now."""
        if enabled is not None:
            self.cpu_matvec_wanted = enabled
        on_cpu = self.device.type == "cpu"
        kernels = get_kernels() if self.cpu_matvec_wanted and on_cpu else None
        active = kernels is not None
        if active:  # several rows of x (a prompt) through the multi-row kernel
            rows = rows_kernel(kernels)
            use_rows_kernel(None if rows is None else rows.index)
        for module in self.modules():
            if hasattr(module, "use_kernel") and module.use_kernel != active:
                module.use_kernel = active  # KernelLinear, Int8Linear
        return active

    def setup_cache(
        self,
        batch_size: int,
        num_tokens: int,
        device: torch.device | str | None = None,
        keep: int = 0,
    ) -> int:
        """Make sure a KV cache for `num_tokens` positions exists (rounded up,
        see `cache_length_for`), reusing the current one when it has that
        shape. Returns the cache length. `keep` > 0 continues the cache (a
        chat's next turn): the first `keep` positions' keys/values stay, a
        long enough cache stays as it is, a short one at least doubles (few
        copies over a conversation). Otherwise `cache_epoch` counts up, so a
        kept cache can tell that its contents were reused."""
        device = torch.device(device) if device is not None else self.device
        context, dtype = self.cfg["context_length"], self.activation_dtype
        length = cache_length_for(num_tokens, context)
        kc = self.trf_blocks[0].att.k_cache
        same = kc is not None and (kc.shape[0], kc.device, kc.dtype) == (
            batch_size, device, dtype)  # fmt: skip
        if keep:
            if not same or keep > kc.shape[2]:
                raise ValueError("no KV cache of this batch and device to continue")
            if kc.shape[2] >= num_tokens:
                return kc.shape[2]
            length = cache_length_for(max(num_tokens, 2 * kc.shape[2]), context)
        else:
            self.cache_epoch += 1
            if same and kc.shape[2] == length:
                return length
        shape = (batch_size, self.cfg["n_kv_groups"], length, self.head_dim)
        for block in self.trf_blocks:
            for name in ("k_cache", "v_cache"):
                new = torch.zeros(shape, dtype=dtype, device=device)
                if keep:
                    new[:, :, :keep] = getattr(block.att, name)[:, :, :keep]
                setattr(block.att, name, new)
        # the book's float32 cos/sin values, only fewer rows
        cos, sin = compute_rope_params(
            self.head_dim, theta_base=self.cfg["rope_base"], context_length=length
        )
        self.cos, self.sin = cos.to(device), sin.to(device)
        self.positions = torch.arange(length, device=device)
        return length

    def release_cache(self) -> None:
        """Drop the KV cache (a chat's /clear); the next generation makes a
        new one."""
        for block in self.trf_blocks:
            block.att.k_cache = block.att.v_cache = None
        self.cache_epoch += 1

    def forward(
        self,
        idx: Tensor,
        input_pos: Tensor,
        kv_len: int | None = None,
        block_fn: BlockFn | None = None,
    ) -> Tensor:
        """Logits for tokens `idx` (b, t) at positions `input_pos` (t,), whose
        keys/values are written into the cache first. `kv_len` (filled cache
        slots) lets eager code attend over exactly those, rounding like the
        book; None keeps every shape static. `block_fn` runs each layer.
        With `use_fused_prefill`, the logits of the last position only."""
        if self.positions is None:
            raise RuntimeError("Call setup_cache(batch_size, num_tokens) first.")
        x = self.tok_emb(idx)  # (b, t, emb_dim)
        cos, sin = self.cos[input_pos], self.sin[input_pos]  # (t, head_dim)
        # True where query i must NOT see key j (j > its position), repeated
        # for the r query heads the compiled step stacks per kv group:
        # (r*t, cache_len); eager attention uses the first t rows
        r = self.cfg["n_heads"] // self.cfg["n_kv_groups"]
        positions = self.positions[:kv_len]
        mask = (positions[None, :] > input_pos[:, None]).repeat(r, 1)
        run_block = block_fn or block_forward
        for block in self.trf_blocks:
            x = run_block(block, x, cos, sin, mask, input_pos, kv_len)
        if self.fused_prefill and x.shape[1] > 1:
            x = x[:, -1:]  # a prompt: only its last row's logits are used
        return self.out_head(self.final_norm(x))  # (b, t or 1, vocab_size)


def greedy_step(
    model: StaticQwen3,
    cur_token: Tensor,
    input_pos: Tensor,
    kv_len: int | None = None,
    block_fn: BlockFn | None = None,
) -> tuple[Tensor, Tensor]:
    """One decode step computed by `model` itself: (next token (b, 1), the
    last position's logits (b, vocab)); every decode step is this function,
    compiled or not, or replaces it."""
    logits = model(cur_token, input_pos, kv_len, block_fn)[:, -1]
    return torch.argmax(logits, dim=-1, keepdim=True), logits
