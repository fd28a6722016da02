"""Rebuild the exact Qwen3 tokenizer offline, as a Hugging Face `tokenizer.json`.

Qwen publishes its byte-level BPE vocabulary in tiktoken form: one
`base64(token) rank` per line, with no merge list. The `dashscope` wheel (a dev
dependency) ships that file. A Hugging Face BPE model needs merges, so we
recover them: replaying BPE on each token with only lower-ranked merges ends in
two pieces, and joining those two pieces is the merge that makes the token.
Ordering the merges by the rank of the token they make gives the same
segmentation as tiktoken's "merge the lowest-ranked pair first" rule.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

# The pre-tokenizer regex of Qwen2/2.5/3 (split before BPE).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

NUM_BPE_TOKENS = 151_643  # ids 0..151642 come from the ranks file

# Added tokens 151643.. in id order; the first 14 are special (skipped by
# `decode(skip_special_tokens=True)`), the rest are ordinary added words.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
NON_SPECIAL_ADDED_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

# Ids of the control tokens the code needs (positions in the tuple above)
ENDOFTEXT_ID = NUM_BPE_TOKENS + SPECIAL_TOKENS.index("<|endoftext|>")  # 151643
IM_START_ID = NUM_BPE_TOKENS + SPECIAL_TOKENS.index("<|im_start|>")  # 151644
IM_END_ID = NUM_BPE_TOKENS + SPECIAL_TOKENS.index("<|im_end|>")  # 151645
# Ids the tokenizer knows (151669); the model's output head has more rows
# (151936), so a model can produce an id no tokenizer can decode.
TOKENIZER_VOCAB_SIZE = (
    NUM_BPE_TOKENS + len(SPECIAL_TOKENS) + len(NON_SPECIAL_ADDED_TOKENS)
)

_INSTALL_HINT = (
    "Install the dev dependencies (`uv sync`, or `pip install dashscope==1.19.3`): "
    "the dashscope wheel ships the Qwen BPE ranks file `qwen.tiktoken`."
)


def added_tokens() -> dict[str, int]:
    """The 26 added tokens of Qwen3 mapped to their ids (151643-151668)."""
    names = SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS
    return {name: NUM_BPE_TOKENS + i for i, name in enumerate(names)}


def qwen_ranks_path() -> Path:
    """Locate `dashscope/resources/qwen.tiktoken` without importing dashscope
    (its import pulls in network clients we do not need)."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The Qwen BPE ranks are missing: package `dashscope` is not installed. "
            + _INSTALL_HINT
        )
    for root in spec.submodule_search_locations:
        path = Path(root) / "resources" / "qwen.tiktoken"
        if path.is_file():
            return path
    raise FileNotFoundError(
        "The installed `dashscope` has no resources/qwen.tiktoken. " + _INSTALL_HINT
    )


def load_qwen_ranks(path: str | Path | None = None) -> dict[bytes, int]:
    """Read a tiktoken ranks file (`base64-token rank` per line) into a dict."""
    path = Path(path) if path is not None else qwen_ranks_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"Qwen BPE ranks file not found: {path}. {_INSTALL_HINT}"
        )
    ranks: dict[bytes, int] = {}
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError as err:
                raise ValueError(
                    f"{path}:{lineno}: expected `base64-token rank`, got {line!r}"
                ) from err
    return ranks


def _last_merge(
    token: bytes, rank: int, ranks: dict[bytes, int]
) -> tuple[bytes, bytes]:
    """Replay BPE on `token` using only merges ranked below `rank`; the two
    pieces left over form the merge that creates `token`."""
    get = ranks.get
    parts = [token[i : i + 1] for i in range(len(token))]
    # pair_ranks[i]: rank of parts[i] + parts[i + 1], or `rank` if not allowed
    pair_ranks = [get(token[i : i + 2], rank) for i in range(len(token) - 1)]
    while len(parts) > 2:
        best = min(pair_ranks)
        if best >= rank:
            break
        i = pair_ranks.index(best)  # leftmost, as in BPE
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i < len(parts) - 1:
            pair_ranks[i] = get(parts[i] + parts[i + 1], rank)
        if i > 0:
            pair_ranks[i - 1] = get(parts[i - 1] + parts[i], rank)
    if len(parts) != 2 or max(ranks[parts[0]], ranks[parts[1]]) >= rank:
        raise ValueError(
            f"token {token!r} (rank {rank}) is not reachable by BPE from lower "
            "ranks; the ranks file is not a consistent BPE vocabulary"
        )
    return parts[0], parts[1]


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges implied by `ranks`, ordered by the rank of the token each
    merge makes (one merge per multi-byte token)."""
    for b in range(256):
        if bytes([b]) not in ranks:
            raise ValueError(f"ranks lack the single byte {bytes([b])!r}")
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            merges.append(_last_merge(token, rank, ranks))
    return merges


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the
    other 68 bytes map to code points from 256 on, so every string is visible."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@functools.lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    """The inverse of `byte_to_unicode`: a vocabulary character -> its byte."""
    return {char: b for b, char in byte_to_unicode().items()}


def build_qwen3_tokenizer_dict(ranks: dict[bytes, int] | None = None) -> dict[str, Any]:
    """The Qwen3 `tokenizer.json` content as a dict (ranks default to Qwen's)."""
    if ranks is None:
        ranks = load_qwen_ranks()
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("ranks must be the ids 0..N-1, each used exactly once")
    alphabet = byte_to_unicode()

    def visible(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    vocab = {visible(t): r for t, r in sorted(ranks.items(), key=lambda kv: kv[1])}
    merges = [[visible(a), visible(b)] for a, b in recover_merges(ranks)]
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(first_id=len(ranks)),
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN_PATTERN},
                    "behavior": "Isolated",
                    "invert": False,
                },
                byte_level,
            ],
        },
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": _bpe_model(vocab, merges),
    }


def _added_tokens(first_id: int) -> list[dict[str, Any]]:
    """The `added_tokens` entries: the special tokens, then the others."""
    specials = set(SPECIAL_TOKENS)
    return [
        {
            "id": first_id + i,
            "content": name,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": name in specials,
        }
        for i, name in enumerate(SPECIAL_TOKENS + NON_SPECIAL_ADDED_TOKENS)
    ]


def _bpe_model(vocab: dict[str, int], merges: list[list[str]]) -> dict[str, Any]:
    """The `model` entry: byte-level BPE with no unknown token, no dropout."""
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": "",
        "end_of_word_suffix": "",
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
        "vocab": vocab,
        "merges": merges,
    }


@functools.lru_cache(maxsize=1)
def build_qwen3_tokenizer_json() -> str:
    """The full Qwen3 `tokenizer.json` text, rebuilt from the dashscope ranks
    (once per process: the rebuild takes seconds and its result never changes)."""
    return json.dumps(build_qwen3_tokenizer_dict(), ensure_ascii=False)
