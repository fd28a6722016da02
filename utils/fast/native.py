"""The whole decode step as one C call (CPU, batch 1): the Python side.

Around its products the eager step makes about a hundred small torch calls
per token, which on a small CPU cost as much as reading the weights;
torch.compile removes most of them but takes a while. `qwen3_decode_step`
(csrc/decode_step.c) runs embedding to logits in one call, reading the
model's own weights and KV cache in place, so prefill, eager and compiled
steps mix freely. It takes one table of pointers whose layout
`csrc/step_layout.h` defines and the library reports by name; this module
fills it by name.

Numerics: bf16 is rounded where the book's model rounds it, but float32
sums (norms, softmax, attention) run in their own order: tokens are close
to the eager step's, not guaranteed equal (ch02/03_fast-decoding/
agreement.py). Every kernel `utils.fast.dispatch` picks gives the first
kernel's bits within the exact and int8 classes, on x86-64 and AArch64.
"""

from __future__ import annotations

import array
import operator
import time
from collections.abc import Sequence
from typing import Any

import torch
from reasoning_from_scratch.qwen3 import compute_rope_params
from torch import Tensor

from utils.fast.dispatch import choose
from utils.fast.hugepages import move_weights_to_huge_pages
from utils.fast.kernels import get_kernels
from utils.fast.model import cache_length_for, greedy_step
from utils.fast.threads import ThreadChoice, pinned_threads

# Each layer's linear layers by the letter X of their slots WX (weight)
# and SX (int8 scales); the groups share one input: one grouped call in C
_LINEARS = {
    "Q": "att.W_query", "K": "att.W_key", "V": "att.W_value", "O": "att.out_proj",
    "1": "ff.fc1", "2": "ff.fc2", "3": "ff.fc3",
}  # fmt: skip
_GROUPS = ("QKV", "O", "12", "3")
# logits and token tensors made at a time (NativeStep._fresh_outputs):
# about 5 MB ahead for Qwen3's vocabulary
OUTPUTS_AHEAD = 16
# Prompt tokens per call of a native prefill (its scores: heads x positions
# floats a row)
PREFILL_ROWS = 64
# The slot names this module fills, per section of the reported layout
LAYOUT_NAMES = {
    "global": {"EMB", "EMB_SCALE", "FINAL_NORM", "HEAD", "HEAD_SCALE", "COS", "SIN"},
    "layer": {"NORM1", "NORM2", "QNORM", "KNORM", "KC", "VC"}
    | {kind + x for x in _LINEARS for kind in "WS"},
    "dims": {"LAYERS", "EMB", "HEADS", "KV", "HEAD_DIM", "HIDDEN", "VOCAB", "CACHE"},
}


