"""Qwen3 parameter names and configs: the book's `Qwen3Model` <-> Hugging Face.

The book names its parameters after the concepts of Chapter 2 (`tok_emb`,
`trf_blocks.0.att.W_query`, `ff.fc1`, ...); Hugging Face `transformers` uses
its own names (`model.embed_tokens`, `model.layers.0.self_attn.q_proj`,
`mlp.gate_proj`, ...). The tensors themselves are identical, so converting
is a pure renaming plus the tied output head, and a config is the same
numbers under other keys. Nothing here reads or writes a file:
`utils.hf_interop` does that (and re-exports these names).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from utils.qwen3_tokenizer import ENDOFTEXT_ID


class TyingError(ValueError):
    """The output head and the embedding disagree with the tying asked for."""


# Book name -> Hugging Face name, inside one transformer block.
_BLOCK_BOOK_TO_HF = {
    "att.W_query.weight": "self_attn.q_proj.weight",
    "att.W_key.weight": "self_attn.k_proj.weight",
    "att.W_value.weight": "self_attn.v_proj.weight",
    "att.out_proj.weight": "self_attn.o_proj.weight",
    "att.q_norm.scale": "self_attn.q_norm.weight",
    "att.k_norm.scale": "self_attn.k_norm.weight",
    "norm1.scale": "input_layernorm.weight",
    "norm2.scale": "post_attention_layernorm.weight",
    # SwiGLU: silu(fc1(x)) * fc2(x) -> fc3, i.e. gate, up, down
    "ff.fc1.weight": "mlp.gate_proj.weight",
    "ff.fc2.weight": "mlp.up_proj.weight",
    "ff.fc3.weight": "mlp.down_proj.weight",
}
_BLOCK_HF_TO_BOOK = {hf: book for book, hf in _BLOCK_BOOK_TO_HF.items()}
_OPTIONAL_BLOCK_KEYS = {"att.q_norm.scale", "att.k_norm.scale"}  # qk_norm=False

# Book name -> Hugging Face name, outside the blocks.
_TOP_BOOK_TO_HF = {
    "tok_emb.weight": "model.embed_tokens.weight",
    "final_norm.scale": "model.norm.weight",
    "out_head.weight": "lm_head.weight",
}
_TOP_HF_TO_BOOK = {hf: book for book, hf in _TOP_BOOK_TO_HF.items()}

_BOOK_BLOCK_RE = re.compile(r"trf_blocks\.(\d+)\.(.+)")
_HF_BLOCK_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
# Buffers some older exports saved; they are recomputed, never loaded.
_HF_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

_CFG_KEYS = (
    "vocab_size",
    "context_length",
    "emb_dim",
    "n_heads",
    "n_layers",
    "hidden_dim",
    "head_dim",
    "qk_norm",
    "n_kv_groups",
    "rope_base",
    "dtype",
)


# --------------------------------------------------------------------------
# Key mapping
# --------------------------------------------------------------------------


def book_key_to_hf(key: str) -> str:
    """The Hugging Face name of one book state-dict key (ValueError if unknown)."""
    if key in _TOP_BOOK_TO_HF:
        return _TOP_BOOK_TO_HF[key]
    m = _BOOK_BLOCK_RE.fullmatch(key)
    if m and m.group(2) in _BLOCK_BOOK_TO_HF:
        return f"model.layers.{m.group(1)}.{_BLOCK_BOOK_TO_HF[m.group(2)]}"
    raise ValueError(
        f"Unknown key {key!r} for the book's Qwen3Model; expected keys such as "
        f"'tok_emb.weight' or 'trf_blocks.0.att.W_query.weight'."
    )


def hf_key_to_book(key: str) -> str:
    """The book's name of one Hugging Face Qwen3 key (ValueError if unknown)."""
    if key in _TOP_HF_TO_BOOK:
        return _TOP_HF_TO_BOOK[key]
    m = _HF_BLOCK_RE.fullmatch(key)
    if m and m.group(2) in _BLOCK_HF_TO_BOOK:
        return f"trf_blocks.{m.group(1)}.{_BLOCK_HF_TO_BOOK[m.group(2)]}"
    raise ValueError(
        f"Unknown key {key!r} for a Hugging Face Qwen3ForCausalLM; expected "
        f"keys such as 'model.embed_tokens.weight' or "
        f"'model.layers.0.self_attn.q_proj.weight' (dense Qwen3 only, no MoE)."
    )


