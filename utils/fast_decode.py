"""A faster decode path for the book's Qwen3 model (beyond Chapter 2).

Same weights, same state-dict keys and the same numerics as the book's
`Qwen3Model` (RMSNorm in float32, split-halves RoPE with float32 cos/sin,
qk-norm, grouped-query attention), arranged the way fast inference code is:

* a static KV cache, preallocated for prompt + new tokens and written in place,
  so every decode step has the same tensor shapes;
* the position is a tensor and the causal mask is a comparison against a
  precomputed `arange`, so nothing is rebuilt or concatenated per token;
* `prefill` runs the prompt once (eager); only the decode step is compiled,
  as one graph (replayed with CUDA graphs on CUDA; on CPU inductor fuses
  the small operations around the matrix-vector products), or with
  `compile_decode(scope="block")` only the transformer block, once for all
  layers (a short compile for a reader's first run);
* `generate` streams `(batch, 1)` tokens exactly like the book's
  `generate_text_basic_stream_cache`, stopping at EOS without yielding it.

On x86-64 CPUs with AVX2 the decode step's matrix-vector products run
through small C kernels (`utils.cpu_matvec`) that stream the bf16 weights
near the memory bandwidth; `FastQwen3.use_cpu_matvec(False)` turns them off.
Its eager kernel is used only where it rounds exactly like `F.linear`
(PyTorch's AVX2 path), and `F.linear` itself elsewhere (e.g. oneDNN on
AVX-512 BF16 CPUs). Eager decoding gives the book's greedy tokens where
PyTorch takes its AVX2 path (tested); elsewhere rounding may differ. The
compiled step (fused attention, reordered float32 sums) is close, not equal.

On CPUs, `FastQwen3.use_native_step()` runs the whole decode step as one
C call (`utils.native_step`): no compile, the fastest step there; close to
the eager step's numbers, not bit-equal. Weight-only int8 (approximate)
lives in `utils.quantize`; `pick_faster` times eager, compiled and native
decoding on this machine and keeps the fastest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from reasoning_from_scratch.qwen3 import RMSNorm, compute_rope_params

from utils import cpu_matvec
from utils.generation import check_generation_inputs
from utils.quantize import Int8Linear

__all__ = [
    "FastQwen3",
    "KernelLinear",
    "prefill",
    "decode_one_token",
    "generate",
    "cache_length_for",
    "pick_faster",
]


def __getattr__(name: str) -> Any:
    # quantize_int8 moved to utils.quantize; old imports work
    if name == "quantize_int8":
        from utils import quantize

        return getattr(quantize, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Cache lengths are rounded up to this multiple, so nearby prompt lengths
# reuse one compiled decode step instead of recompiling for every length.
CACHE_ROUND = 64


def cache_length_for(num_tokens: int, context_length: int) -> int:
    """The KV-cache length used for `num_tokens` positions: rounded up to a
    multiple of CACHE_ROUND, never beyond the model's context length."""
    rounded = -(-num_tokens // CACHE_ROUND) * CACHE_ROUND
    return max(num_tokens, min(rounded, context_length))


# ---------------------------------------------------------------------------
# Building blocks (parameter names match the book's modules)
# ---------------------------------------------------------------------------


class KernelLinear(nn.Linear):
    """`nn.Linear` whose single-row (decode) products may use the CPU
    matrix-vector kernel (bias-free layers only, as in Qwen3); `use_kernel`
    is set by FastQwen3."""

    use_kernel = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_kernel and self.bias is None:
            return cpu_matvec.linear(x, self.weight)
        return F.linear(x, self.weight, self.bias)


def project(x: torch.Tensor, layers: list[nn.Module]) -> list[torch.Tensor]:
    """`[layer(x) for layer in layers]` for bias-free layers that share x
    (q/k/v, gate/up): one kernel call for a decode row when all of them use
    the CPU kernel, with the same results as calling them one by one."""
    if (
        all(getattr(m, "use_kernel", False) for m in layers)
        and x.numel() == x.shape[-1]
    ):
        if all(type(m) is KernelLinear and m.bias is None for m in layers):
            return cpu_matvec.linear_group(x, [m.weight for m in layers])
        if all(type(m) is Int8Linear for m in layers):
            weights = [m.weight_int8 for m in layers]
            if all(cpu_matvec.supports(x, w) for w in weights):
                scales = [m.scales for m in layers]
                return cpu_matvec.int8_linear_group(x, weights, scales)
    return [m(x) for m in layers]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
        # (b, kv_groups, cache_len, head_dim); allocated by FastQwen3.setup_cache
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        input_pos: torch.Tensor,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = project(x, [self.W_query, self.W_key, self.W_value])
        q = q.reshape(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, self.num_kv_groups, self.head_dim).transpose(1, 2)
        v = v.reshape(b, t, self.num_kv_groups, self.head_dim)
        v = v.transpose(1, 2)  # (b, kv_groups, t, head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        # Write the new keys/values into their slots (in place, fixed shapes)
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)

        # Grouped-query attention without copying keys/values: the query heads
        # that share kv group g (heads g*r .. g*r+r-1, as repeat_interleave in
        # the book) are stacked along the token axis.
        # (b, heads, t, d) -> (b, kv_groups, r*t, d)
        r = self.num_heads // self.num_kv_groups
        q = q.reshape(b, self.num_kv_groups, r * t, self.head_dim)
        # kv_len (eager only) limits attention to the filled slots; the
        # compiled step always reads the whole static cache, masked
        keys, values = self.k_cache[:, :, :kv_len], self.v_cache[:, :, :kv_len]
        if torch.compiler.is_compiling():
            # Compiled decode step: one fused attention call (its float32
            # internals skip the book's bf16 rounding of the scores; measured
            # faster here than float32 scores + softmax left to inductor)
            ctx = F.scaled_dot_product_attention(q, keys, values, attn_mask=~mask)
        else:
            # Eager: the book's operations, order and dtypes, so bf16
            # rounds exactly alike and greedy tokens match the book's
            scores = q @ keys.transpose(2, 3)  # (b, kv_groups, r*t, kv_len)
            scores = scores.masked_fill(mask, -torch.inf)
            weights = torch.softmax(scores / self.head_dim**0.5, dim=-1)
            ctx = weights @ values  # (b, kv_groups, r*t, d)
        ctx = ctx.view(b, self.num_heads, t, self.head_dim).transpose(1, 2)
        return self.out_proj(ctx.reshape(b, t, self.num_heads * self.head_dim))


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


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


