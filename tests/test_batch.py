"""qwen3-batch: every line checked before any work, one whole answer line
per finished answer, a stopped run resumed without duplicates or changes,
--fast rows equal to the prompt decoded alone (greedy and seeded)."""

from __future__ import annotations

import json

import pytest

import utils.fast.build as build
from utils.batch import AnswerLog, read_jobs
from utils.cli import batch_main as main
from utils.errors import UsageError

GOOD = [
    {"id": 1, "prompt": "Hello there"},
    {"id": "b", "prompt": "What is 2+2?", "max_new_tokens": 5},
    {"id": 3, "prompt": "Once upon a time", "num_samples": 3, "temperature": 0.9,
     "top_p": 0.9, "seed": 5, "answer": "kept for the reader"},
    {"id": 4, "prompt": "A longer prompt that goes on and on for a while, " * 3},
]  # fmt: skip
needs_kernels = pytest.mark.skipif(
    build.unsupported_reason() is not None,
    reason="the native step needs the C kernels (x86-64 with AVX2, or AArch64)",
)


def write_prompts(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def answers(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


@pytest.mark.parametrize(
    "line, words",
    [("not json", "line 2: not JSON"), ('["a"]', "line 2: not a JSON object"),
     ('{"prompt": "x"}', 'line 2: needs an "id"'),
     ('{"id": 1.5, "prompt": "x"}', 'line 2: needs an "id"'),
     ('{"id": 9, "prompt": "  "}', 'line 2: needs a "prompt"'),
     ('{"id": 1, "prompt": "x"}', "line 2: id 1 is already on line 1"),
     ('{"id": 9, "prompt": "x", "max_new_tokens": 0}', '"max_new_tokens" must be'),
     ('{"id": 9, "prompt": "x", "num_samples": true}', '"num_samples" must be'),
     ('{"id": 9, "prompt": "x", "temperature": -1}', "temperature must be >= 0"),
     ('{"id": 9, "prompt": "x", "top_p": 2}', "top_p must be in (0, 1]"),
     ('{"id": 9, "prompt": "x", "seed": "s"}', '"seed" must be a whole number')],
)  # fmt: skip
def test_a_bad_line_is_named_and_nothing_is_written(tmp_path, capsys, line, words):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "a.jsonl"
    prompts.write_text(json.dumps(GOOD[0]) + "\n" + line + "\n", encoding="utf-8")
    assert main([str(prompts), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qwen3-batch: error: ") and words in err, err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_lines_take_the_commands_settings_where_they_say_nothing(tmp_path):
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, [*GOOD[:3], {}][:3])
    defaults = {"max_new_tokens": 7, "num_samples": 2, "temperature": 0.5,
                "top_k": 40, "top_p": None, "seed": 1}  # fmt: skip
    jobs = read_jobs(prompts, defaults)
    assert [(j.max_new_tokens, j.num_samples) for j in jobs] == [(7, 2), (5, 2), (7, 3)]
    assert jobs[0].sampling.top_k == 40 and jobs[2].sampling.seed == 5
    with pytest.raises(UsageError, match="holds no prompts"):
        write_prompts(prompts, [])
        read_jobs(prompts, defaults)


def run_batch(tmp_path, *more: str) -> int:
    prompts = tmp_path / "p.jsonl"
    if not prompts.exists():
        write_prompts(prompts, GOOD)
    return main([str(prompts), "--out", str(tmp_path / "a.jsonl"),
                 "--max-new-tokens", "6", *more])  # fmt: skip


def by_key(rows: list[dict]) -> dict:
    return {(json.dumps(r["id"]), r["sample"]): (r["text"], r["tokens"], r["stop"])
            for r in rows}  # fmt: skip


@needs_kernels
def test_fast_rows_are_the_prompts_alone_and_a_stopped_run_resumes(
    bf16_cli, tmp_path, monkeypatch
):
    whole = tmp_path / "whole"
    whole.mkdir()
    assert run_batch(whole, "--fast", "--batch-size", "1") == 0
    want = by_key(answers(whole / "a.jsonl"))
    assert len(want) == 6 and {v[2] for v in want.values()} <= {"eos", "length"}
    assert want[("3", 0)] != want[("3", 1)]  # sampled
    assert len(answers(whole / "a.jsonl")) == 6
    # the same with 4 rows a step, stopped (Ctrl-C) after two answers
    real = AnswerLog.write
    written = []

    def write(self, record):
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(record)
        real(self, record)

    monkeypatch.setattr(AnswerLog, "write", write)
    assert run_batch(tmp_path, "--fast", "--batch-size", "4") == 130
    assert len(answers(tmp_path / "a.jsonl")) == 2
    monkeypatch.setattr(AnswerLog, "write", real)
    assert run_batch(tmp_path, "--fast", "--batch-size", "4") == 0
    got = answers(tmp_path / "a.jsonl")
    assert len(got) == 6 and by_key(got) == want  # no duplicates, same texts


@needs_kernels
def test_a_line_cut_by_a_crash_is_made_again(bf16_cli, tmp_path, capsys):
    assert run_batch(tmp_path, "--fast", "--batch-size", "3") == 0
    out = tmp_path / "a.jsonl"
    whole = out.read_bytes()
    out.write_bytes(whole[: whole.rfind(b"\n", 0, len(whole) - 1) + 9])
    assert run_batch(tmp_path, "--fast", "--batch-size", "3") == 0
    assert "dropped an unfinished last line" in capsys.readouterr().err
    assert by_key(answers(out)) == by_key([json.loads(x) for x in whole.splitlines()])


def test_the_books_batched_model_without_fast(bf16_cli, tmp_path, capsys):
    assert run_batch(tmp_path, "--batch-size", "3") == 0
    err = capsys.readouterr().err
    assert "can change with the batch size" in err
    rows = answers(tmp_path / "a.jsonl")
    assert sorted(by_key(rows)) == sorted(
        [("1", 0), ('"b"', 0), ("3", 0), ("3", 1), ("3", 2), ("4", 0)]
    )
    assert all(r["tokens"] <= (5 if r["id"] == "b" else 6) for r in rows)
    assert run_batch(tmp_path) == 0  # nothing left: nothing decoded, no probe
    assert "every answer is already in" in capsys.readouterr().err


def test_the_default_batch_size_is_the_fastest_measured(bf16_cli, tmp_path, capsys,
                                                        monkeypatch):  # fmt: skip
    from utils.batch import BookEngine

    rates = {1: 10.0, 2: 19.0, 4: 30.0}
    monkeypatch.setattr(BookEngine, "rates", lambda self, sizes: dict(rates))
    assert run_batch(tmp_path) == 0
    assert "batch size 4: the fastest here now" in capsys.readouterr().err


def test_options_are_checked_before_any_work(tmp_path, capsys):
    write_prompts(tmp_path / "p.jsonl", GOOD)
    for args, words in [(["--batch-size", "0"], "--batch-size must be"),
                        (["--thinking"], "--thinking only applies with --chat"),
                        (["--temperature", "-2"], "--temperature must be >= 0"),
                        (["--top-p", "0"], "--top-p must be")]:  # fmt: skip
        assert run_batch(tmp_path, *args) == 2
        assert words in capsys.readouterr().err
    assert main([str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "p.jsonl")]) == 2
    assert not (tmp_path / "a.jsonl").exists()


def test_the_math500_example_on_the_commands_page_grades_answers(tmp_path, monkeypatch):
    """The page's two Python steps, run as printed in a folder holding the
    problems file (`load_math500_test` reads it instead of downloading):
    20 prompts in the book's template, then the book's grade_answer."""
    import contextlib
    import io
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "commands.md"
    steps = re.findall(r"uv run python - <<'EOF'\n(.*?)\nEOF", page.read_text("utf-8"),
                       re.S)  # fmt: skip
    assert len(steps) == 2 and "grade_answer" in steps[1]
    problems = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)}
                for i in range(25)]  # fmt: skip
    (tmp_path / "math500_test.json").write_text(json.dumps(problems), "utf-8")

    monkeypatch.chdir(tmp_path)

    def run(code: str) -> str:  # in this process (torch is loaded already)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            exec(compile(code, "docs/commands.md", "exec"), {"__name__": "__main__"})
        return out.getvalue()

    run(steps[0])
    rows = answers(tmp_path / "math20.jsonl")
    assert len(rows) == 20 and "What is 3 + 3?" in rows[3]["prompt"]
    assert "\\boxed" in rows[3]["prompt"] and rows[3]["answer"] == "6"
    said = [f"so the answer is \\boxed{{{2 * i if i % 2 else 0}}}" for i in range(20)]
    (tmp_path / "math20-answers.jsonl").write_text("".join(
        json.dumps({"id": i, "sample": 0, "text": t}) + "\n" for i, t in enumerate(said)
    ), "utf-8")  # fmt: skip
    assert run(steps[1]).strip() == "11/20 correct"  # the odd ones, and 0 + 0
