"""qwen3-generate and qwen3-chat: real-shape stand-in runs in subprocesses,
REPL logic in-process on a tiny model, and one-line errors for bad input."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._view_fixtures import (
    CLI_DRIVER,
    load_tokenizer,
    standin_env,
    standin_files,
    standin_root,
    tiny_model,
    unknown_id_model,
)
from tests.ctrl_c import ctrl_c_while_torch_imports
from utils.cli import commands as cli
from utils.fast import FastQwen3
from utils.fast import generate as fast_generate
from utils.qwen3_tokenizer import TOKENIZER_VOCAB_SIZE
from utils.streaming import GreedyStreamer, decode_bytes

PROMPT = "Explain large language models."


def run_cli(args, env, stdin=None, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "utils.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[1],
    )


def assert_one_line_error(proc, prog, fragment):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith(prog)]
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0]
    assert lines[0].startswith(f"{prog}: error:")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return standin_env(tmp_path_factory)


@pytest.fixture(scope="module")
def reasoning_files(tmp_path_factory):
    """The 0.6B reasoning stand-in, built once per session."""
    return standin_files(tmp_path_factory, "reasoning", tokenizer_only=False)


# --------------------------------------------------------------------------
# Real-shape subprocess runs (0.6B stand-in)
# --------------------------------------------------------------------------


def assert_streamed_answer(text, stderr, tok_path, n):
    """The answer of `generate --print-ids --max-new-tokens n` as it reached
    stdout: the answer, a newline, the ids; the statistics go to stderr."""
    assert "Traceback" not in stderr
    assert "STAND-IN WEIGHTS" in stderr
    ids_line = re.search(r"^Token ids: (.*)$", text, re.M)
    ids = [int(x) for x in ids_line.group(1).split()]
    assert len(ids) == n
    tok = load_tokenizer(tok_path)
    assert text == decode_bytes(tok, ids) + f"\n{ids_line.group(0)}\n"
    assert re.search(r"^\d+(\.\d)? tokens/sec$", stderr, re.M)
    assert re.search(r"^Time: [\d.]+ sec$", stderr, re.M)
    assert re.search(r"^Peak process memory \(RSS\): [\d.]+ GB$", stderr, re.M)


@pytest.mark.slow
def test_chat_two_turns_memory_history_clear(env, reasoning_files, tmp_path_factory):
    stdin = "Hello there\nWhat did I just say?\n/history\n/clear\n/history\n/quit\n"
    proc = run_cli(
        [
            "chat",
            "--max-new-tokens",
            "4",
            "--device",
            "cpu",
            "--out-dir",
            str(standin_root(tmp_path_factory)),
        ],
        env,
        stdin=stdin,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.count("Assistant: ") == 2
    stats = re.findall(
        r"\[prompt (\d+) tokens, answer (\d+) tokens, .* conversation (\d+)/40960",
        proc.stderr,
    )
    assert len(stats) == 2
    (p1, a1, c1), (p2, a2, c2) = [tuple(map(int, s)) for s in stats]
    # The second prompt carries the first exchange: it is longer than the
    # first turn's conversation plus the new question.
    tok = load_tokenizer(reasoning_files[0])
    question = len(tok.encode("What did I just say?"))
    assert p2 >= c1 + question
    assert c2 > c1
    history = proc.stdout.split("[history:")
    assert "user: Hello there" in history[0]
    assert "user: What did I just say?" in history[0]
    assert history[0].count("assistant: ") == 2
    assert history[1].startswith(f" 4 messages, {c2} tokens]")
    assert history[2].startswith(" 0 messages, 0 tokens]")
    assert "[conversation cleared]" in proc.stderr


# --------------------------------------------------------------------------
# Bad input: one line on stderr, non-zero exit, no traceback
# --------------------------------------------------------------------------


BAD_ARGS = [
    (["generate", "--prompt", "hi", "--device", "tpu9"], "Unknown device"),
    (["generate", "--prompt", "   "], "prompt is empty"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "positive"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "-2"], "positive"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "many"], "integer"),
    (["generate"], "--prompt"),
    (["generate", "--prompt", "hi", "--thinking"], "--reasoning"),
    (["chat", "--context-length", "0"], "positive"),
    (["chat", "--max-new-tokens", "-1"], "positive"),
    (["chat", "--device", "cuda:7"], "not available"),
]


@pytest.mark.parametrize(("args", "fragment"), BAD_ARGS)
def test_bad_arguments_fail_with_one_line(args, fragment, capsys):
    prog = f"qwen3-{args[0]}"
    main = cli.generate_main if args[0] == "generate" else cli.chat_main
    try:
        rc = main(args[1:])
    except SystemExit as exc:  # argparse usage errors exit directly
        rc = exc.code
    proc = subprocess.CompletedProcess(args, rc, *capsys.readouterr())
    assert_one_line_error(proc, prog, fragment)


@pytest.mark.slow
@pytest.mark.parametrize(("args", "fragment"), [BAD_ARGS[0], BAD_ARGS[2]])
def test_bad_arguments_in_a_real_process(env, args, fragment):
    proc = run_cli(args, env, stdin="", timeout=300)
    assert_one_line_error(proc, f"qwen3-{args[0]}", fragment)


@pytest.mark.slow
@pytest.mark.parametrize("broken", ["model", "tokenizer"])
def test_corrupt_files_fail_with_one_line(env, tmp_path, broken, tmp_path_factory):
    tok, _ = standin_files(tmp_path_factory, "base", tokenizer_only=True)
    model_file = tmp_path / "qwen3-0.6B-base.pth"
    tok_file = tmp_path / "tokenizer-base.json"
    if broken == "model":
        model_file.write_bytes(b"not a checkpoint" * 100)
        tok_file.write_bytes(tok.read_bytes())
    else:
        torch.save({"tok_emb.weight": torch.zeros(2, 2)}, model_file)
        tok_file.write_text('{"truncated": ')
    proc = run_cli(
        [
            "generate",
            "--prompt",
            "hi",
            "--device",
            "cpu",
            "--model-file",
            str(model_file),
            "--tokenizer-file",
            str(tok_file),
        ],
        env,
        timeout=300,
    )
    assert_one_line_error(proc, "qwen3-generate", str(tmp_path))
    # a file the reader named: nothing would download it again
    assert f"pass the book's file with --{broken}-file" in proc.stderr
    assert "download" not in proc.stderr


@pytest.mark.heavy_under_emulation
def test_checkpoint_of_another_model_fails_with_one_line(
    tmp_path, capsys, tmp_path_factory
):
    tok, _ = standin_files(tmp_path_factory, "base", tokenizer_only=True)
    model_file = tmp_path / "qwen3-0.6B-base.pth"
    torch.save({"tok_emb.weight": torch.zeros(2, 2)}, model_file)
    rc = cli.generate_main(
        ["--prompt", "hi", "--device", "cpu", "--model-file", str(model_file),
         "--tokenizer-file", str(tok)]
    )  # fmt: skip
    errors = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert rc == 2 and len(errors) == 1
    assert "could not load the model weights" in errors[0]
    assert errors[0].endswith("pass the book's file with --model-file.")


def test_a_stand_in_folder_that_cannot_be_written_is_named(
    tmp_path, capsys, monkeypatch
):
    """Not the store (which stand-in mode never touches): the folder that
    failed, and the setting that moves it."""
    (tmp_path / "file").write_text("in the way")
    folder = tmp_path / "file" / "standins"
    monkeypatch.setenv("QWEN3_STANDIN", "1")
    monkeypatch.setenv("QWEN3_STANDIN_DIR", str(folder))
    rc = cli.generate_main(["--prompt", "hi", "--device", "cpu"])
    errors = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert rc == 2 and len(errors) == 1, errors
    assert errors[0].startswith(
        f"qwen3-generate: error: cannot write the stand-in files in {folder}/ "
        "(Not a directory): set QWEN3_STANDIN_DIR to a folder you can write to"
    )
    assert "store" not in errors[0]


def test_console_scripts_are_declared():
    try:
        import tomllib
    except ImportError:  # Python 3.10: the tomli backport (dev dependency)
        import tomli as tomllib

    root = Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {
        "qwen3-generate": "utils.cli:generate_main",
        "qwen3-chat": "utils.cli:chat_main",
        "qwen3-batch": "utils.cli:batch_main",
    }


# --------------------------------------------------------------------------
# In-process: the same commands on a tiny model
# --------------------------------------------------------------------------


# (the fixtures `tiny` and `tiny_cli` are in conftest.py)


def chat_in_process(monkeypatch, capsys, stdin, *args):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = cli.chat_main(["--device", "cpu", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.heavy_under_emulation
def test_generate_in_process_matches_generator(tiny_cli, capsys):
    tok, model, tok_path = tiny_cli
    for flags in ([], ["--no-cache"], ["--reasoning"]):
        rc = cli.generate_main(
            ["--prompt", PROMPT, "--max-new-tokens", "7", "--print-ids", *flags]
        )
        out, err = capsys.readouterr()
        assert rc == 0, err
        ids = [int(x) for x in out.rsplit("Token ids: ", 1)[1].split()]
        if "--reasoning" in flags:
            prompt_ids = load_tokenizer(
                tok_path, apply_chat_template=True, add_generation_prompt=True
            ).encode(PROMPT)
        else:
            prompt_ids = tok.encode(PROMPT)
        expected = list(
            GreedyStreamer(model).stream(torch.tensor([prompt_ids]), 7, None)
        )
        assert ids == expected[: len(ids)] and len(ids) == 7
        assert (
            out
            == decode_bytes(tok, ids) + "\nToken ids: " + " ".join(map(str, ids)) + "\n"
        )
        assert "\nTime: " in err and " tokens/sec\n" in err


@pytest.mark.heavy_under_emulation
def test_int8_flag_quantizes_the_fast_path_only(tiny_cli, capsys):
    from utils.fast import Int8Linear, quantize_int8

    tok, model, _ = tiny_cli
    args = ["--prompt", PROMPT, "--max-new-tokens", "7", "--print-ids"]
    assert cli.generate_main([*args, "--int8"]) == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(errors) == 1 and "--int8" in errors[0] and "--fast" in errors[0]
    rc = cli.generate_main([*args, "--fast", "--int8"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "fast_native_int8: weight-only int8" in err
    ids = [int(x) for x in out.rsplit("Token ids: ", 1)[1].split()]
    # the int8 fast model's own greedy tokens; the book model stays float
    fast = quantize_int8(FastQwen3.from_book_model(model))
    prompt = torch.tensor([tok.encode(PROMPT)])
    assert ids == [int(t) for t in fast_generate(fast, prompt, 7)]
    assert not any(isinstance(m, Int8Linear) for m in model.modules())


def test_chat_prompt_holds_the_previous_exchange(tiny, tmp_path_factory):
    tok, model, tok_path = tiny
    session = cli.ChatSession(
        tokenizer=tok,
        streamer=GreedyStreamer(model),
        device=torch.device("cpu"),
        context_length=256,
        max_new_tokens=6,
    )
    pieces: list[str] = []
    session.reply("Hi", pieces.append)
    first_answer = session.messages[-1][1]
    # without thinking the answer keeps the empty think block it was given
    expected_prompt = (
        "<|im_start|>user\nHi<|im_end|>\n"
        f"<|im_start|>assistant\n<think>\n\n</think>\n\n{first_answer}<|im_end|>\n"
        "<|im_start|>user\nAnd?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert session.render("And?") == expected_prompt
    # The first turn is what the book's tokenizer writes for one message
    book = load_tokenizer(
        tok_path, apply_chat_template=True, add_generation_prompt=True
    )
    session2 = cli.ChatSession(tok, session.streamer, torch.device("cpu"), 256, 6)
    assert session2.encode(session2.render("Hi")) == book.encode("Hi")
    session2.thinking = True
    book.add_thinking = True
    assert session2.encode(session2.render("Hi")) == book.encode("Hi")
    session.clear()
    assert session.messages == [] and session.history_tokens() == 0


def test_chat_keeps_only_text_after_think(tiny):
    tok, model, tok_path = tiny

    class Scripted:
        def stream(self, ids, n, eos, **kw):
            yield from tok.encode("<think>\nplan\n</think>\n\nAnswer")

    session = cli.ChatSession(tok, Scripted(), torch.device("cpu"), 256, 50)
    session.thinking = True
    session.reply("Q", lambda s: None)
    assert session.messages == [("user", "Q"), ("assistant", "Answer")]


def test_chat_context_length_is_enforced(tiny_cli, monkeypatch, capsys):
    rc, out, err = chat_in_process(
        monkeypatch,
        capsys,
        "hello\n" + "word " * 40 + "\n/history\n",
        "--context-length",
        "40",
        "--max-new-tokens",
        "50",
    )
    assert rc == 0 and "Traceback" not in err
    # the first answer is cut so that it and its closing tokens fill the 40
    cut = re.findall(r"conversation (\d+)/40 tokens; context length reached", err)
    assert cut == ["40"]
    assert "over the context length of 40; type /clear" in err
    # The message that did not fit is not in the history
    assert "[history: 2 messages" in out
    assert "word word" not in out.split("[history:")[0]


def test_chat_ctrl_c_stops_the_answer_not_the_program(tiny, monkeypatch, capsys):
    tok, model, tok_path = tiny
    real = GreedyStreamer(model)

    class Interrupting:
        calls = 0

        def stream(self, *args, **kwargs):
            Interrupting.calls += 1
            for i, token in enumerate(real.stream(*args, **kwargs)):
                if Interrupting.calls == 1 and i == 2:
                    raise KeyboardInterrupt
                yield token

    def fake_load(args, kind, **kw):
        return cli.Loaded(tok, model, torch.device("cpu"), Interrupting(), True)

    monkeypatch.setattr(cli, "load", fake_load)
    rc, out, err = chat_in_process(
        monkeypatch, capsys, "one\ntwo\n/history\n", "--max-new-tokens", "5"
    )
    assert rc == 0
    assert "answer 2 tokens" in err and "stopped" in err
    assert "answer 5 tokens" in err  # the next answer runs normally
    assert "[history: 4 messages" in out


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt in this process, as in a reader's
    shell (a run started in the background ignores it), then as it was."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_held_is_raised_after_the_block_even_if_swallowed_in_it(ctrl_c):
    import signal
    import time

    from utils.errors import ctrl_c_held

    done = []
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_held():
            os.kill(os.getpid(), signal.SIGINT)
            try:  # as torch's C++ half may: an interrupt inside is lost
                time.sleep(0.05)
            except KeyboardInterrupt:
                done.append("swallowed")
            done.append("finished")
    assert done == ["finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with ctrl_c_held():  # nothing heard: nothing raised
        done.append("quiet")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignored stays ignored
    with ctrl_c_held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_chat_fast_ctrl_c_inside_the_first_build_answers_the_next_message(
    tiny, monkeypatch, capsys, ctrl_c
):
    """--fast hands the book model's weights to the fast model as it builds
    it (int8: each bf16 matrix freed once quantized); a real SIGINT there
    stops that answer, and the next one runs on the model that was built."""
    import signal

    from utils.fast import quantize

    tok, _, tok_path = tiny
    model = tiny_model()  # its own: the build empties it
    real = quantize.quantize_int8

    def interrupted(*args, **kwargs):  # Ctrl-C once the book model is emptied
        os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(quantize, "quantize_int8", interrupted)

    def fast_load(args, kind, **kw):
        streamer = GreedyStreamer(model, int8=args.int8, adopt=args.fast)
        return cli.Loaded(tok, model, torch.device("cpu"), streamer, True)

    monkeypatch.setattr(cli, "load", fast_load)
    rc, out, err = chat_in_process(
        monkeypatch, capsys, "one\ntwo\n", "--fast", "--int8", "--max-new-tokens", "3"
    )
    assert rc == 0, err
    assert "[stopped]" in err and "error" not in err
    assert err.count("answer 3 tokens") == 1  # the second message's
    assert out.count("Assistant: ") == 2


@pytest.mark.slow  # subprocesses that import torch
@pytest.mark.parametrize("command", ["generate", "chat", "batch"])
def test_sigint_while_torch_is_imported_ends_with_one_line(command, tmp_path):
    """Ctrl-C in the first seconds, while torch is imported: one line and
    130 (a run that missed it would stop at its bad device, status 2)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "hi"}\n', encoding="utf-8")
    args = {
        "generate": ["utils.cli", "generate", "--prompt", "hi"],
        "chat": ["utils.cli", "chat"],
        "batch": ["utils.batch", str(prompts), "--out", str(tmp_path / "a")],
    }
    rc, out, err = ctrl_c_while_torch_imports(*args[command], "--device", "tpu9")
    assert rc == 130, err
    assert err.split() == f"READY qwen3-{command}: interrupted".split()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_an_answer_stdout_cannot_take_is_one_line(
    tiny_cli, monkeypatch, capsys, command
):
    """`> /dev/full` (a full disk): one line naming standard output and the
    fix, status 2; the chat ends instead of answering into it."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\ntwo\n"))
    with open("/dev/full", "w", encoding="utf-8") as full:
        monkeypatch.setattr(sys, "stdout", full)
        if command == "generate":
            rc = cli.generate_main(["--prompt", "hi", "--max-new-tokens", "3"])
        else:
            rc = cli.chat_main(["--device", "cpu", "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("qwen3-")]
    assert rc == 2 and "Traceback" not in err
    assert lines == [
        f"qwen3-{command}: error: could not write the answer to standard output "
        "(/dev/full: No space left on device): send it to a file you can write, "
        "on a disk with free space (> answer.txt), or to the terminal"
    ]


def test_chat_commands(tiny_cli, monkeypatch, capsys):
    rc, out, err = chat_in_process(
        monkeypatch,
        capsys,
        "/think\n/bogus\n\n/no_think\n/help\n/history\n",
        "--max-new-tokens",
        "2",
    )
    assert rc == 0
    assert "[thinking on]" in err and "[thinking off]" in err
    assert "unknown command /bogus" in err
    assert "[history: 0 messages, 0 tokens]" in out
    rc, out, err = chat_in_process(monkeypatch, capsys, "", "--fast", "--no-cache")
    assert rc == 2 and err.strip().count("\n") == 0 and "--fast" in err


# --------------------------------------------------------------------------
# The command line survives any input
# --------------------------------------------------------------------------


def loader(tok_path, model):
    def fake_load(args, kind, **tokenizer_kwargs):
        t = load_tokenizer(tok_path, **tokenizer_kwargs)
        return cli.Loaded(t, model, torch.device("cpu"), GreedyStreamer(model), True)

    return fake_load


def test_generate_shows_unknown_ids_and_carries_on(tiny, monkeypatch, capsys):
    tok, _, tok_path = tiny
    monkeypatch.setattr(cli, "load", loader(tok_path, unknown_id_model()))
    rc = cli.generate_main(["--prompt", PROMPT, "--max-new-tokens", "5", "--print-ids"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    ids = [int(x) for x in out.rsplit("Token ids: ", 1)[1].split()]
    assert len(ids) == 5 and all(i >= TOKENIZER_VOCAB_SIZE for i in ids)
    assert out.startswith("".join(f"<unk:{i}>" for i in ids) + "\nToken ids:")


def test_chat_shows_unknown_ids_and_keeps_the_session(tiny, monkeypatch, capsys):
    tok, _, tok_path = tiny
    monkeypatch.setattr(cli, "load", loader(tok_path, unknown_id_model()))
    rc, out, err = chat_in_process(
        monkeypatch, capsys, "one\ntwo\n/history\n", "--max-new-tokens", "3"
    )
    assert rc == 0, err
    assert out.count("Assistant: <unk:1517") == 2
    assert err.count("answer 3 tokens") == 2
    assert "[history: 4 messages" in out


def test_chat_encode_error_is_one_line_and_the_chat_goes_on(
    tiny_cli, monkeypatch, capsys
):
    # A lone surrogate: what a non-UTF-8 byte becomes under surrogateescape
    rc, out, err = chat_in_process(
        monkeypatch,
        capsys,
        "bad \udcff byte\nfine\n/history\n",
        "--max-new-tokens",
        "2",
    )
    assert rc == 0 and "Traceback" not in err
    bad = [line for line in err.splitlines() if "could not encode" in line]
    assert len(bad) == 1 and bad[0].startswith("qwen3-chat: ")
    assert "[history: 2 messages" in out and "user: fine" in out
    assert out.count("Assistant: ") == 2  # the bad line got no answer


def test_download_error_prints_its_whole_message(monkeypatch, capsys, tmp_path):
    import utils.download as download  # the door the command calls through

    error = download.DownloadError(
        "qwen3-0.6B-base.pth",
        [("https://a.example/x", "HTTP 503"), ("https://b.example/y", "timeout")],
    )

    def failing(*args, **kwargs):
        raise error

    monkeypatch.setattr(download, "download_qwen3_small", failing)
    monkeypatch.delenv("QWEN3_STANDIN", raising=False)  # downloads happen for real
    args = ["--prompt", "hi", "--device", "cpu", "--out-dir", str(tmp_path)]
    rc = cli.generate_main(args)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.startswith("qwen3-generate: error: could not get the base model")
    assert str(error) in err  # every line: sources tried and what to try
    assert len(str(error).splitlines()) > 3


@pytest.mark.slow
def test_download_error_in_a_real_process_lists_the_sources(env, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in env.items() if k != "QWEN3_STANDIN"}
    hub, mirror = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/mirror"
    env.update(HF_ENDPOINT=hub, QWEN3_BACKUP_URL=mirror, HF_HOME=str(tmp_path / "hf"))
    out_dir = tmp_path / "qwen3"
    args = ["generate", "--prompt", "hi", "--device", "cpu", "--out-dir", str(out_dir)]
    proc = run_cli(args, env, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    message = proc.stderr.split("qwen3-generate: error: ", 1)[1]
    assert message.startswith(f"could not get the base model files into {out_dir}")
    assert f"{hub}/" in message and f"{mirror}/" in message  # both sources
    assert len(message.splitlines()) > 3


# --------------------------------------------------------------------------
# Streams a shell can use; memory checked before the work
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_answer_redirected_to_a_file_holds_only_the_answer(
    env, reasoning_files, tmp_path, tmp_path_factory
):
    """`> answer.txt` keeps only the answer, also where the fast path's
    native step is off (its kernel cache a file) or a setting is wrong: the
    lines that say so go to stderr. With the native step off, --fast gives
    the book's tokens (eager, F.linear). The plain run is also the check
    that generate streams --max-new-tokens tokens and prints --print-ids
    (`assert_streamed_answer`; one 0.6B process fewer than a test of its
    own: the suite's time budget)."""
    folder = str(standin_root(tmp_path_factory))
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    cases = {
        "plain": ({}, [], None),
        "no native": ({"QWEN3_KERNEL_CACHE": str(blocked)}, ["--fast"],
                      "native decode step off"),
        "bad kernels": ({"QWEN3_KERNEL_VARIANTS": "nonsense"}, ["--fast"],
                        "nonsense"),
    }  # fmt: skip
    answers = {}
    for name, (extra_env, flags, said) in cases.items():
        answer = tmp_path / f"{name}.txt"
        args = ["generate", "--prompt", PROMPT, "--reasoning", "--max-new-tokens",
                "5", "--print-ids", "--device", "cpu", "--out-dir", folder,
                *flags]  # fmt: skip
        with answer.open("w") as out:
            proc = subprocess.run(
                [sys.executable, "-m", "utils.cli", *args],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                env={**env, **extra_env},
                timeout=600,
                cwd=Path(__file__).resolve().parents[1],
            )
        assert proc.returncode == 0, (name, proc.stderr)
        text = answers[name] = answer.read_text()
        noise = ["Time:", "tokens/sec", "Peak process memory", "STAND-IN", "loading"]
        for line in noise + ([said] if said else []):
            assert line not in text, (name, line)
            assert line in proc.stderr, (name, line)
        assert text.endswith("\n") and text.strip()
        if name == "plain":
            assert_streamed_answer(text, proc.stderr, reasoning_files[0], 5)
    assert answers["no native"] == answers["plain"]


def test_slow_runs_print_a_decimal_not_zero():
    from utils.generation import stats_lines

    stats = {"time_s": 8.0, "tokens_per_sec": 0.25, "peak_mem_bytes": 2**30,
             "memory_kind": "Peak process memory (RSS)"}  # fmt: skip
    assert stats_lines(stats)[1] == "0.2 tokens/sec"
    assert stats_lines({**stats, "tokens_per_sec": 6.8})[1] == "6 tokens/sec"


def test_the_command_prints_one_decimal_below_ten(tiny_cli, capsys, monkeypatch):
    """The book's int() prints 1.87 tokens/sec as "1"; the command says 1.9
    (the notebooks keep the book's format)."""
    real = cli._stream_answer

    def slow(*args):
        result = real(*args)
        result.stats["tokens_per_sec"] = 1.87
        return result

    monkeypatch.setattr(cli, "_stream_answer", slow)
    assert cli.generate_main(["--prompt", PROMPT, "--max-new-tokens", "3"]) == 0
    assert "\n1.9 tokens/sec\n" in capsys.readouterr().err


def test_with_stand_in_weights_an_answer_is_short_unless_asked(tiny_cli, capsys):
    """Random weights never write the end-of-sequence token, so an answer ran
    to 1,024 tokens in the chat (an hour on a slow machine): by default it
    stops at 30, which the command says; --max-new-tokens still rules, and
    --help gives both defaults."""
    assert cli.generate_main(["--prompt", PROMPT, "--print-ids"]) == 0
    out, err = capsys.readouterr()
    assert len(out.rsplit("Token ids: ", 1)[1].split()) == cli.STANDIN_TOKENS == 30
    assert "stand-in weights never end an answer: each stops after 30 tokens" in err
    args = ["--prompt", PROMPT, "--print-ids", "--max-new-tokens", "4"]
    assert cli.generate_main(args) == 0
    out, err = capsys.readouterr()
    assert len(out.rsplit("Token ids: ", 1)[1].split()) == 4 and "never end" not in err
    for parser, default in ((cli.generate_parser, 100), (cli.chat_parser, 1024)):
        shown = " ".join(parser().format_help().split())
        assert f"(default: {default}; 30 with stand-in weights," in shown


def test_prompt_too_long_for_memory_is_refused_before_any_work(
    tiny_cli, monkeypatch, capsys
):
    from utils import models

    tok, model, _ = tiny_cli
    free = 1_000_000
    monkeypatch.setattr(models, "free_memory_bytes", lambda device: free)
    monkeypatch.setattr(
        GreedyStreamer, "stream", lambda *a, **k: pytest.fail("generation ran")
    )
    # about 200 tokens: inside the context, but not in 1 MB of memory
    rc = cli.generate_main(["--prompt", "word " * 200, "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "error" in x]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err
    assert "GB for the attention scores" in lines[0]
    most = int(lines[0].split("at most about ")[1].split()[0].replace(",", ""))
    cfg = model.cfg
    assert models.prefill_attention_bytes(cfg, most) <= 0.8 * free
    assert models.prefill_attention_bytes(cfg, most + 2) > 0.8 * free


def test_chat_context_too_long_for_memory_keeps_the_session(tiny, monkeypatch):
    from utils import models

    tok, model, _ = tiny
    session = cli.ChatSession(tok, GreedyStreamer(model), torch.device("cpu"), 256, 4)
    session.reply("Hi", lambda s: None)
    before = list(session.messages)
    monkeypatch.setattr(models, "free_memory_bytes", lambda device: 1000)
    with pytest.raises(cli.UsageError, match="/clear a long conversation"):
        session.reply("And?", lambda s: None)
    assert session.messages == before


def test_prefill_estimate_bounds_the_attention_the_model_allocates():
    """The estimate is at least the largest tensor the book's attention
    makes for a prompt (measured with the profiler on the tiny model)."""
    from torch.profiler import ProfilerActivity, profile

    from utils import models

    model = tiny_model()
    ids = torch.randint(0, 1000, (1, 200))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.inference_mode():
            model(ids)
    largest = max(e.cpu_memory_usage for e in prof.key_averages())
    scores = model.cfg["n_heads"] * 200 * 200 * 4  # float32
    assert largest >= scores  # the profiler sees the score matrix
    assert models.prefill_attention_bytes(model.cfg, 200) >= 3 * scores


# Linux keeps a process's peak RSS across exec: a command started straight
# from this (large) test process would report the test's peak as its own.
# A small Python in between starts it with a fresh count.
FRESH_PEAK = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


def private_copies(files: tuple[Path, Path | None], folder: Path) -> Path:
    """Copies (new inodes, not links) of the stand-in files and their
    markers in `folder`. A mapped page counts in a peak RSS, and this
    process may map the shared stand-in checkpoint itself: then the int8
    build's page-out cannot drop the bf16 pages it has quantized."""
    import shutil

    from utils.download.provenance import sidecar_path

    folder.mkdir()
    for path in files:
        for src in (path, sidecar_path(path)):
            shutil.copyfile(src, folder / src.name)
            with open(folder / src.name, "rb+") as f:
                os.fsync(f.fileno())  # clean pages: dirty ones stay resident
    return folder


@pytest.mark.slow
def test_int8_fast_path_peaks_below_the_bf16_one(env, tmp_path_factory):
    """The int8 build quantizes while loading: its peak is well below the
    bf16 one (the weights are 0.6 GB smaller)."""
    files = standin_files(tmp_path_factory, "base", tokenizer_only=False)
    assert files[1] is not None
    own = tmp_path_factory.mktemp("own-standins") / "files"
    env = {**env, "QWEN3_STANDIN_DIR": str(private_copies(files, own))}
    peaks = {}
    for flags in (["--fast"], ["--fast", "--int8"]):
        folder = str(standin_root(tmp_path_factory))
        args = ["generate", "--prompt", "hi", "--max-new-tokens", "2", "--device",
                "cpu", "--out-dir", folder, *flags]  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-c", FRESH_PEAK, sys.executable, "-m", "utils.cli",
             *args],
            capture_output=True, text=True, env=env, timeout=900,
            cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        got = re.search(
            r"^Peak process memory \(RSS\): ([\d.]+) GB$", proc.stderr, re.M
        )
        assert f"Stand-in files in {own}/" in proc.stdout + proc.stderr
        peaks[" ".join(flags)] = float(got.group(1))
    # measured 1.40 vs 1.84 alone, 1.56 vs 1.84 in the full suite; the old
    # order (embedding and head last) 1.83 vs 1.84
    assert peaks["--fast --int8"] < peaks["--fast"] - 0.15, peaks


def test_a_pickled_program_in_the_checkpoint_is_one_plain_line(
    tmp_path, capsys, tmp_path_factory
):
    import pickle
    import zipfile

    tok, _ = standin_files(tmp_path_factory, "base", tokenizer_only=True)
    path = tmp_path / "qwen3-0.6B-base.pth"
    torch.save({"w": torch.zeros(2)}, path)
    with zipfile.ZipFile(path) as z:
        data = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in data if n.endswith("data.pkl"))
    data[pkl] = pickle.dumps(print, protocol=2)  # would call a function
    with zipfile.ZipFile(path, "w") as z:
        for name, raw in data.items():
            z.writestr(name, raw)
    rc = cli.generate_main(
        ["--prompt", "hi", "--device", "cpu", "--model-file", str(path),
         "--tokenizer-file", str(tok)]
    )  # fmt: skip
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "error" in x]
    assert rc == 2 and len(lines) == 1, err
    assert "\x1b[" not in err and "This file can still be loaded" not in err
    assert "refuses to run them" in lines[0]
    assert lines[0].endswith("pass the book's file with --model-file.")