class FastQwen3(nn.Module):
    """Qwen3 with a static KV cache; loads the book's `Qwen3Model` state dict
    (same keys) and computes the same function."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        self.cfg = dict(cfg)
        self.tok_emb = nn.Embedding(
            cfg["vocab_size"], cfg["emb_dim"], dtype=cfg["dtype"]
        )
        self.trf_blocks = nn.ModuleList(
            [TransformerBlock(cfg) for _ in range(cfg["n_layers"])]
        )
        self.final_norm = RMSNorm(cfg["emb_dim"])
        self.out_head = KernelLinear(
            cfg["emb_dim"], cfg["vocab_size"], bias=False, dtype=cfg["dtype"]
        )
        self.head_dim = cfg["head_dim"] or cfg["emb_dim"] // cfg["n_heads"]
        self.register_buffer("cos", None, persistent=False)
        self.register_buffer("sin", None, persistent=False)
        self.register_buffer("positions", None, persistent=False)
        self._decode_step: Callable | None = None  # set by compile_decode
        self.compile_scope: str | None = None  # "step" or "block" once compiled
        self._kernel_wanted = True  # applied by prefill (see use_cpu_matvec)
        # a native step points at the weights: renew it when they are replaced
        self.register_load_state_dict_post_hook(_renew_native_step)

    # -- construction --------------------------------------------------------

    @classmethod
    def from_state_dict(
        cls, cfg: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]
    ) -> FastQwen3:
        """Build without random init and adopt the tensors of a book state dict
        (no copy; e.g. `torch.load(path, weights_only=True)`)."""
        with torch.device("meta"):
            model = cls(cfg)
        sd = dict(state_dict)
        tied = "out_head.weight" not in sd and "tok_emb.weight" in sd
        if tied:
            sd["out_head.weight"] = sd["tok_emb.weight"]
        model.load_state_dict(sd, strict=True, assign=True)
        if tied:  # one shared Parameter, as in the tied Qwen3 checkpoints
            model.out_head.weight = model.tok_emb.weight
        return model.eval()

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike,
        cfg: Mapping[str, Any] | None = None,
        int8: bool = False,
    ) -> FastQwen3:
        """Load a book checkpoint (.pth) memory-mapped, without a copy in
        RAM; with `int8=True` quantize it layer by layer, so the bf16
        weights are never all resident at once (see utils.quantize)."""
        from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B

        cfg = dict(cfg or QWEN_CONFIG_06_B)
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        sd = {k: v.to(cfg["dtype"]) for k, v in sd.items()}
        model = cls.from_state_dict(cfg, sd)
        del sd
        if int8:
            from utils.quantize import quantize_int8

            quantize_int8(model)
        return model

    @classmethod
    def from_book_model(cls, model: nn.Module) -> FastQwen3:
        """Wrap a book `Qwen3Model`: parameters are shared, not copied, so both
        models see the same weights (and tying is kept)."""
        if not hasattr(model, "cfg") or not hasattr(model, "trf_blocks"):
            raise TypeError(
                "from_book_model expects the book's Qwen3Model (with .cfg); "
                f"got {type(model).__name__}"
            )
        fast = cls.from_state_dict(model.cfg, model.state_dict(keep_vars=True))
        if model.out_head.weight is model.tok_emb.weight:
            fast.out_head.weight = fast.tok_emb.weight
        return fast

    def _device(self) -> torch.device:
        return self.final_norm.scale.device

    def _dtype(self) -> torch.dtype:
        """The activations' dtype (the embedding's, bf16 or int8-backed)."""
        emb = self.tok_emb
        return emb.dtype if hasattr(emb, "weight_int8") else emb.weight.dtype

    # -- CPU matrix-vector kernel ----------------------------------------------

    def use_cpu_matvec(self, enabled: bool = True) -> bool:
        """Choose whether decode steps on CPU use the AVX2 matrix-vector
        kernel (default: yes). Returns whether it is active now."""
        self._kernel_wanted = enabled
        return self._apply_cpu_matvec()

    def _apply_cpu_matvec(self) -> bool:
        on_cpu = self._device().type == "cpu"
        active = bool(self._kernel_wanted and on_cpu and cpu_matvec.get_kernels())
        for module in self.modules():
            if hasattr(module, "use_kernel") and module.use_kernel != active:
                module.use_kernel = active  # KernelLinear, quantize.Int8Linear
        return active

    def cpu_matvec_active(self) -> bool:
        """Whether the linear layers currently use the CPU kernel."""
        return any(getattr(m, "use_kernel", False) for m in self.modules())

    # -- cache -----------------------------------------------------------------

    @property
    def cache_shape(self) -> tuple[int, ...] | None:
        """(batch, kv_groups, cache_len, head_dim) of the current cache."""
        kc = self.trf_blocks[0].att.k_cache
        return None if kc is None else tuple(kc.shape)

    def setup_cache(
        self, batch_size: int, num_tokens: int, device: torch.device | str | None = None
    ) -> int:
        """Make sure a KV cache for `num_tokens` positions exists (rounded up,
        see `cache_length_for`); reuses the current one when it has that shape.
        Returns the cache length."""
        device = torch.device(device) if device is not None else self._device()
        length = cache_length_for(num_tokens, self.cfg["context_length"])
        dtype = self._dtype()
        n_kv = self.cfg["n_kv_groups"]
        shape = (batch_size, n_kv, length, self.head_dim)
        kc = self.trf_blocks[0].att.k_cache
        if kc is not None and tuple(kc.shape) == shape and kc.device == device:
            if kc.dtype == dtype:
                return length
        for block in self.trf_blocks:
            block.att.k_cache = torch.zeros(shape, dtype=dtype, device=device)
            block.att.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        # Same float32 cos/sin values as the book's buffers, only fewer rows
        cos, sin = compute_rope_params(
            self.head_dim, theta_base=self.cfg["rope_base"], context_length=length
        )
        self.cos, self.sin = cos.to(device), sin.to(device)
        self.positions = torch.arange(length, device=device)
        return length

    # -- forward -------------------------------------------------------------

    def forward(
        self,
        idx: torch.Tensor,
        input_pos: torch.Tensor,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """Logits for tokens `idx` (b, t) placed at positions `input_pos` (t,);
        their keys/values are written into the cache first.

        `kv_len` (a Python int, the number of filled cache slots) lets eager
        code attend over exactly those slots, which rounds exactly like the
        book in bf16; None (compiled step) keeps every shape static.
        """
        if self.positions is None:
            raise RuntimeError("Call setup_cache(batch_size, num_tokens) first.")
        x = self.tok_emb(idx)  # (b, t, emb_dim)
        cos, sin = self.cos[input_pos], self.sin[input_pos]  # (t, head_dim)
        # True where query i must NOT see key j (j > its position), repeated
        # for the r query heads stacked per kv group: (r*t, cache_len)
        r = self.cfg["n_heads"] // self.cfg["n_kv_groups"]
        positions = self.positions[:kv_len]
        mask = (positions[None, :] > input_pos[:, None]).repeat(r, 1)
        # the compiled block of compile_decode(scope="block"), only in the
        # static-shape decode step (kv_len None) and while it has not failed
        step = self._decode_step
        block_fn = getattr(step, "block_fn", None)
        if block_fn is None or step.failed or kv_len is not None:
            block_fn = _block_forward
        for block in self.trf_blocks:
            x = block_fn(block, x, cos, sin, mask, input_pos, kv_len)
        x = self.final_norm(x)
        return self.out_head(x)  # (b, t, vocab_size)

    # -- compilation -----------------------------------------------------------

    def compile_decode(
        self,
        mode: str | None = None,
        options: Mapping[str, Any] | None = None,
        scope: str = "step",
    ) -> FastQwen3:
        """Compile the decode step used by `generate`.

        scope="step": the whole step as one graph (fastest per token; on
        CUDA replayed with CUDA graphs, mode="reduce-overhead"; on CPU plain
        inductor, whose fused loops around the matrix-vector kernel leave
        little but the weight reads). scope="block": only the transformer
        block, compiled once and reused by every layer (all layers have the
        same shapes), the rest eager: a fraction of the compile time, a
        little slower per token. If compiling fails, generation falls back
        to eager with a one-line message."""
        if scope not in ("step", "block"):
            raise ValueError(f'scope must be "step" or "block", got {scope!r}')
        device = self._device()
        if mode is None and options is None and device.type == "cuda":
            mode = "reduce-overhead" if scope == "step" else None
        kwargs: dict[str, Any] = {"fullgraph": True, "dynamic": False}
        if mode is not None:
            kwargs["mode"] = mode
        if options:
            kwargs["options"] = dict(options)
        if scope == "block":
            # the eager step; forward runs each layer through the block_fn
            self._decode_step = _FallbackCompiled(
                _decode_one_token_impl, torch.compile(_block_forward, **kwargs)
            )
        else:
            self._decode_step = _FallbackCompiled(
                torch.compile(_decode_one_token_impl, **kwargs)
            )
        self.compile_scope = scope
        return self

    def decode_compiled(self) -> bool:
        """Whether `generate` will use a compiled decode step."""
        step = self._decode_step
        return isinstance(step, _FallbackCompiled) and not step.failed

    def use_native_step(self, enabled: bool = True, exact: bool = True) -> bool:
        """Run each decode step (batch 1, CPU) as one C call, no compile
        needed (`utils.native_step`; close to, not bit-equal with, eager).
        Replaces a compiled step. Returns whether it is on; where it cannot
        run, prints one line saying why and keeps the current step."""
        from utils import native_step

        if not enabled:
            if self.decode_native():
                self._decode_step = None
            return False
        reason = native_step.unsupported_reason(self)
        if reason is not None:
            print(f"fast_decode: native decode step off ({reason})")
            return False
        self._decode_step = native_step.NativeStep(self, exact=exact)
        self.compile_scope = None
        return True

    def decode_native(self) -> bool:
        """Whether `generate` will use the native (one C call) decode step."""
        from utils.native_step import NativeStep

        return isinstance(self._decode_step, NativeStep)


def _renew_native_step(model: FastQwen3, incompatible: Any) -> None:
    if model.decode_native():
        from utils.native_step import NativeStep

        model._decode_step = NativeStep(model, exact=model._decode_step.exact)


class _FallbackCompiled:
    """Calls the compiled step; if compiling fails (e.g. no C++ compiler),
    prints one line and uses the eager step from then on."""

    def __init__(self, compiled: Callable, block_fn: Callable | None = None) -> None:
        self.compiled = compiled
        self.block_fn = block_fn  # scope="block": the compiled layer
        self.failed = False

    def __call__(self, model, cur_token, input_pos):
        if not self.failed:
            try:
                return self.compiled(model, cur_token, input_pos)
            except Exception as exc:  # noqa: BLE001 - any compiler failure
                from utils.compile import compile_hint

                self.failed = True
                lines = str(exc).strip().splitlines()
                reason = lines[0][:160] if lines else type(exc).__name__
                print(
                    f"fast_decode: torch.compile failed ({type(exc).__name__}: "
                    f"{reason}); using the eager decode step. {compile_hint(exc)}"
                )
        return _decode_one_token_impl(model, cur_token, input_pos)


# ---------------------------------------------------------------------------
# Prefill / decode / generate
# ---------------------------------------------------------------------------


def _block_forward(block, x, cos, sin, mask, input_pos, kv_len=None):
    # one function for every layer, so scope="block" compiles it only once
    return block(x, cos, sin, mask, input_pos, kv_len)


def _decode_one_token_impl(model, cur_token, input_pos, kv_len=None):
    logits = model(cur_token, input_pos, kv_len)[:, -1]  # (b, vocab_size)
    return torch.argmax(logits, dim=-1, keepdim=True), logits


@torch.inference_mode()
def prefill(
    model: FastQwen3, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the prompt (b, t) from position 0, filling the cache; returns the
    greedy next token (b, 1) and the last position's logits (b, vocab)."""
    model._apply_cpu_matvec()
    num_tokens = token_ids.shape[1]
    input_pos = torch.arange(num_tokens, device=token_ids.device)
    logits = model(token_ids, input_pos, num_tokens)[:, -1]
    return torch.argmax(logits, dim=-1, keepdim=True), logits


