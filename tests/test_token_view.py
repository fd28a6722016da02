"""Token spans, byte-honest pieces, streaming decode and the top-k view."""

from __future__ import annotations

import unicodedata

import pytest
import torch

from tests._view_fixtures import load_tokenizer, standin_files
from utils.streaming import Utf8StreamDecoder, decode_bytes
from utils.token_view import (
    TopK,
    append_next_token,
    figure_png,
    plot_top_k,
    render_html,
    render_plain,
    spans_from_ids,
    token_spans,
    top_k_next_tokens,
)

TEXTS = [
    "Explain large language models.",
    "大型语言模型是什么？我们试一下。",
    "emoji 🤗 and family 👩‍👩‍👧 and flag 🇨🇭",
    "Café\tnaïve\r\n  spaces   \n\n",
    "e\u0301 decomposed",  # NFC turns this into a single é
    "<|im_start|>user\nHi<|im_end|>\n<think>\n\n</think>",
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base, _ = standin_files(tmp_path_factory, "base", tokenizer_only=True)
    reasoning, _ = standin_files(tmp_path_factory, "reasoning", tokenizer_only=True)
    return base, reasoning


@pytest.mark.parametrize("text", TEXTS)
def test_spans_cover_the_text_exactly(tok, text):
    spans = token_spans(tok, text)
    expected = unicodedata.normalize("NFC", text).encode("utf-8")
    assert b"".join(s.raw for s in spans) == expected
    assert [s.token_id for s in spans] == tok.encode(text)
    pos = 0
    for i, s in enumerate(spans):
        assert (s.index, s.start, s.end) == (i, pos, pos + len(s.raw))
        assert expected[s.start : s.end] == s.raw
        pos = s.end
    assert pos == len(expected)


def test_book_prompt_plain_rendering(tok):
    lines = render_plain(token_spans(tok, "Explain large language models.")).split("\n")
    # The book's listing: Ex / plain / large / language / models / .
    assert lines[0] == "840 --> Ex"
    assert lines[-1] == "13 --> ."
    assert [line.split(" --> ")[1] for line in lines] == [
        "Ex",
        "plain",
        " large",
        " language",
        " models",
        ".",
    ]


def test_pieces_match_decode_for_whole_characters(tok):
    for s in token_spans(tok, TEXTS[0] + " " + TEXTS[1]):
        decoded = tok.decode([s.token_id])
        if "\ufffd" in decoded:
            assert "\\x" in s.piece  # partial character: raw bytes instead
        else:
            assert s.piece == decoded


def test_split_multibyte_characters_show_raw_bytes(tok):
    # The family emoji is several code points joined by U+200D; byte-level
    # BPE cuts some of them across tokens.
    text = "👩‍👩‍👧"
    spans = token_spans(tok, text)
    partial = [s for s in spans if "\ufffd" in tok.decode([s.token_id])]
    assert partial, "expected at least one token holding part of a character"
    for s in partial:
        assert "\ufffd" not in s.piece
        assert "\\x" in s.piece
        # The escapes are exactly the token's bytes that do not decode
        assert s.piece == s.raw.decode("utf-8", errors="backslashreplace")
    # Joined, the bytes are the characters again
    assert b"".join(s.raw for s in spans).decode("utf-8") == text


def test_rare_chinese_character_split_across_tokens(tok):
    # A rare CJK character is not in the vocabulary as a whole
    text = "𠀋鿰"
    spans = token_spans(tok, text)
    assert len(spans) > 2
    assert any(len(s.raw) < 3 or "\\x" in s.piece for s in spans)
    assert b"".join(s.raw for s in spans) == text.encode()


def test_special_tokens_are_single_marked_spans(files):
    for path in files:  # base and reasoning tokenizer files
        tok = load_tokenizer(path)
        spans = token_spans(tok, "<|im_start|>user\nHi<|im_end|><think></think>")
        specials = [(s.token_id, s.piece) for s in spans if s.special]
        assert specials == [
            (151644, "<|im_start|>"),
            (151645, "<|im_end|>"),
            (151667, "<think>"),
            (151668, "</think>"),
        ]
        assert not any(s.special for s in spans if s.token_id < 151643)


def test_chat_template_tokenizer_still_spans_the_plain_text(files):
    tok = load_tokenizer(files[1], apply_chat_template=True, add_generation_prompt=True)
    spans = token_spans(tok, "Hi")
    assert b"".join(s.raw for s in spans) == b"Hi"


def test_token_spans_rejects_bytes(tok):
    with pytest.raises(TypeError, match="string"):
        token_spans(tok, b"hi")


def test_unknown_id_is_a_clear_error(tok):
    with pytest.raises(ValueError, match="not in the tokenizer"):
        spans_from_ids(tok, [10**7])


def test_html_rendering_has_boxes_ids_and_count(tok):
    spans = token_spans(tok, "a <xq>\n<|im_end|>")
    out = render_html(spans)
    assert f"{len(spans)} tokens" in out
    assert out.count('class="token-view"') == 1
    assert out.count("display:inline-block") == len(spans)
    for s in spans:
        assert f">{s.token_id}</div>" in out
    assert "<xq" not in out and "&lt;" in out  # user text is escaped
    assert "\u21b5" in out  # newline made visible
    assert "dashed" in out  # the special token is marked
    assert "1 token<" in render_html(spans[:1])


@pytest.mark.parametrize("text", TEXTS[1:4])
def test_stream_decoder_never_emits_replacement_characters(tok, text):
    dec = Utf8StreamDecoder(tok)
    chunks = [dec.feed(i) for i in tok.encode(text)]
    chunks.append(dec.flush())
    assert "".join(chunks) == unicodedata.normalize("NFC", text)
    assert not any("\ufffd" in c for c in chunks)


def test_stream_decoder_holds_partial_bytes_then_escapes_leftovers(tok):
    ids = [s.token_id for s in token_spans(tok, "👩‍👩‍👧")]
    dec = Utf8StreamDecoder(tok)
    first = dec.feed(ids[0])
    assert first in ("", "👩")  # never half a character
    # A stream that ends mid-character shows the dangling bytes as escapes
    cut = next(i for i in ids if "\ufffd" in tok.decode([i]))
    dec = Utf8StreamDecoder(tok)
    out = dec.feed(cut) + dec.flush()
    assert out.startswith(decode_bytes(tok, [cut])[:1]) and "\\x" in out
    assert "\ufffd" not in out


def test_top_k_sorted_and_matches_direct_softmax(tok, model):
    ids = tok.encode("Explain large language models.")
    top = top_k_next_tokens(model, tok, ids, k=10)
    assert isinstance(top, TopK) and len(top.ids) == len(top.probs) == 10
    assert top.probs == sorted(top.probs, reverse=True)
    assert 0 < sum(top.probs) <= 1 + 1e-6
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, -1].double()
    direct = torch.softmax(logits, dim=-1)
    ref_vals, ref_ids = torch.topk(direct, 10)
    assert top.ids == ref_ids.tolist()
    assert top.probs == pytest.approx(ref_vals.tolist(), rel=1e-4, abs=1e-7)
    assert top.pieces == [s.piece for s in spans_from_ids(tok, top.ids)]