def _weight(layer: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    """(weight, scales or None) of a linear layer or embedding, bf16 or int8."""
    if hasattr(layer, "weight_int8"):
        return layer.weight_int8, layer.scales
    return layer.weight, None


def _linears(model: Any) -> list[torch.nn.Module]:
    """The model's linear layers: the head, then each layer's, in order."""
    blocks = model.trf_blocks
    return [model.out_head] + [
        b.get_submodule(p) for b in blocks for p in _LINEARS.values()
    ]


def _layers_reason(model: Any) -> str | None:
    """Why the model's layers do not fit the C step (None: they do)."""
    eps = float(model.final_norm.eps)
    for block in model.trf_blocks:
        att = block.att
        norms = [block.norm1, block.norm2]
        if att.q_norm is not None:
            norms += [att.q_norm, att.k_norm]
        if not all(
            getattr(n, "shift", None) is None
            and getattr(n, "qwen3_compatible", True)
            and float(n.eps) == eps
            for n in norms
        ):
            return "its RMSNorm layers differ from Qwen3's"
        for group in _GROUPS:
            mods = [block.get_submodule(_LINEARS[x]) for x in group]
            if len({_weight(m)[1] is None for m in mods}) > 1:
                return "layers sharing an input mix int8 and bf16 weights"
    for layer in [model.tok_emb, *_linears(model)]:
        w, s = _weight(layer)
        if getattr(layer, "bias", None) is not None:
            return "its linear layers have biases"
        if w.dtype not in (torch.bfloat16, torch.int8) or not w.is_contiguous():
            return "its weights must be contiguous bf16 or int8"
        if s is not None and (s.dtype != torch.float32 or not s.is_contiguous()):
            return "its int8 scales must be contiguous float32"
    return None


def unsupported_reason(model: Any) -> str | None:
    """Why the native step cannot run this model here (None: it can)."""
    kernels = get_kernels()
    if kernels is None:
        return "the CPU kernels are not available here"
    layout = kernels.library.layout
    if {k: set(v) for k, v in layout.items()} != LAYOUT_NAMES:
        return "the C library reports another decode-step table layout"
    if model.device.type != "cpu":
        return "it runs on the CPU only"
    if model.activation_dtype != torch.bfloat16:
        return f"it needs a bf16 model (this one is {model.activation_dtype})"
    cfg = model.cfg
    if cfg["emb_dim"] % 16 or cfg["hidden_dim"] % 16 or model.head_dim % 16:
        return "the model's sizes must be multiples of 16"
    return _layers_reason(model)


class NativeStep:
    """The decode step as one C call for a `StaticQwen3` (a `DecodeStep`);
    other batches, and a model set to `use_cpu_matvec(False)`, take the
    eager step. `kernels` forces kernels as $QWEN3_KERNEL_VARIANTS does
    (None: that variable, else the table's choice, `utils.fast.dispatch`).
    It reads (and keeps alive) the weights the model had when it was made,
    first moved onto 2 MB pages where Linux has them (in place:
    `utils.fast.hugepages`); a FastQwen3 renews or drops it when they are
    replaced."""

    kind = "native"
    fresh_outputs = True  # new logits and token tensors every call

    def __init__(self, model: Any, kernels: str | None = None) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"native decode step unavailable: {reason}")
        move_weights_to_huge_pages(model)
        self.forced = kernels
        self._kernels = get_kernels()
        layout = self._kernels.library.layout
        self._g = {name: i for i, name in enumerate(layout["global"])}
        self._l = {name: i for i, name in enumerate(layout["layer"])}
        self._d = {name: i for i, name in enumerate(layout["dims"])}
        # every tensor the table points at (weights, float32 norm copies)
        self._keep: list[Tensor] = []
        cfg = model.cfg
        self._vocab = cfg["vocab_size"]
        dims = {
            "LAYERS": cfg["n_layers"], "EMB": cfg["emb_dim"],
            "HEADS": cfg["n_heads"], "KV": cfg["n_kv_groups"],
            "HEAD_DIM": model.head_dim, "HIDDEN": cfg["hidden_dim"],
            "VOCAB": cfg["vocab_size"], "CACHE": 0,  # set per cache
        }  # fmt: skip
        self._dims = array.array("l", [dims[name] for name in layout["dims"]])
        self._eps = float(model.final_norm.eps)
        self._table = array.array("Q", self._static_table(model))
        # the dicts nn.Module keeps the caches in: read per step, far cheaper
        # than an attribute read through Module.__getattr__ per cache
        self._cache_dicts = [block.att._buffers for block in model.trf_blocks]
        # the cos/sin and cache tensors the table points at, held so their
        # memory cannot be freed and reused while the table names it
        self._cache_refs: tuple[Tensor, ...] = ()
        self._cache_ok = False  # whether those caches are ones the C step takes
        self._keep_cache: tuple[Tensor, ...] = ()
        self._outputs: list[tuple[Tensor, Tensor]] = []
        self._ints = array.array("q", [0, 0])  # see _token_and_pos
        chosen = choose(self._kernels, ("exact", "int8", "int8_mm"), setting=kernels)
        self._indices = array.array(
            "i", [chosen[cls].index for cls in ("exact", "int8", "int8_mm")]
        )
        # the kernel per class the model's products run (bf16: exact; int8)
        int8 = {_weight(layer)[1] is not None for layer in _linears(model)}
        used = {"exact": False in int8, "int8": True in int8}
        self.kernels = {cls: chosen[cls] for cls, needed in used.items() if needed}
        self.threads = ThreadChoice()
        self.rows_threads = ThreadChoice()  # steps of several rows: other times
        self._rope: tuple[Tensor, Tensor] | None = None  # see rows()

    def describe(self) -> str:
        """One line for the reader, e.g. "bf16_exact_avx2, int8_avx2"."""
        return ", ".join(k.name for k in self.kernels.values())

    @property
    def cache_length(self) -> int:
        """The cache length the table was last pointed at (0: none yet)."""
        return self._dims[self._d["CACHE"]]

    def _hold(self, t: Tensor | None) -> int:
        """t's address (0 for None), kept alive as long as this step."""
        if t is None:
            return 0
        self._keep.append(t)
        return t.data_ptr()

    def _f32(self, t: Tensor | None) -> int:
        """A float32 contiguous copy of t (a norm's scale), held; 0 for None."""
        return 0 if t is None else self._hold(t.detach().float().contiguous())

    def _static_table(self, model: Any) -> list[int]:
        emb_w, emb_s = _weight(model.tok_emb)  # contiguous: _layers_reason
        head_w, head_s = _weight(model.out_head)
        table = [0] * len(self._g)  # COS, SIN: filled per cache
        table[self._g["EMB"]] = self._hold(emb_w)
        table[self._g["EMB_SCALE"]] = self._hold(emb_s)
        table[self._g["FINAL_NORM"]] = self._f32(model.final_norm.scale)
        table[self._g["HEAD"]] = self._hold(head_w)
        table[self._g["HEAD_SCALE"]] = self._hold(head_s)
        for block in model.trf_blocks:
            slots = [0] * len(self._l)  # KC, VC: filled per cache
            slots[self._l["NORM1"]] = self._f32(block.norm1.scale)
            slots[self._l["NORM2"]] = self._f32(block.norm2.scale)
            if block.att.q_norm is not None:  # else 0: no qk-norm
                slots[self._l["QNORM"]] = self._f32(block.att.q_norm.scale)
                slots[self._l["KNORM"]] = self._f32(block.att.k_norm.scale)
            for x, path in _LINEARS.items():
                w, s = _weight(block.get_submodule(path))
                slots[self._l["W" + x]] = self._hold(w)
                slots[self._l["S" + x]] = self._hold(s)
            table += slots
        return table

    def _point_at_cache(self, model: Any) -> bool:
        """Point the table at the model's current cache and cos/sin rows
        (checked by identity each step: a few microseconds); False when the
        cache is one the C step cannot take (none, a batch, not bf16)."""
        current = [model._buffers["cos"], model._buffers["sin"]]
        for buffers in self._cache_dicts:
            current += (buffers["k_cache"], buffers["v_cache"])
        held = self._cache_refs
        if len(held) == len(current) and all(map(operator.is_, current, held)):
            return self._cache_ok
        caches = current[2:]
        self._cache_refs, self._cache_ok = tuple(current), False
        if not all(
            c is not None and c.shape[0] == 1 and c.dtype == torch.bfloat16
            for c in caches
        ):
            return False
        if not all(t.is_contiguous() for t in caches):
            self._cache_refs = ()
            raise ValueError("the KV cache must be contiguous")
        cos, sin = model.cos.contiguous(), model.sin.contiguous()
        self._table[self._g["COS"]] = cos.data_ptr()
        self._table[self._g["SIN"]] = sin.data_ptr()
        per_layer, kc, vc = len(self._l), self._l["KC"], self._l["VC"]
        for i in range(len(self._cache_dicts)):
            base = len(self._g) + i * per_layer
            self._table[base + kc] = caches[2 * i].data_ptr()
            self._table[base + vc] = caches[2 * i + 1].data_ptr()
        self._dims[self._d["CACHE"]] = caches[0].shape[2]
        # the identity check needs the model's own objects; the pointers
        # may name contiguous copies: hold both
        self._keep_cache = (cos, sin)
        self._cache_ok = True
        return True

    def drop_cache(self) -> None:
        """Let go of the cache the table points at (the model dropped it)."""
        self._cache_refs, self._keep_cache, self._cache_ok = (), (), False

    def _token_and_pos(self, cur_token: Tensor, input_pos: Tensor) -> tuple[int, int]:
        """Addresses of the token and the (first) position as int64 for C:
        the tensors' own where they are int64 on the CPU, else copies."""
        if cur_token.dtype is torch.int64 and input_pos.dtype is torch.int64:
            if input_pos.is_cpu and input_pos.numel() > 0:
                return cur_token.data_ptr(), input_pos.data_ptr()
        self._ints[0] = int(cur_token)
        self._ints[1] = int(input_pos.reshape(-1)[0])
        address = self._ints.buffer_info()[0]
        return address, address + self._ints.itemsize

    def _fresh_outputs(self) -> tuple[Tensor, Tensor]:
        """New logits (1, vocab) and token (1, 1) tensors (never handed out
        twice), made OUTPUTS_AHEAD at a time: a torch.empty with the caches
        cold after a step costs many times one made right after another."""
        if not self._outputs:
            with torch.inference_mode(False):  # usable in and out of it
                self._outputs = [
                    (
                        torch.empty(1, self._vocab, dtype=torch.bfloat16),
                        torch.empty((1, 1), dtype=torch.int64),
                    )
                    for _ in range(OUTPUTS_AHEAD)
                ]
        return self._outputs.pop()

    def __call__(
        self,
        model: Any,
        cur_token: Tensor,
        input_pos: Tensor,
        kv_len: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        # Torch calls here run from cold caches (the weights have just
        # streamed through): the checks are few, C reads the token and
        # position in place and writes into outputs made ahead.
        if not (
            cur_token.is_cpu
            and cur_token.shape == (1, 1)
            and model.cpu_matvec_wanted
            and self._point_at_cache(model)
        ):
            return greedy_step(model, cur_token, input_pos, kv_len)
        logits, next_token = self._fresh_outputs()
        threads = pinned_threads() or self.threads.next(torch.get_num_threads())
        start = time.perf_counter()
        rc = self._kernels.lib.qwen3_decode_step(
            self._dims.buffer_info()[0], self._eps, self._table.buffer_info()[0],
            *self._token_and_pos(cur_token, input_pos),
            self._indices.buffer_info()[0], logits.data_ptr(), next_token.data_ptr(),
            threads,
        )  # fmt: skip
        self.threads.record(threads, time.perf_counter() - start)
        if rc == 1:
            pos = int(input_pos.reshape(-1)[0])
            raise ValueError(
                f"native decode step: token {int(cur_token)} must be in [0, "
                f"{self._vocab}) and position {pos} inside the KV cache "
                f"({self.cache_length} slots; call setup_cache for more)"
            )
        if rc == 3:
            raise RuntimeError("native decode step: the CPU cannot run its kernel")
        if rc:
            raise MemoryError("native decode step: out of memory")
        # torch.argmax's choice (first maximum, NaN first), made in C
        return next_token, logits

    def _rows_rope(self, model: Any, positions: int) -> int:
        """Make the rows' cos/sin tables hold at least `positions` positions
        (the model's own values, `compute_rope_params`; grown by doubling);
        returns how many they hold."""
        held = 0 if self._rope is None else self._rope[0].shape[0]
        if held < positions:
            context = model.cfg["context_length"]
            length = cache_length_for(max(positions, 2 * held), context)
            self._rope = compute_rope_params(
                model.head_dim, theta_base=model.cfg["rope_base"], context_length=length
            )
            held = length
        return held

    def rows(
        self,
        model: Any,
        tokens: Sequence[int],
        positions: Sequence[int],
        caches: Sequence[Sequence[Tensor]],
        want: Sequence[bool] | None = None,
    ) -> tuple[list[int], Tensor]:
        """One step for several rows: row r's token `tokens[r]` at
        `positions[r]`, its keys and values written into and read from
        `caches[r]` (per layer keys then values, each (1, kv groups, slots,
        head_dim) bf16; consecutive rows of one prompt may name the same
        caches, at consecutive positions). Returns the argmax token and the
        logits (rows, vocab) of the rows `want` names (None: every row):
        each row's bits those the step gives it alone (`__call__`),
        whatever the other rows."""
        m = len(tokens)
        held = self._rows_rope(model, max(positions) + 1)
        table = array.array("Q", self._table)
        table[self._g["COS"]] = self._rope[0].data_ptr()
        table[self._g["SIN"]] = self._rope[1].data_ptr()
        dims = array.array("l", self._dims)
        dims[self._d["CACHE"]] = held
        pointers = array.array("Q", [t.data_ptr() for row in caches for t in row])
        slots = array.array("l", [row[0].shape[2] for row in caches])
        toks, pos = array.array("q", tokens), array.array("q", positions)
        flags = None if want is None else array.array("B", [bool(w) for w in want])
        k = m if want is None else sum(flags)
        nxt = array.array("l", [0] * max(k, 1))
        logits = torch.empty(k, self._vocab, dtype=torch.bfloat16)
        threads = pinned_threads() or self.rows_threads.next(torch.get_num_threads())
        start = time.perf_counter()
        rc = self._kernels.lib.qwen3_decode_rows(
            dims.buffer_info()[0], self._eps, table.buffer_info()[0], m,
            toks.buffer_info()[0], pos.buffer_info()[0], pointers.buffer_info()[0],
            slots.buffer_info()[0], 0 if flags is None else flags.buffer_info()[0],
            self._indices.buffer_info()[0], logits.data_ptr(), nxt.buffer_info()[0],
            threads,
        )  # fmt: skip
        self.rows_threads.record(threads, time.perf_counter() - start)
        if rc == 1:
            raise ValueError("native rows step: a token, position or cache is invalid")
        if rc == 3:
            raise RuntimeError("native rows step: the CPU cannot run its kernel")
        if rc:
            raise MemoryError("native rows step: out of memory")
        return nxt.tolist()[:k], logits

    def prefill(
        self, model: Any, token_ids: Tensor, start: int = 0
    ) -> tuple[Tensor, Tensor]:
        """A prompt (1, n) at positions start.. through `rows`, PREFILL_ROWS
        rows a call, into the model's own cache (set up for them): each
        prompt token gets the bits the decode step would give it, on the
        step's thread team. Returns (argmax token (1, 1), logits (1, vocab))
        of the last position."""
        ids = token_ids[0].tolist()
        caches = [t for d in self._cache_dicts for t in (d["k_cache"], d["v_cache"])]
        if any(t is None or t.shape[2] < start + len(ids) for t in caches):
            raise ValueError("native prefill: set up a cache for the prompt first")
        for i in range(0, len(ids), PREFILL_ROWS):
            chunk = ids[i : i + PREFILL_ROWS]
            last = i + len(chunk) == len(ids)
            nxt, logits = self.rows(
                model, chunk, range(start + i, start + i + len(chunk)),
                [caches] * len(chunk), [last and j == len(chunk) - 1
                                        for j in range(len(chunk))],
            )  # fmt: skip
        return torch.tensor([nxt]), logits