@torch.inference_mode()
def decode_one_token(
    model: FastQwen3,
    cur_token: torch.Tensor,
    input_pos: torch.Tensor,
    kv_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: token (b, 1) at position `input_pos` (shape (1,)) ->
    (next token (b, 1), logits (b, vocab)). Uses the compiled step if there
    is one; otherwise eager, over `kv_len` cache slots when given."""
    if model._decode_step is not None:
        next_token, logits = model._decode_step(model, cur_token, input_pos)
    else:
        next_token, logits = _decode_one_token_impl(model, cur_token, input_pos, kv_len)
    # CUDA graphs reuse their output memory on the next replay: keep copies
    return next_token.clone(), logits.clone()


def _check_fast_model(model: Any) -> None:
    if not isinstance(model, FastQwen3):
        raise TypeError(
            "generate() needs a FastQwen3; wrap the book's model with "
            "FastQwen3.from_book_model(model)"
        )


def generate(
    model: FastQwen3,
    token_ids: torch.Tensor,
    max_new_tokens: int,
    eos_token_id: int | None = None,
) -> Iterator[torch.Tensor]:
    """Yield greedy tokens (shape (batch, 1)) like the book's
    `generate_text_basic_stream_cache`: stop when every sequence produced
    `eos_token_id`, never yielding it or anything after it."""
    _check_fast_model(model)
    check_generation_inputs(model, token_ids, max_new_tokens)
    return _generate(model, token_ids, max_new_tokens, eos_token_id)


@torch.inference_mode()
def _generate(model, token_ids, max_new_tokens, eos_token_id):
    if max_new_tokens == 0:
        return
    model.eval()
    batch, prompt_len = token_ids.shape
    device = token_ids.device
    model.setup_cache(batch, prompt_len + max_new_tokens, device)

    def step(token, input_pos, kv_len):
        return decode_one_token(model, token, input_pos, kv_len)[0]

    # On asynchronous devices, queue step i+1 before looking at token i: the
    # EOS check then waits for a token that is already done while the device
    # keeps working. On CPU nothing runs ahead, so compute only on demand.
    look_ahead = device.type != "cpu"

    token, _ = prefill(model, token_ids)
    input_pos = torch.tensor([prompt_len], device=device)
    for i in range(max_new_tokens):
        more = i + 1 < max_new_tokens
        if more and look_ahead:
            upcoming = step(token, input_pos, prompt_len + i + 1)
        if eos_token_id is not None and bool(torch.all(token == eos_token_id)):
            break
        yield token
        if more and not look_ahead:
            upcoming = step(token, input_pos, prompt_len + i + 1)
        if more:
            token = upcoming
            input_pos = input_pos + 1


def pick_faster(
    model: FastQwen3,
    token_ids: torch.Tensor,
    steps: int = 6,
    max_new_tokens: int | None = None,
    scope: str = "step",
    native: bool = True,
) -> dict[str, Any]:
    """Time `steps` decode steps eager, compiled (compiling first with
    `scope`, if not compiled yet) and, with `native` where it can run, as
    one C call (`use_native_step`); keep the fastest. Give the
    `max_new_tokens` you will generate, so the cache (and compiled code) has
    the size `generate` will use. Returns {"choice": "eager"|"compiled"|
    "native", "eager_s", "compiled_s", "native_s" (None if not timed),
    "compile_s"} (median seconds per step; compile_s = first compiled step)."""
    _check_fast_model(model)
    if model._decode_step is None or model.decode_native():
        model.compile_decode(scope=scope)
    compiled = model._decode_step
    length = token_ids.shape[1] + max(steps + 1, max_new_tokens or 0)
    native_step = None
    # the native step runs one CPU sequence
    if native and token_ids.shape[0] == 1 and token_ids.device.type == "cpu":
        from utils import native_step as ns

        if ns.unsupported_reason(model) is None:
            native_step = ns.NativeStep(model)

    def per_step(step_fn: Callable | None) -> tuple[float, float]:
        model._decode_step = step_fn
        model.setup_cache(token_ids.shape[0], length)
        token, _ = prefill(model, token_ids)
        pos = torch.tensor([token_ids.shape[1]], device=token_ids.device)
        times = []
        for i in range(steps + 1):
            t0 = time.perf_counter()
            token, _ = decode_one_token(model, token, pos + i, int(pos) + i + 1)
            if token.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        rest = sorted(times[1:])  # the first step may compile
        return times[0], rest[len(rest) // 2]

    with torch.inference_mode():  # as in generate: no guard mismatch
        _, eager_s = per_step(None)
        compile_s, compiled_s = per_step(compiled)
        native_s = None if native_step is None else per_step(native_step)[1]
    timed = {"eager": (eager_s, None)}
    if not compiled.failed:
        timed["compiled"] = (compiled_s, compiled)
    if native_step is not None:
        timed["native"] = (native_s, native_step)
    choice = min(timed, key=lambda k: timed[k][0])
    model._decode_step = timed[choice][1]
    if choice == "native":
        model.compile_scope = None
    return {
        "choice": choice,
        "eager_s": eager_s,
        "compiled_s": compiled_s,
        "native_s": native_s,
        "compile_s": compile_s,
    }