def _rename_all(
    sd: Mapping[str, torch.Tensor], rename, what: str
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, value in sd.items():
        try:
            out[rename(key)] = value
        except ValueError:
            unknown.append(key)
    if unknown:
        shown = ", ".join(repr(k) for k in unknown[:5])
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise ValueError(f"Unknown {what} key(s): {shown}{more}.")
    return out


def _check_complete(book_sd: Mapping[str, torch.Tensor], where: str) -> None:
    """Every block has the same full set of keys, blocks are numbered 0..n-1,
    and the embedding, final norm and output head are present."""
    layers: dict[int, set[str]] = {}
    for key in book_sd:
        m = _BOOK_BLOCK_RE.fullmatch(key)
        if m:
            layers.setdefault(int(m.group(1)), set()).add(m.group(2))
    missing = [k for k in _TOP_BOOK_TO_HF if k not in book_sd]
    if not layers:
        missing.append("trf_blocks.0.*")
    required = set(_BLOCK_BOOK_TO_HF) - _OPTIONAL_BLOCK_KEYS
    if any(have & _OPTIONAL_BLOCK_KEYS for have in layers.values()):
        required |= _OPTIONAL_BLOCK_KEYS  # qk_norm in one block -> in all
    for i in range(max(layers, default=-1) + 1):
        have = layers.get(i, set())
        missing += [f"trf_blocks.{i}.{k}" for k in sorted(required - have)]
    if missing:
        shown = ", ".join(repr(k) for k in missing[:5])
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"Missing key(s) in {where}: {shown}{more}.")


def book_to_hf_state_dict(
    sd: Mapping[str, torch.Tensor], *, tie_word_embeddings: bool = False
) -> dict[str, torch.Tensor]:
    """Rename a book `Qwen3Model` state dict to Hugging Face Qwen3 names.

    With `tie_word_embeddings=True` the output head is left out (Hugging Face
    reuses the embedding); that needs `out_head.weight == tok_emb.weight`.
    """
    out = _rename_all(sd, book_key_to_hf, "book Qwen3Model")
    _check_complete(sd, "the book state dict")
    if tie_word_embeddings and not torch.equal(
        sd["out_head.weight"], sd["tok_emb.weight"]
    ):
        raise TyingError(
            "tie_word_embeddings=True, but out_head.weight differs from "
            "tok_emb.weight; pass tie_word_embeddings=False to keep both."
        )
    if tie_word_embeddings:
        del out["lm_head.weight"]
    return out


