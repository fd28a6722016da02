"""See what the tokenizer and the model do, token by token (no widgets here).

`token_spans` splits a text into the tokens the Qwen3 tokenizer produces and
keeps each token's raw bytes. Byte-level BPE can cut a multi-byte UTF-8
character (a Chinese character, an emoji) across two tokens; decoding such a
token on its own gives a replacement character, so the pieces here show the
undecodable bytes honestly as escapes such as ``\\xe4\\xbd`` instead.
(`utils.streaming` applies the same idea to streamed generation.)

`top_k_next_tokens` and `append_next_token` show the model's next-token
distribution and take one greedy (or hand-picked) step; `plot_top_k` draws it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from utils.device import model_device
from utils.language import in_language
from utils.qwen3_tokenizer import unicode_to_byte

# --------------------------------------------------------------------------
# Token ids -> raw bytes
# --------------------------------------------------------------------------


def unknown_piece(token_id: int) -> str:
    """How an id outside the tokenizer's vocabulary is shown: ``<unk:ID>``."""
    return f"<unk:{int(token_id)}>"


def _backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` behind the book's `Qwen3Tokenizer` (or itself)."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    inner = getattr(tokenizer, "_tok", None)
    if isinstance(inner, Tokenizer):
        return inner
    raise TypeError(
        "Expected the book's Qwen3Tokenizer or a tokenizers.Tokenizer, got "
        f"{type(tokenizer).__name__}."
    )


class TokenBytes:
    """Maps token ids to their raw bytes for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = _backend(tokenizer)
        self._added = {
            int(i): t.content for i, t in self._tok.get_added_tokens_decoder().items()
        }
        self._cache: dict[int, bytes] = {}

    def is_added(self, token_id: int) -> bool:
        """Added tokens (<|im_start|>, <think>, ...) are matched whole, not BPE."""
        return int(token_id) in self._added

    def get(self, token_id: int) -> bytes | None:
        """The token's bytes, or None for an id the tokenizer does not know."""
        token_id = int(token_id)
        raw = self._cache.get(token_id)
        if raw is None:
            if token_id in self._added:
                raw = self._added[token_id].encode("utf-8")
            else:
                piece = self._tok.id_to_token(token_id)
                if piece is None:
                    return None
                table = unicode_to_byte()
                raw = bytes(table[ch] for ch in piece)
            self._cache[token_id] = raw
        return raw

    def __call__(self, token_id: int) -> bytes:
        raw = self.get(token_id)
        if raw is None:
            raise ValueError(
                f"Token id {int(token_id)} is not in the tokenizer's vocabulary "
                f"(size {self._tok.get_vocab_size()})."
            )
        return raw


def show_bytes(raw: bytes) -> str:
    """Decode `raw` as UTF-8, writing bytes that are not a complete character
    as ``\\xNN`` escapes rather than replacement characters."""
    return raw.decode("utf-8", errors="backslashreplace")


# --------------------------------------------------------------------------
# Spans
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenSpan:
    """One token of a text: its id, raw bytes and where they sit in the text.

    `start`/`end` are byte offsets into the UTF-8 encoding of the (NFC
    normalised) text. `special` marks added control tokens such as
    ``<|im_start|>`` or ``<think>``, which are matched whole instead of
    being built from bytes.
    """

    index: int
    token_id: int
    raw: bytes
    start: int
    end: int
    special: bool

    @property
    def piece(self) -> str:
        """Printable text of the token; partial characters shown as escapes."""
        return show_bytes(self.raw)


def spans_from_ids(tokenizer: Any, token_ids: Sequence[int]) -> list[TokenSpan]:
    """Turn token ids into `TokenSpan` records with consecutive byte ranges."""
    to_bytes = TokenBytes(tokenizer)
    spans, pos = [], 0
    for index, token_id in enumerate(token_ids):
        raw = to_bytes(int(token_id))
        spans.append(
            TokenSpan(
                index=index,
                token_id=int(token_id),
                raw=raw,
                start=pos,
                end=pos + len(raw),
                special=to_bytes.is_added(int(token_id)),
            )
        )
        pos += len(raw)
    return spans


def _encode_plain(tokenizer: Any, text: str) -> list[int]:
    """Encode without a chat template, whatever the tokenizer's setting."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer.encode(text).ids
    try:
        return list(tokenizer.encode(text, chat_wrapped=False))
    except TypeError:  # a tokenizer without the book's chat switch
        return list(tokenizer.encode(text))


def token_spans(tokenizer: Any, text: str) -> list[TokenSpan]:
    """Tokenize `text` and return one `TokenSpan` per token, in order.

    The spans' bytes joined together give back the text (after the
    tokenizer's NFC normalisation), so each byte belongs to exactly one token.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    return spans_from_ids(tokenizer, _encode_plain(tokenizer, text))


def render_plain(spans: Sequence[TokenSpan]) -> str:
    """One line per token, ``<id> --> <piece>``, as the book prints them."""
    return "\n".join(f"{s.token_id} --> {s.piece}" for s in spans)


_PALETTE = (
    "#fde2e4",
    "#dbeafe",
    "#dcfce7",
    "#fef3c7",
    "#ede9fe",
    "#ccfbf1",
    "#fce7f3",
    "#e0e7ff",
)


def _visible(piece: str) -> str:
    """HTML for a piece with spaces, tabs and newlines made visible."""
    shown = piece.replace(" ", "\u00b7").replace("\t", "\u2192").replace("\n", "\u21b5")
    return html.escape(shown) or "&#8203;"


def render_html(spans: Sequence[TokenSpan], show_ids: bool = True) -> str:
    """Coloured token boxes (piece above, id below) with a token count.

    Spaces show as ``·`` and newlines as ``↵``; special tokens get a dashed
    border; hovering a box shows its byte range and raw bytes. The count is
    in the notebook's language (`utils.language`).
    """
    boxes = []
    for s in spans:
        color = _PALETTE[s.index % len(_PALETTE)]
        border = "1px dashed #555" if s.special else "1px solid #bbb"
        title = html.escape(f"id {s.token_id}, bytes {s.start}-{s.end}: {s.raw!r}")
        id_line = (
            f'<div style="font-size:70%;color:#555">{s.token_id}</div>'
            if show_ids
            else ""
        )
        boxes.append(
            f'<span title="{title}" style="display:inline-block;margin:1px;'
            f"padding:1px 3px;background:{color};border:{border};"
            f'border-radius:3px;text-align:center;vertical-align:top">'
            f'<div style="font-family:monospace;white-space:pre">'
            f"{_visible(s.piece)}</div>{id_line}</span>"
        )
    count = len(spans)
    tokens = (
        in_language("1 token") if count == 1 else in_language("{n} tokens", n=count)
    )
    header = f"<div><b>{tokens}</b></div>"
    return f'<div class="token-view">{header}<div>{"".join(boxes)}</div></div>'


# --------------------------------------------------------------------------
# Next-token distribution
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TopK:
    """The `k` most likely next tokens, most likely first."""

    ids: list[int]
    pieces: list[str]
    probs: list[float]

    def rows(self) -> list[tuple[int, str, float]]:
        return list(zip(self.ids, self.pieces, self.probs, strict=True))


def _as_ids(token_ids: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(token_ids, torch.Tensor):
        if token_ids.ndim == 2 and token_ids.shape[0] == 1:
            token_ids = token_ids[0]
        if token_ids.ndim != 1:
            raise ValueError(
                f"token_ids must be 1-D or (1, n), got shape {tuple(token_ids.shape)}"
            )
        token_ids = token_ids.tolist()
    ids = [int(i) for i in token_ids]
    if not ids:
        raise ValueError("token_ids is empty: encode a prompt of at least one token.")
    return ids


@torch.inference_mode()
def next_token_probs(
    model: torch.nn.Module, token_ids: Sequence[int] | torch.Tensor
) -> torch.Tensor:
    """Float32 softmax over the vocabulary for the token after `token_ids`."""
    ids = _as_ids(token_ids)
    model.eval()
    x = torch.tensor([ids], device=model_device(model))
    logits = model(x)[0, -1]  # (vocab_size,)
    return torch.softmax(logits.float(), dim=-1).cpu()


def top_k_next_tokens(
    model: torch.nn.Module,
    tokenizer: Any,
    token_ids: Sequence[int] | torch.Tensor,
    k: int = 10,
) -> TopK:
    """The `k` most likely next tokens after `token_ids`, with their ids,
    printable pieces and probabilities (softmax computed in float32)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    probs = next_token_probs(model, token_ids)
    values, indices = torch.topk(probs, min(k, probs.numel()))
    to_bytes = TokenBytes(tokenizer)
    ids = [int(i) for i in indices]
    raws = [to_bytes.get(i) for i in ids]
    return TopK(
        ids=ids,
        pieces=[
            unknown_piece(i) if raw is None else show_bytes(raw)
            for i, raw in zip(ids, raws, strict=True)
        ],
        probs=[float(v) for v in values],
    )


def append_next_token(
    model: torch.nn.Module,
    token_ids: Sequence[int] | torch.Tensor,
    token_id: int | None = None,
) -> list[int]:
    """A new id list with one more token: `token_id` if given, else the
    model's most likely next token (a greedy step, as in the book)."""
    ids = _as_ids(token_ids)
    if token_id is None:
        token_id = int(torch.argmax(next_token_probs(model, ids)))
    return [*ids, int(token_id)]


def plot_top_k(topk: TopK, title: str | None = None, ax: Any = None) -> Any:
    """Horizontal bar chart of a `TopK` (most likely on top); returns the
    figure. The pieces are labelled as notebook 03's own chart labels them
    (`utils.plotting.chart_label`: the characters themselves, CJK included),
    the title and axis in the notebook's language. Uses matplotlib's object
    API, so nothing is shown or kept open."""
    from matplotlib.figure import Figure

    from utils.plotting import chart_label, chart_text

    # the labels first: they add the CJK fallback font the figure's text takes
    labels = [
        f"{chart_label(p)}  ({i})" for i, p in zip(topk.ids, topk.pieces, strict=True)
    ]
    title = title or chart_text("Top {k} next tokens", k=len(topk.ids))
    xlabel = chart_text("probability")
    if ax is None:
        fig = Figure(figsize=(6, 0.35 * len(topk.ids) + 1.2), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    y = list(range(len(labels)))[::-1]
    bars = ax.barh(y, topk.probs, color="#4c78a8")
    ax.set_yticks(y, labels)
    ax.bar_label(bars, labels=[f"{p:.3f}" for p in topk.probs], padding=2)
    ax.set_xlim(0, min(1.0, max(topk.probs, default=0.0) * 1.25 + 1e-9))
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return fig


def figure_png(fig: Any) -> bytes:
    """PNG bytes of a matplotlib figure (for widgets and plain displays)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()
