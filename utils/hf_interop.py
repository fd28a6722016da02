"""Move Qwen3 weights between the book's `Qwen3Model` and Hugging Face.

The book names its parameters after the concepts of Chapter 2 (`tok_emb`,
`trf_blocks.0.att.W_query`, `ff.fc1`, ...); Hugging Face `transformers` uses
its own names (`model.embed_tokens`, `model.layers.0.self_attn.q_proj`,
`mlp.gate_proj`, ...). The tensors themselves are identical, so converting
is a pure renaming plus the tied output head:

* `load_hf_checkpoint` reads an official `Qwen/Qwen3-0.6B(-Base)` folder
  (downloaded from Hugging Face or ModelScope) into the book's format, so
  `Qwen3Model(cfg).load_state_dict(sd)` works.
* `import_qwen3` (command line: `python -m utils.hf_interop import-qwen3
  PATH --kind base`) turns such a folder into the book's verified
  `qwen3-0.6B-<kind>.pth` and `tokenizer-<kind>.json`.
* `export_hf_folder` writes book-format weights as a Hugging Face folder
  that `transformers`, vLLM and SGLang load directly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from utils.errors import CommandParser, UsageError, first_line, run_command
from utils.qwen3_tokenizer import ENDOFTEXT_ID, IM_END_ID

if TYPE_CHECKING:
    from utils.download import Qwen3Files


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

_ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
]


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


def _check_cfg(cfg: Mapping[str, Any]) -> None:
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

    _check_cfg(cfg)
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
    _check_cfg(cfg)
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


# --------------------------------------------------------------------------
# Loading official checkpoints
# --------------------------------------------------------------------------


def _read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; ValueError naming the file otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}).") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{path} holds a JSON {type(data).__name__}, not an object; it is "
            "not a Hugging Face file: download it again."
        )
    return data


def _read_safetensors(file: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file in `dtype`; ValueError naming the
    file when it is truncated or damaged."""
    out = {}
    try:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                out[key] = f.get_tensor(key).to(dtype)
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError, ...
        raise ValueError(
            f"{file} is not a complete safetensors file ({first_line(exc, 140)}); the "
            "download is damaged or incomplete: fetch it again."
        ) from None
    return out


def _find_weight_files(path: Path) -> tuple[Path, list[Path]]:
    """(folder holding config.json, safetensors files) for a folder, a
    `.safetensors` file or a `model.safetensors.index.json`."""
    if path.is_file() and path.name.endswith(".safetensors"):
        return path.parent, [path]
    if path.is_file() and path.name.endswith(".index.json"):
        index = path
        folder = path.parent
    elif path.is_dir():
        folder = path
        single = folder / "model.safetensors"
        if single.is_file():
            return folder, [single]
        index = folder / "model.safetensors.index.json"
        if not index.is_file():
            found = sorted(p.name for p in folder.iterdir())[:10]
            raise FileNotFoundError(
                f"No model.safetensors or model.safetensors.index.json in "
                f"{folder} (found: {found}). Download the Hugging Face files "
                f"(config.json and *.safetensors), e.g. from Qwen/Qwen3-0.6B-Base. "
                f"The book's .pth files load directly with torch.load."
            )
    else:
        raise FileNotFoundError(
            f"{path} does not exist or is not a folder / .safetensors / "
            f"index.json file."
        )
    weight_map = _read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index} has no weight_map; download it again.")
    files = [folder / name for name in dict.fromkeys(weight_map.values())]
    absent = [f.name for f in files if not f.is_file()]
    if absent:
        raise FileNotFoundError(
            f"{index.name} lists shard(s) that are missing: {absent}; the "
            f"download is incomplete, fetch them again."
        )
    return folder, files