# --------------------------------------------------------------------------
# Options a reader mistypes, streams a shell closes, threads
# --------------------------------------------------------------------------


def usage_error(main, argv, capsys) -> str:
    """The one line a usage error prints (exit status 2)."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("main", "argv", "wanted"),
    [
        (cli.generate_main, ["--promt", "hi"], "--promt (did you mean --prompt?)"),
        (cli.generate_main, ["--prompt", "hi", "--max-new", "3"],
         "--max-new (did you mean --max-new-tokens?)"),
        (cli.chat_main, ["--thinkk"], "--thinkk (did you mean --think?)"),
        (cli.chat_main, ["--threads=2", "--zzz"], "unrecognized arguments: --zzz"),
    ],
)  # fmt: skip
def test_a_mistyped_option_is_named_before_a_missing_one(main, argv, wanted, capsys):
    line = usage_error(main, argv, capsys)
    assert wanted in line and "required" not in line, line


def test_import_qwen3_names_a_mistyped_option_and_shows_no_none_default(capsys):
    from utils.hf_interop import convert as hf_interop

    line = usage_error(
        hf_interop.main, ["import-qwen3", "folder", "--knd", "base"], capsys
    )
    assert "--knd (did you mean --kind?)" in line
    parser = hf_interop.build_parser()
    sub = next(a for a in parser._actions if a.choices)  # the subcommands
    text = sub.choices["import-qwen3"].format_help()
    assert "(default: None)" not in text and "(default: qwen3)" in text


def test_help_shows_defaults_only_where_there_is_one():
    text = " ".join(cli.generate_parser().format_help().split())
    assert "(default: None)" not in text
    assert "the text to continue (default" not in text  # --prompt is required
    assert "most tokens to generate per answer (default: 100; 30 with stand-in" in text


def test_a_prompt_that_is_not_utf8_names_the_argument(tiny_cli, capsys):
    # "\udcff": how Python keeps the byte 0xff of a non-UTF-8 argument
    line = usage_error(cli.generate_main, ["--prompt", "ab\udcffcd"], capsys)
    assert line.startswith("qwen3-generate: error: argument --prompt: not UTF-8")
    assert "b'\\xff' at byte 2" in line and "UTF-8" in line


def test_a_non_utf8_prompt_in_a_real_process(env, tmp_path):
    missing = str(tmp_path / "absent")  # never loaded: the check comes first
    proc = subprocess.run(
        [sys.executable, "-m", "utils.cli", "generate", "--prompt", b"caf\xe9",
         "--model-file", missing, "--tokenizer-file", missing],
        capture_output=True, env={**env, "LC_ALL": "C.UTF-8"}, timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and "argument --prompt: not UTF-8" in err, err


@pytest.mark.parametrize(
    ("command", "redirect", "stream"),
    [
        ("generate", ">&-", "stdout"),
        ("chat", "<&-", "stdin"),
        ("chat", ">&-", "stdout"),
    ],
)
def test_a_closed_stream_is_named_in_one_line(env, tmp_path, command, redirect, stream):
    missing = str(tmp_path / "absent")  # never loaded: the check comes first
    args = [command, "--model-file", missing, "--tokenizer-file", missing]
    if command == "generate":
        args += ["--prompt", "hi"]
    proc = subprocess.run(
        ["sh", "-c", f'exec "$@" {redirect}', "sh", sys.executable, "-m",
         "utils.cli", *args],
        stdin=subprocess.DEVNULL if redirect != "<&-" else None,
        capture_output=True, text=True, env=env, timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert_one_line_error(proc, f"qwen3-{command}", f"{stream} is closed")
    assert proc.returncode == 2


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_reader_that_leaves_early_ends_the_command_quietly(env, tiny, command):
    """`qwen3-generate ... | head -c 10`: the pipe's reader is gone before
    the answer is written (closed here at once, so it is certain)."""
    _, _, tok_path = tiny
    args = [sys.executable, "-c", CLI_DRIVER, str(tok_path), command,
            "--max-new-tokens", "20"]  # fmt: skip
    if command == "generate":
        args += ["--prompt", PROMPT]
    proc = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    proc.stdout.close()  # the reader leaves before the first byte
    _, err = proc.communicate(b"hello\n", timeout=300)
    err = err.decode()
    assert proc.returncode == 141, err  # what a shell shows for SIGPIPE
    assert "error" not in err and "Traceback" not in err
    assert "BrokenPipe" not in err and "Exception ignored" not in err


def test_a_broken_pipe_elsewhere_is_still_an_error(capfd):
    from utils.errors import run_command

    def body() -> int:
        raise BrokenPipeError(32, "Broken pipe")

    # stdout here is a file that still takes bytes: not the reader leaving
    assert run_command("prog", body) == 1
    assert capfd.readouterr().err.startswith("prog: error: BrokenPipeError")


@pytest.fixture
def threads_back():
    from utils.fast.threads import pin_step_threads

    before = torch.get_num_threads()
    yield
    pin_step_threads(None)  # native steps choose their count again
    torch.set_num_threads(before)


def test_threads_sets_torchs_thread_count_before_loading(
    tiny_cli, monkeypatch, capsys, threads_back
):
    from utils.fast.threads import pinned_threads

    seen = []
    load = cli.load

    def counting_load(args, kind, **kw):
        seen.append(torch.get_num_threads())
        return load(args, kind, **kw)

    monkeypatch.setattr(cli, "load", counting_load)
    torch.set_num_threads(2)
    args = ["--prompt", "hi", "--max-new-tokens", "2", "--threads", "1"]
    assert cli.generate_main(args) == 0
    rc, _, _ = chat_in_process(monkeypatch, capsys, "", "--threads", "1")
    assert rc == 0 and seen == [1, 1]
    assert pinned_threads() == 1  # the native step's count too, not chosen
    line = usage_error(cli.generate_main, ["--prompt", "hi", "--threads", "0"], capsys)
    assert "--threads" in line and "positive" in line


def test_progress_goes_through_the_utils_logger(tmp_path, capsys, tmp_path_factory):
    import logging

    tok, _ = standin_files(tmp_path_factory, "base", tokenizer_only=True)
    model_file = tmp_path / "qwen3-0.6B-base.pth"
    torch.save({"tok_emb.weight": torch.zeros(2, 2)}, model_file)
    args = ["--prompt", "hi", "--device", "cpu", "--model-file", str(model_file),
            "--tokenizer-file", str(tok)]  # fmt: skip
    assert cli.generate_main(args) == 2  # after "loading ...": not the weights
    assert f"utils.cli: loading {model_file} ...\n" in capsys.readouterr().err
    logger = logging.getLogger("utils")
    level = logger.level
    try:
        logger.setLevel(logging.WARNING)  # how a reader quiets the progress
        assert cli.generate_main(args) == 2
    finally:
        logger.setLevel(level)
    err = capsys.readouterr().err
    assert "loading" not in err and "could not load the model weights" in err
