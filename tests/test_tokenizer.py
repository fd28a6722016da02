"""The rebuilt Qwen3 tokenizer against the book's expectations and tiktoken.

tiktoken runs the same Qwen ranks with its own BPE and regex engine, so token
for token agreement shows the recovered merges and the JSON settings are right.
"""

from __future__ import annotations

import importlib.util
import json
import unicodedata
from pathlib import Path

import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reasoning_from_scratch.qwen3 import Qwen3Tokenizer
from tokenizers import Tokenizer

from utils import qwen3_tokenizer as qt
from utils.download.provenance import is_standin
from utils.download.standin import CACHE_ENV, write_standin_tokenizer

DESIGN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
    "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
]  # fmt: skip


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


@pytest.fixture(scope="session")
def tokenizer_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Base and reasoning tokenizer files, built once into a private cache."""
    root = tmp_path_factory.mktemp("qwen3-tokenizer")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(root / "cache"))
        return {
            kind: write_standin_tokenizer(root / f"tokenizer-{kind}.json", kind)
            for kind in ("base", "reasoning")
        }


@pytest.fixture(scope="session")
def hf_tok(tokenizer_files: dict[str, Path]) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_files["base"]))


@pytest.fixture(scope="session")
def book_base(tokenizer_files: dict[str, Path]) -> Qwen3Tokenizer:
    return Qwen3Tokenizer(tokenizer_file_path=tokenizer_files["base"])


@pytest.fixture(scope="session")
def book_reasoning(tokenizer_files: dict[str, Path]) -> Qwen3Tokenizer:
    return Qwen3Tokenizer(tokenizer_file_path=tokenizer_files["reasoning"])


@pytest.fixture(scope="session")
def ranks() -> dict[bytes, int]:
    return qt.load_qwen_ranks()


@pytest.fixture(scope="session")
def tik(ranks: dict[bytes, int]) -> tiktoken.Encoding:
    """An independent encoder over the same ranks, pattern and added tokens."""
    return tiktoken.Encoding(
        name="qwen3-reference",
        pat_str=DESIGN_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={name: 151643 + i for i, name in enumerate(ADDED)},
    )


# --- the book's Qwen3Tokenizer on the rebuilt file -----------------------------


def test_book_example_ids(book_base: Qwen3Tokenizer) -> None:
    ids = book_base.encode("Explain large language models.")
    assert ids == [840, 20772, 3460, 4128, 4119, 13]
    assert book_base.decode(ids) == "Explain large language models."


@pytest.mark.parametrize(
    ("text", "token_id"), [("<|endoftext|>", 151643), ("<|im_end|>", 151645)]
)
def test_book_special_tokens(
    book_base: Qwen3Tokenizer, text: str, token_id: int
) -> None:
    assert book_base.encode(text) == [token_id]
    assert book_base.decode([token_id]) == text


def test_book_eos_depends_on_file_name(
    book_base: Qwen3Tokenizer, book_reasoning: Qwen3Tokenizer
) -> None:
    assert (book_base.eos_token, book_base.eos_token_id) == ("<|endoftext|>", 151643)
    reasoning = (book_reasoning.eos_token, book_reasoning.eos_token_id)
    assert reasoning == ("<|im_end|>", 151645)
    assert book_base.pad_token_id == book_reasoning.pad_token_id == 151643


def test_book_chat_template_uses_added_tokens(
    book_reasoning: Qwen3Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(book_reasoning, "add_generation_prompt", True)
    ids = book_reasoning.encode("Hi", chat_wrapped=True)
    assert ids[0] == 151644  # <|im_start|>
    assert 151667 in ids and 151668 in ids  # <think>, </think>
    text = book_reasoning.decode(ids)
    assert text.startswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant")


# --- the file itself -----------------------------------------------------------


def test_write_standin_tokenizer_marks_and_shares(
    tokenizer_files: dict[str, Path],
) -> None:
    base, reasoning = tokenizer_files["base"], tokenizer_files["reasoning"]
    assert is_standin(base) and is_standin(reasoning)
    assert base.read_bytes() == reasoning.read_bytes()


def test_vocab_and_added_tokens(hf_tok: Tokenizer) -> None:
    assert hf_tok.get_vocab_size(with_added_tokens=True) == 151669
    assert hf_tok.get_vocab_size(with_added_tokens=False) == 151643
    decoder = hf_tok.get_added_tokens_decoder()
    assert [decoder[151643 + i].content for i in range(26)] == ADDED
    assert [decoder[151643 + i].special for i in range(26)] == [True] * 14 + [
        False
    ] * 12


def test_token_id_constants_match_the_tokenizer(hf_tok: Tokenizer) -> None:
    assert hf_tok.token_to_id("<|endoftext|>") == qt.ENDOFTEXT_ID == 151643
    assert hf_tok.token_to_id("<|im_start|>") == qt.IM_START_ID == 151644
    assert hf_tok.token_to_id("<|im_end|>") == qt.IM_END_ID == 151645
    assert qt.TOKENIZER_VOCAB_SIZE == hf_tok.get_vocab_size(with_added_tokens=True)


def test_byte_table_round_trips_and_is_printable() -> None:
    table = qt.byte_to_unicode()
    assert sorted(table) == list(range(256))
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert qt.unicode_to_byte() == {c: b for b, c in table.items()}
    assert table[ord(" ")] == "\u0120" and table[ord("A")] == "A"  # GPT-2's Ġ


def test_skip_special_tokens_keeps_non_special_added(hf_tok: Tokenizer) -> None:
    ids = hf_tok.encode("<|im_start|><think>x</think><|endoftext|>").ids
    assert ids[:2] == [151644, 151667] and ids[-2:] == [151668, 151643]
    assert hf_tok.decode(ids, skip_special_tokens=True) == "<think>x</think>"


def test_json_settings(tokenizer_files: dict[str, Path]) -> None:
    spec = json.loads(tokenizer_files["base"].read_text(encoding="utf-8"))
    assert spec["normalizer"] == {"type": "NFC"}
    split, byte_level = spec["pre_tokenizer"]["pretokenizers"]
    assert split["pattern"] == {"Regex": DESIGN_PATTERN}
    assert (split["behavior"], split["invert"]) == ("Isolated", False)
    assert byte_level["type"] == "ByteLevel"
    assert (byte_level["add_prefix_space"], byte_level["use_regex"]) == (False, False)
    assert spec["post_processor"]["type"] == spec["decoder"]["type"] == "ByteLevel"
    model = spec["model"]
    assert (model["type"], model["unk_token"], model["dropout"]) == ("BPE", None, None)
    assert len(model["vocab"]) == 151643 and len(model["merges"]) == 151387


# --- agreement with tiktoken ---------------------------------------------------


class Agreement:
    """Checks one text against tiktoken; a short repr keeps failures readable."""

    def __init__(self, hf_tok: Tokenizer, tik: tiktoken.Encoding) -> None:
        self.hf_tok, self.tik = hf_tok, tik

    def __repr__(self) -> str:
        return "Agreement(rebuilt Qwen3 tokenizer vs tiktoken)"

    def check(self, text: str) -> None:
        ids = self.hf_tok.encode(text).ids
        assert ids == self.tik.encode(nfc(text), allowed_special="all")
        assert self.hf_tok.decode(ids, skip_special_tokens=False) == nfc(text)


@pytest.fixture(scope="session")
def agreement(hf_tok: Tokenizer, tik: tiktoken.Encoding) -> Agreement:
    return Agreement(hf_tok, tik)


SAMPLES = [
    "Explain large language models.",
    "Hello, world! How's it going? I'm fine; they've left, we'll see, you'd know.",
    "DON'T SHOUT, IT'S RUDE. WE'LL, THEY'RE, I'M, YOU'VE, HE'D",
    "大型语言模型是如何工作的？请一步一步地解释。",
    "東京は日本の首都です。カタカナとひらがな、漢字を混ぜる。",
    "한국어 문장도 있습니다.",
    "Emoji: 😀👍🏽👩‍👩‍👧‍👦 🏳️‍🌈 🇩🇪 ❤️‍🔥",
    "def f(x):\n    if x:\n\treturn x  # tab\n        pass\n",
    "   leading and trailing spaces   ",
    "a  b   c    d\n\n\ne\r\nf\r\n\r\n  \n\t\t\n",
    "Café, naïve, résumé, Ångström",
    "Cafe\u0301, nai\u0308ve, re\u0301sume\u0301, A\u030angstro\u0308m",  # NFD
    "3.14159 1,000,000 2025-11-30 0x1F 12345678901234567890",
    "ﬁle ﬀ ſ K Å µ ½ ① Ⅻ ２０２５",  # compatibility forms stay (NFC, not NFKC)
    "Здравствуй, мир! Γειά σου Κόσμε! مرحبا بالعالم שלום עולם",
    "Mixed<|im_start|>user\nHi<|im_end|>\n<think>\n\n</think>\n\nText<|endoftext|>",
    'x<tool_call>{"a": 1}</tool_call><|fim_prefix|>p<|fim_suffix|>s<|fim_middle|>',
    "",
    " ",
    "\n",
    "'s 's's ''' ' '",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_matches_tiktoken(agreement: Agreement, text: str) -> None:
    agreement.check(text)


def test_nfd_and_nfc_encode_alike(hf_tok: Tokenizer) -> None:
    assert hf_tok.encode("re\u0301sume\u0301").ids == hf_tok.encode("résumé").ids


def test_book_class_matches_raw_tokenizer(
    book_base: Qwen3Tokenizer, hf_tok: Tokenizer
) -> None:
    for text in SAMPLES[:15]:
        assert book_base.encode(text) == hf_tok.encode(text).ids


FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# Characters that exercise the pre-tokenizer's edge cases (apostrophes, case,
# whitespace kinds, digits, combining marks, joiners) packed densely.
TRICKY = list(
    " \t\r\n\x0b\x0c\x85\u00a0\u1680\u2028\u3000"  # whitespace kinds
    "'sStTdDmMlLrReEvV\u017f\u212a"  # contractions; long s and Kelvin fold to s/k
    "09\u0663a\u4e2d\u00e9\u0301\u200d\U0001f600-.!?"
)


@FUZZ
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60))
def test_fuzz_any_unicode(agreement: Agreement, text: str) -> None:
    agreement.check(text)


@FUZZ
@given(st.text(alphabet=st.sampled_from(TRICKY), max_size=40))
def test_fuzz_tricky_characters(agreement: Agreement, text: str) -> None:
    agreement.check(text)


# --- merges and ranks ----------------------------------------------------------


def test_recovered_merges(ranks: dict[bytes, int]) -> None:
    assert len(ranks) == 151643
    assert sorted(ranks.values()) == list(range(151643))
    merges = qt.recover_merges(ranks)
    assert len(merges) == 151387
    made = set()
    for left, right in merges:
        token_rank = ranks[left + right]
        assert token_rank > ranks[left] and token_rank > ranks[right]
        made.add(left + right)
    assert made == {t for t in ranks if len(t) > 1}


def _tiny_ranks(*tokens: bytes) -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    for token in tokens:
        ranks[token] = len(ranks)
    return ranks


def test_recover_merges_replays_lower_ranks_only() -> None:
    # "abc" could split as a+bc or ab+c; BPE with lower ranks builds "bc" first.
    ranks = _tiny_ranks(b"bc", b"ab", b"abc")
    assert qt.recover_merges(ranks) == [(b"b", b"c"), (b"a", b"b"), (b"a", b"bc")]


def test_recover_merges_rejects_unreachable_token() -> None:
    with pytest.raises(ValueError, match="not reachable"):
        qt.recover_merges(_tiny_ranks(b"abc"))
    ranked_before_its_bytes = {bytes([b]): b + 1 for b in range(256)} | {b"ab": 0}
    with pytest.raises(ValueError, match="not reachable"):
        qt.recover_merges(ranked_before_its_bytes)
    with pytest.raises(ValueError, match="single byte"):
        qt.recover_merges({b"a": 0})


# --- errors --------------------------------------------------------------------


def test_missing_dashscope_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object, **kwargs: object):
        return None if name == "dashscope" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(qt.importlib.util, "find_spec", find_spec)
    # the dict: the JSON text is cached once built (the same path below it)
    for call in (qt.qwen_ranks_path, qt.load_qwen_ranks, qt.build_qwen3_tokenizer_dict):
        with pytest.raises(FileNotFoundError) as info:
            call()
        assert "dashscope==1.19.3" in str(info.value) and "uv sync" in str(info.value)


def test_missing_ranks_file_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"dashscope==1\.19\.3"):
        qt.load_qwen_ranks(tmp_path / "qwen.tiktoken")


def test_malformed_ranks_file_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("IQ== 0\nnot-a-rank-line\n")
    with pytest.raises(ValueError, match=r"bad\.tiktoken:2"):
        qt.load_qwen_ranks(bad)