def test_top_k_accepts_tensor_and_validates(tok, model):
    ids = tok.encode("Hello")
    a = top_k_next_tokens(model, tok, ids, k=3)
    b = top_k_next_tokens(model, tok, torch.tensor([ids]), k=3)
    assert a == b
    with pytest.raises(ValueError, match="k must be"):
        top_k_next_tokens(model, tok, ids, k=0)
    with pytest.raises(ValueError, match="empty"):
        top_k_next_tokens(model, tok, [], k=3)


def test_step_appends_argmax_or_chosen_token(tok, model):
    ids = tok.encode("Explain large language models.")
    top = top_k_next_tokens(model, tok, ids, k=5)
    greedy = append_next_token(model, ids)
    assert greedy == [*ids, top.ids[0]]
    assert append_next_token(model, ids, top.ids[3]) == [*ids, top.ids[3]]
    assert ids == tok.encode("Explain large language models.")  # not mutated
    # Greedy steps agree with the book's generator
    from utils.generation import generate_text_basic_stream

    seq = ids
    for _ in range(3):
        seq = append_next_token(model, seq)
    gen = generate_text_basic_stream(model, torch.tensor([ids]), 3)
    assert seq[len(ids) :] == [int(t) for t in gen]


def test_plot_top_k_returns_figure_without_pyplot(tok, model):
    import sys

    top = top_k_next_tokens(model, tok, tok.encode("Hi"), k=4)
    fig = plot_top_k(top, title="next")
    ax = fig.axes[0]
    assert ax.get_title() == "next"
    widths = [p.get_width() for p in ax.patches]
    assert widths == pytest.approx(top.probs)
    assert figure_png(fig).startswith(b"\x89PNG")
    if "matplotlib.pyplot" in sys.modules:
        import matplotlib.pyplot as plt

        assert fig not in [plt.figure(n) for n in plt.get_fignums()]


def test_the_live_chart_draws_the_pieces_as_notebook_03s_chart_does(monkeypatch):
    """The next-token view's chart labels a CJK piece with its characters
    (it once showed '\\u4f18\\u5148'), through the label function notebook
    03's own chart uses, with no glyph missing; in a zh notebook its title
    and axis are Chinese."""
    import warnings

    from utils import language, plotting

    if plotting.find_cjk_font() is None:
        pytest.skip("no CJK font installed (e.g. apt install fonts-noto-cjk)")
    top = TopK(ids=[104747, 14177, 125696, 99],
               pieces=["优先", " acceler", " пере", "\U0001f34b"],
               probs=[0.5, 0.2, 0.1, 0.05])  # fmt: skip
    for lang in ("en", "zh"):
        monkeypatch.setenv(language.LANG_ENV, lang)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a missing glyph warns
            fig = plot_top_k(top)
            figure_png(fig)
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == [
            f"{plotting.chart_label(p)}  ({i})"
            for i, p in zip(top.ids, top.pieces, strict=True)
        ]
        assert labels[0] == "'优先'  (104747)" and labels[2] == "' пере'  (125696)"
        zh = lang == "zh"
        assert ax.get_title() == (
            "下一个 token 的前 4 个候选" if zh else "Top 4 next tokens"
        )
        assert ax.get_xlabel() == ("概率" if zh else "probability")


def test_a_character_no_font_draws_is_an_escape_not_a_box(monkeypatch):
    from utils import plotting

    monkeypatch.setattr(plotting, "_drawable", lambda families: frozenset(range(128)))
    assert plotting.chart_label(" ok") == "' ok'"
    assert plotting.chart_label("优先") == "'\\u4f18\\u5148'"
    assert plotting.chart_label("a\U0001f34b") == "'a\\U0001f34b'"
