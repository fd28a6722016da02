"""Sampling in the commands: --temperature/--top-k/--top-p/--seed pick
tokens as utils.sampling does (a seed repeats the text), --num-samples
decodes the samples of one prompt together, bad values are one line."""

from __future__ import annotations

import io
import sys

import pytest
import torch

from utils.cli import commands as cli
from utils.sampling import Sampling
from utils.streaming import GreedyStreamer

PROMPT = "Explain large language models."
SAMPLED = ["--temperature", "1.2", "--top-k", "200", "--top-p", "0.95"]


def generate(capsys, *args: str) -> tuple[int, str, str]:
    try:
        rc = cli.generate_main(["--prompt", PROMPT, "--max-new-tokens", "6", *args])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def ids_of(out: str) -> list[int]:
    return [int(x) for x in out.rsplit("Token ids: ", 1)[1].split()]


def test_a_seed_repeats_the_sampled_text_of_every_path(tiny_cli, capsys):
    tok, model, _ = tiny_cli
    for path in ([], ["--no-cache"], ["--fast"]):
        runs = [generate(capsys, *SAMPLED, "--seed", s, "--print-ids", *path)
                for s in ("4", "4", "5")]  # fmt: skip
        assert all(rc == 0 for rc, _, _ in runs)
        assert ids_of(runs[0][1]) == ids_of(runs[1][1]) != ids_of(runs[2][1])
    picker = Sampling(1.2, 200, 0.95, seed=4).picker()
    prompt = torch.tensor([tok.encode(PROMPT)])
    want = list(GreedyStreamer(model).stream(prompt, 6, None, picker=picker))
    assert ids_of(runs[0][1]) == want  # the book's path, as utils.sampling picks


def test_samples_of_one_prompt_decode_together(bf16_cli, capsys):
    for path in ([], ["--fast", "--int8"]):
        rc, out, err = generate(capsys, *SAMPLED, "--seed", "2", "--num-samples",
                                "3", *path)  # fmt: skip
        assert rc == 0, err
        blocks = [b for b in out.split("--- sample ") if b]
        assert [b.split(" ", 1)[0] for b in blocks] == ["1", "2", "3"]
        assert "3 samples, " in err and "tokens/sec in total" in err
    # on the fast path each sample is the text it gets alone
    rc, alone, _ = generate(capsys, *SAMPLED, "--seed", "2", "--fast", "--int8")
    assert blocks[0].split("---\n", 1)[1] == alone


def test_a_chat_with_a_seed_says_the_same_twice(tiny_cli, monkeypatch, capsys):
    outs = []
    for _ in range(2):
        monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\nAnd then?\n"))
        rc = cli.chat_main(["--device", "cpu", "--max-new-tokens", "5", *SAMPLED,
                            "--seed", "9"])  # fmt: skip
        out, _ = capsys.readouterr()
        outs.append(out)
        assert rc == 0
    assert outs[0] == outs[1] and outs[0].strip()


@pytest.mark.parametrize(
    "args, words",
    [(["--temperature", "-1"], "--temperature must be >= 0"),
     (["--top-k", "0"], "--top-k must be"), (["--top-p", "1.5"], "--top-p must be"),
     (["--num-samples", "0"], "--num-samples")],
)  # fmt: skip
def test_bad_sampling_values_are_one_line(capsys, args, words):
    rc, _, err = generate(capsys, *args)
    assert rc == 2 and words in err and len(err.strip().splitlines()) == 1