def load_hf_checkpoint(
    path_or_dir: str | os.PathLike,
    cfg: Mapping[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a Hugging Face Qwen3 checkpoint into the book's format.

    Returns `(state_dict, cfg)` such that `Qwen3Model(cfg).load_state_dict(sd)`
    works. Without `cfg` it is derived from the folder's config.json. Tensors
    are cast to `dtype` (default: `cfg["dtype"]`, else bfloat16).
    """
    folder, files = _find_weight_files(Path(path_or_dir))
    hf_config: dict[str, Any] = {}
    config_path = folder / "config.json"
    if config_path.is_file():
        hf_config = _read_json_object(config_path)
    if cfg is None:
        if not hf_config:
            raise FileNotFoundError(
                f"No config.json next to the weights in {folder}; download it "
                f"too, or pass cfg=... explicitly."
            )
        cfg = book_config_from_hf(hf_config, dtype or torch.bfloat16)
    else:
        _check_cfg(cfg)
        cfg = dict(cfg)
    if dtype is not None:
        cfg["dtype"] = dtype

    hf_sd: dict[str, torch.Tensor] = {}
    for file in files:
        hf_sd.update(_read_safetensors(file, cfg["dtype"]))
    tie = hf_config.get("tie_word_embeddings")
    sd = hf_to_book_state_dict(
        hf_sd, tie_word_embeddings=None if tie is None else bool(tie), cfg=cfg
    )
    return sd, cfg


def download_official_qwen3(
    repo_id: str = "Qwen/Qwen3-0.6B-Base",
    out_dir: str | os.PathLike | None = None,
    *,
    revision: str | None = None,
) -> Path:
    """Download an official Qwen3 repo's config, weights and tokenizer files.

    Honours `HF_ENDPOINT` (e.g. a mirror) as set at call time. Returns the
    folder, ready for `load_hf_checkpoint`. Needs internet.
    """
    from huggingface_hub import snapshot_download

    if out_dir is None:
        out_dir = Path("qwen3") / repo_id.split("/")[-1]
    endpoint = os.environ.get("HF_ENDPOINT") or None
    folder = snapshot_download(
        repo_id,
        revision=revision,
        local_dir=str(out_dir),
        allow_patterns=_ALLOW_PATTERNS,
        endpoint=endpoint.rstrip("/") if endpoint else None,
    )
    return Path(folder)


# --------------------------------------------------------------------------
# Exporting book weights as a Hugging Face folder
# --------------------------------------------------------------------------


def _tokenizer_config(tokenizer_file: Path, eos_token_id, context_length: int):
    """A `tokenizer_config.json` for the Qwen3 tokenizer.json, so
    `AutoTokenizer.from_pretrained` needs no network."""
    data = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    id_to_token = {t["id"]: t["content"] for t in data.get("added_tokens", [])}
    eos_first = eos_token_id[0] if isinstance(eos_token_id, list) else eos_token_id
    eos_id = ENDOFTEXT_ID if eos_first is None else eos_first
    if eos_id not in id_to_token or ENDOFTEXT_ID not in id_to_token:
        raise ValueError(
            f"{tokenizer_file} has no added token with id {eos_id} (or "
            f"{ENDOFTEXT_ID}); pass the Qwen3 tokenizer.json."
        )
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": id_to_token[eos_id],
        "pad_token": id_to_token[ENDOFTEXT_ID],
        "unk_token": None,
        "add_prefix_space": False,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": context_length,
    }


def _tokenizer_max_id(tokenizer_file: Path) -> int:
    data = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    ids = list(data.get("model", {}).get("vocab", {}).values())
    ids += [t["id"] for t in data.get("added_tokens", [])]
    return max(ids, default=-1)


def export_hf_folder(
    model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
    cfg: Mapping[str, Any],
    out_dir: str | os.PathLike,
    tokenizer_file: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype | None = None,
    bos_token_id: int | None = ENDOFTEXT_ID,
    eos_token_id: int | list[int] | None = ENDOFTEXT_ID,
    overwrite: bool = False,
) -> Path:
    """Write book-format Qwen3 weights as a Hugging Face model folder.

    The folder (config.json, model.safetensors, generation_config.json and,
    given `tokenizer_file`, tokenizer.json + tokenizer_config.json) loads
    with `AutoModelForCausalLM`/`AutoTokenizer.from_pretrained` and serves
    with vLLM or SGLang. The output head is tied (stored once) exactly when
    it equals the embedding. Use `eos_token_id=151645` for the reasoning
    model. The folder appears atomically: a failure leaves nothing behind.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        if not overwrite:
            raise FileExistsError(
                f"{out_dir} already exists and is not empty; choose a new "
                f"folder or pass overwrite=True."
            )
    if isinstance(model_or_state_dict, torch.nn.Module):
        sd = model_or_state_dict.state_dict()
    else:
        sd = dict(model_or_state_dict)
    tok_path = None if tokenizer_file is None else Path(tokenizer_file)
    if tok_path is not None and not tok_path.is_file():
        raise FileNotFoundError(f"tokenizer_file {tok_path} does not exist.")
    check_state_dict_shapes(sd, cfg)
    dtype = dtype or cfg["dtype"]
    tied = sd["out_head.weight"].dtype == sd["tok_emb.weight"].dtype and bool(
        torch.equal(sd["out_head.weight"], sd["tok_emb.weight"])
    )
    files: dict[str, Any] = {
        "config.json": hf_config_from_book(
            cfg, tie_word_embeddings=tied, dtype=dtype,
            bos_token_id=bos_token_id, eos_token_id=eos_token_id,
        ),
        "generation_config.json": {
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "pad_token_id": ENDOFTEXT_ID if ENDOFTEXT_ID < cfg["vocab_size"] else None,
        },
    }  # fmt: skip
    if tok_path is not None:
        files["tokenizer_config.json"] = _checked_tokenizer_config(
            tok_path, eos_token_id, cfg
        )
    hf_sd = book_to_hf_state_dict(sd, tie_word_embeddings=tied)
    # Own, contiguous copies on the CPU: safetensors refuses shared storage.
    hf_sd = {
        k: v.detach().to(device="cpu", dtype=dtype).contiguous().clone()
        for k, v in hf_sd.items()
    }
    _write_folder(out_dir, files, hf_sd, tok_path)
    return out_dir


def _checked_tokenizer_config(
    tok_path: Path, eos_token_id: Any, cfg: Mapping[str, Any]
) -> dict[str, Any]:
    max_id = _tokenizer_max_id(tok_path)
    if max_id >= cfg["vocab_size"]:
        raise ValueError(
            f"{tok_path} has token ids up to {max_id}, beyond the model's "
            f"vocab_size={cfg['vocab_size']}; it is not this model's tokenizer."
        )
    return _tokenizer_config(tok_path, eos_token_id, cfg["context_length"])


def _write_folder(
    out_dir: Path,
    json_files: Mapping[str, Any],
    hf_sd: dict[str, torch.Tensor],
    tok_path: Path | None,
) -> None:
    """Write everything into a temporary folder beside `out_dir`, then put
    it in place in one rename (a failure leaves nothing behind)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        for name, data in json_files.items():
            (tmp / name).write_text(json.dumps(data, indent=2) + "\n")
        save_file(hf_sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tok_path is not None:
            shutil.copyfile(tok_path, tmp / "tokenizer.json")
        os.chmod(tmp, 0o755)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(src: Path, dest: Path) -> None:
    """Move the finished folder `src` to `dest`, replacing what is there."""
    if not dest.exists():
        os.replace(src, dest)
        return
    if dest.is_dir() and not any(dest.iterdir()):
        dest.rmdir()
        os.replace(src, dest)
        return
    old = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old."))
    old.rmdir()
    os.replace(dest, old)
    try:
        os.replace(src, dest)
    except BaseException:
        os.replace(old, dest)  # put the previous export back
        raise
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)


# --------------------------------------------------------------------------
# Importing an official Qwen3 folder as the book's files
# --------------------------------------------------------------------------

# The end-of-sequence id each kind's config.json names (base / chat model).
_KIND_EOS = {"base": ENDOFTEXT_ID, "reasoning": IM_END_ID}


def _config_eos_ids(hf_config: Mapping[str, Any]) -> set[int]:
    eos = hf_config.get("eos_token_id")
    if eos is None:
        return set()
    return {int(i) for i in (eos if isinstance(eos, list) else [eos])}


def _check_kind(hf_config: Mapping[str, Any], kind: str, folder: Path) -> None:
    """Refuse a base folder imported as "reasoning" and vice versa."""
    eos = _config_eos_ids(hf_config) & set(_KIND_EOS.values())
    if not eos or _KIND_EOS[kind] in eos:
        return
    other = next(k for k, v in _KIND_EOS.items() if v in eos)
    raise ValueError(
        f"{folder} looks like the {other} model (config.json has "
        f"eos_token_id={hf_config['eos_token_id']}), not {kind!r}: Qwen3-0.6B-Base "
        f"is --kind base, Qwen3-0.6B is --kind reasoning."
    )


def _check_tokenizer(path: Path) -> None:
    """A Qwen3 tokenizer.json has <|endoftext|> and <|im_end|> at fixed ids."""
    if not path.is_file():
        raise FileNotFoundError(
            f"No tokenizer.json in {path.parent}; download it together with "
            f"config.json and the *.safetensors files."
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        added = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{path} is not a tokenizer.json file ({exc}).") from None
    want = {"<|endoftext|>": ENDOFTEXT_ID, "<|im_end|>": IM_END_ID}
    if any(added.get(tok) != i for tok, i in want.items()):
        raise ValueError(
            f"{path} is not the Qwen3 tokenizer (it lacks <|endoftext|>={ENDOFTEXT_ID}"
            f" and <|im_end|>={IM_END_ID}); use the folder of Qwen/Qwen3-0.6B-Base "
            f"or Qwen/Qwen3-0.6B."
        )


def import_qwen3(
    src: str | os.PathLike,
    kind: str,
    out_dir: str | os.PathLike = "qwen3",
    *,
    require_06b: bool = True,
) -> Qwen3Files:
    """Turn an official Qwen3 folder into the book's verified files.

    `src` holds config.json, tokenizer.json and the safetensors weights (as
    downloaded from Hugging Face or ModelScope). Writes `qwen3-0.6B-<kind>.pth`
    (bfloat16, the book's key names) and `tokenizer-<kind>.json` to `out_dir`
    with the verification record `download_qwen3_small` accepts, so the
    notebooks use them without a download. Every input is read and checked
    before anything is written; a failure leaves `out_dir` as it was.
    Returns `utils.download.Qwen3Files`.
    """
    from utils import download

    tok_name, model_name = download.file_names(kind)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out-dir {out} is a file, not a folder; name a folder.")
    folder, sd = _read_official_folder(Path(src), kind, require_06b)
    out.mkdir(parents=True, exist_ok=True)
    source = f"import-qwen3 from {folder.resolve()}"
    check = "converted from the official safetensors"
    staged: list[Path] = []
    try:
        for name in (model_name, tok_name):
            fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".part")
            os.close(fd)
            staged.append(Path(tmp))
        model_tmp, tok_tmp = staged
        torch.save(sd, model_tmp)
        shutil.copyfile(folder / "tokenizer.json", tok_tmp)
        for tmp, name in ((model_tmp, model_name), (tok_tmp, tok_name)):
            download.install_file(tmp, out / name, source, check)
    finally:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
    return download.Qwen3Files(
        tokenizer=out / tok_name, model=out / model_name, standin=False
    )


def _read_official_folder(
    src: Path, kind: str, require_06b: bool
) -> tuple[Path, dict[str, torch.Tensor]]:
    """(folder, book state dict in bf16) of an official Qwen3 folder, after
    checking its config, tokenizer and weights; writes nothing."""
    folder, _ = _find_weight_files(src)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"No config.json in {folder}; download it together with the weights."
        )
    hf_config = _read_json_object(config_path)
    _check_kind(hf_config, kind, folder)
    _check_tokenizer(folder / "tokenizer.json")
    try:
        sd, cfg = load_hf_checkpoint(folder, dtype=torch.bfloat16)
    except TyingError:
        raise ValueError(
            f"{config_path} says tie_word_embeddings="
            f"{hf_config.get('tie_word_embeddings')}, which its weights "
            "contradict (lm_head.weight missing or not the embedding): the "
            "folder mixes files of different models; download it again."
        ) from None
    if require_06b:
        from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B

        if cfg != QWEN_CONFIG_06_B:
            diff = sorted(k for k in cfg if cfg[k] != QWEN_CONFIG_06_B.get(k))
            raise ValueError(
                f"{folder} is not Qwen3-0.6B (differs in {diff}); the notebooks "
                f"build the 0.6B model. Use Qwen/Qwen3-0.6B-Base or Qwen/Qwen3-0.6B."
            )
    return folder, sd


PROG = "python -m utils.hf_interop"


def build_parser() -> CommandParser:
    """`import-qwen3 PATH --kind base|reasoning [--out-dir DIR]`."""
    parser = CommandParser(
        prog=PROG,
        description="Convert between official Qwen3 checkpoints and the book's files.",
        epilog=None,
    )
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=CommandParser
    )
    imp = sub.add_parser(
        "import-qwen3",
        help="official Qwen3-0.6B(-Base) folder -> the book's .pth + tokenizer",
        description=(
            "Convert a folder downloaded from Hugging Face or ModelScope "
            "(config.json, tokenizer.json, *.safetensors) into the book's "
            "qwen3-0.6B-<kind>.pth and tokenizer-<kind>.json, with the "
            "verification record the notebooks' download accepts."
        ),
        epilog="Example: uv run python -m utils.hf_interop import-qwen3 "
        "Qwen3-0.6B-Base --kind base --out-dir ch02/01_main-chapter-code/qwen3",
    )
    imp.add_argument("path", help="folder with config.json, tokenizer.json, weights")
    imp.add_argument(
        "--kind",
        required=True,
        choices=["base", "reasoning"],
        help="base for Qwen3-0.6B-Base, reasoning for Qwen3-0.6B",
    )
    imp.add_argument(
        "--out-dir", default="qwen3", help="where the book's files go (the "
        "notebooks read the qwen3/ folder next to them)"
    )  # fmt: skip
    return parser


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        files = import_qwen3(args.path, args.kind, args.out_dir)
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    for path in files:
        print(f"Wrote {path} ({path.stat().st_size / 1e6:.1f} MB), verified")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: `python -m utils.hf_interop import-qwen3 PATH --kind base`;
    exit status 2 after one line for a bad folder or option."""
    return run_command(PROG, lambda: _main(argv))


if __name__ == "__main__":
    raise SystemExit(main())