def hf_to_book_state_dict(
    sd: Mapping[str, torch.Tensor],
    *,
    tie_word_embeddings: bool | None = None,
    cfg: Mapping[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face Qwen3 state dict to the book's `Qwen3Model` names.

    Tied checkpoints have no `lm_head.weight`; the book's `out_head` then gets
    the embedding. `tie_word_embeddings=None` infers tying from the keys;
    with `cfg` the shapes are checked as well.
    """
    sd = {k: v for k, v in sd.items() if not k.endswith(_HF_IGNORED_SUFFIXES)}
    has_head = "lm_head.weight" in sd
    tied = (not has_head) if tie_word_embeddings is None else tie_word_embeddings
    if not tied and not has_head:
        raise TyingError(
            "Missing 'lm_head.weight' and tie_word_embeddings=False; if the "
            "checkpoint ties its output head to the embedding (as Qwen3-0.6B "
            "does), pass tie_word_embeddings=True."
        )
    out = _rename_all(sd, hf_key_to_book, "Hugging Face Qwen3")
    if tied:
        if "tok_emb.weight" not in out:
            raise ValueError(
                "Missing key(s) in the Hugging Face state dict: "
                "'model.embed_tokens.weight'."
            )
        if has_head and not torch.equal(out["out_head.weight"], out["tok_emb.weight"]):
            raise TyingError(
                "tie_word_embeddings=True, but the checkpoint has an "
                "lm_head.weight that differs from the embedding; pass "
                "tie_word_embeddings=False to use it."
            )
        out["out_head.weight"] = out["tok_emb.weight"]
    _check_complete(out, "the Hugging Face state dict (shown with book names)")
    if cfg is not None:
        check_state_dict_shapes(out, cfg)
    return out


def check_cfg(cfg: Mapping[str, Any]) -> None:
    """Raise ValueError unless `cfg` has every key of the book's config."""
    missing = [k for k in _CFG_KEYS if k not in cfg]
    if missing:
        raise ValueError(
            f"cfg is missing {missing}; use a dict like "
            f"reasoning_from_scratch.qwen3.QWEN_CONFIG_06_B."
        )


def check_state_dict_shapes(
    book_sd: Mapping[str, torch.Tensor], cfg: Mapping[str, Any]
) -> None:
    """Raise a ValueError naming every key whose presence or shape does not
    match `Qwen3Model(cfg)` (the project's one check, `utils.models`)."""
    from utils.models import shape_problems, summarize_problems

    check_cfg(cfg)
    problems = shape_problems(book_sd, cfg)
    if problems:
        raise ValueError(
            f"State dict does not fit Qwen3Model(cfg): "
            f"{summarize_problems(problems, shown=6)}. Check that cfg describes "
            "the checkpoint (emb_dim, n_layers, vocab_size, ...)."
        )


# --------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------


def _rope_theta(hf: Mapping[str, Any]) -> float:
    """rope_theta from a transformers 4.x (`rope_theta` + `rope_scaling`) or
    5.x (`rope_parameters`) config; only plain RoPE is supported."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for p in (params, scaling):
        kind = p.get("rope_type", p.get("type", "default"))
        if kind != "default":
            raise ValueError(
                f"RoPE type {kind!r} (e.g. YaRN) is not supported by the book's "
                f"Qwen3Model, which uses plain RoPE; remove the scaling from "
                f"config.json or pass your own cfg."
            )
    theta = params.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise ValueError("config.json has no rope_theta (nor rope_parameters).")
    return float(theta)


def book_config_from_hf(
    hf_config: Mapping[str, Any], dtype: torch.dtype = torch.bfloat16
) -> dict[str, Any]:
    """The book's cfg dict for a Hugging Face Qwen3 `config.json` (as a dict).

    Raises ValueError for settings the book's model cannot reproduce.
    """
    hf = dict(hf_config)
    model_type = hf.get("model_type", "qwen3")
    if model_type != "qwen3":
        raise ValueError(
            f"model_type is {model_type!r}; only dense 'qwen3' checkpoints map "
            f"onto the book's Qwen3Model."
        )
    unsupported = {
        "hidden_act": ("silu", hf.get("hidden_act", "silu")),
        "attention_bias": (False, bool(hf.get("attention_bias", False))),
        "use_sliding_window": (False, bool(hf.get("use_sliding_window", False))),
        "rms_norm_eps": (1e-6, float(hf.get("rms_norm_eps", 1e-6))),
    }
    for name, (want, got) in unsupported.items():
        if got != want:
            raise ValueError(
                f"config.json has {name}={got!r}; the book's Qwen3Model "
                f"supports only {name}={want!r}."
            )
    try:
        n_heads = int(hf["num_attention_heads"])
        emb_dim = int(hf["hidden_size"])
        cfg = {
            "vocab_size": int(hf["vocab_size"]),
            "context_length": int(hf["max_position_embeddings"]),
            "emb_dim": emb_dim,
            "n_heads": n_heads,
            "n_layers": int(hf["num_hidden_layers"]),
            "hidden_dim": int(hf["intermediate_size"]),
            "head_dim": int(hf.get("head_dim") or emb_dim // n_heads),
            "qk_norm": True,  # every Qwen3 layer normalises queries and keys
            "n_kv_groups": int(hf.get("num_key_value_heads") or n_heads),
            "rope_base": _rope_theta(hf),
            "dtype": dtype,
        }
    except KeyError as exc:
        raise ValueError(
            f"config.json lacks {exc.args[0]!r}; is it a Qwen3 config?"
        ) from None
    return cfg


def hf_config_from_book(
    cfg: Mapping[str, Any],
    *,
    tie_word_embeddings: bool,
    dtype: torch.dtype | None = None,
    bos_token_id: int | None = ENDOFTEXT_ID,
    eos_token_id: int | list[int] | None = ENDOFTEXT_ID,
) -> dict[str, Any]:
    """A Hugging Face `config.json` dict (Qwen3ForCausalLM) for the book's cfg.

    Both the transformers 4.x (`rope_theta`, `torch_dtype`) and 5.x
    (`rope_parameters`, `dtype`) spellings are written, so either loads it.
    """
    check_cfg(cfg)
    if not cfg["qk_norm"]:
        raise ValueError(
            "Hugging Face Qwen3 always uses QK-norm; a cfg with qk_norm=False "
            "has no Qwen3ForCausalLM equivalent."
        )
    eos_ids = eos_token_id if isinstance(eos_token_id, list) else [eos_token_id]
    for name, ids in (("bos_token_id", [bos_token_id]), ("eos_token_id", eos_ids)):
        for i in ids:
            if i is not None and not 0 <= i < cfg["vocab_size"]:
                raise ValueError(
                    f"{name}={i} lies outside the vocabulary "
                    f"(vocab_size={cfg['vocab_size']}); pass {name}=None or "
                    f"an id of this model."
                )
    dtype_name = str(dtype or cfg["dtype"]).removeprefix("torch.")
    head_dim = cfg["head_dim"] or cfg["emb_dim"] // cfg["n_heads"]
    theta = float(cfg["rope_base"])
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["emb_dim"],
        "intermediate_size": cfg["hidden_dim"],
        "num_hidden_layers": cfg["n_layers"],
        "num_attention_heads": cfg["n_heads"],
        "num_key_value_heads": cfg["n_kv_groups"],
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg["context_length"],
        "rms_norm_eps": 1e-6,
        "rope_theta": theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg["n_layers"],
        "initializer_range": 0.02,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "use_cache": True,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
    }
