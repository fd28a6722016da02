"""No answer lost to a code page (utils.stdio): every command writes UTF-8 to
files and pipes whatever PYTHONIOENCODING (a Windows code page) says, and
input that is not text is one line naming the byte and the fix."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._view_fixtures import (
    CLI_DRIVER,
    standin_env,
    standin_files,
    standin_root,
)
from tests.tiny import tiny_run
from utils import stdio
from utils.cli import commands as cli
from utils.stdio import InputEncodingError, check_input_file, decode_input

REPO = Path(__file__).resolve().parents[1]
CODE_PAGES = ["utf-8", "gbk", "cp1252"]  # Linux, Chinese and Western Windows
GBK_HELLO = "你好，请解释大语言模型。".encode("gbk")


class Console(io.TextIOWrapper):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_file_or_pipe_gets_utf8_a_terminal_keeps_its_encoding(monkeypatch):
    out = io.TextIOWrapper(io.BytesIO(), encoding="gbk")
    err = io.TextIOWrapper(io.BytesIO(), encoding="cp1252")
    tty = Console(io.BytesIO(), encoding="cp1252")
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    stdio.utf8_streams()
    for stream in (out, err):
        stream.write("ประชาชน 你好 ±\n")
        stream.flush()
        assert stream.buffer.getvalue() == "ประชาชน 你好 ±\n".encode()
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setattr(sys, "stderr", None)  # closed: left alone
    stdio.utf8_streams()
    tty.write("café 你好\n")  # what the terminal cannot show becomes "?"
    tty.flush()
    assert tty.buffer.getvalue() == "café ??\n".encode("cp1252")


def test_input_is_utf8_with_notepads_bom_or_what_pythonioencoding_names(
    monkeypatch,
):
    monkeypatch.delenv("PYTHONIOENCODING", raising=False)
    assert decode_input("\ufeff你好\n".encode()) == "你好\n"
    with pytest.raises(InputEncodingError) as info:
        decode_input(b"ok " + GBK_HELLO + b"\n")
    assert str(info.value) == (
        "standard input is not UTF-8 (byte 0xc4 at position 3 of a line); save "
        "it as UTF-8 or run with PYTHONIOENCODING=gbk."
    )
    monkeypatch.setenv("PYTHONIOENCODING", "gbk:strict")
    assert decode_input(GBK_HELLO) == "你好，请解释大语言模型。"
    with pytest.raises(InputEncodingError, match="not gbk text, the encoding "
                       "PYTHONIOENCODING names .* unset PYTHONIOENCODING"):  # fmt: skip
        decode_input(b"\x81\n")


def test_a_redirected_file_is_checked_whole_and_left_where_it_was(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("PYTHONIOENCODING", raising=False)
    path = tmp_path / "messages.txt"
    path.write_bytes(b"Hello\n" + "café\n".encode("cp1252"))
    with path.open("rb") as f:
        with pytest.raises(InputEncodingError) as info:
            check_input_file(f)
        assert f.tell() == 0
    assert "(byte 0xe9 at line 2, position 3)" in str(info.value)
    assert str(info.value).endswith("PYTHONIOENCODING=cp1252.")
    path.write_bytes("Hello\n你好\n".encode())
    with path.open("rb") as f:
        check_input_file(f)  # text: nothing said
        assert f.readline() == b"Hello\n"
    read, write = os.pipe()  # a pipe: read line by line, nothing taken here
    os.write(write, b"\xff\n")
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        check_input_file(pipe)
        assert pipe.read() == b"\xff\n"
    check_input_file(None)


WIDE = ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"]


@pytest.mark.parametrize("encoding", WIDE)
@pytest.mark.parametrize("how", ["file", "pipe"])
def test_utf16_and_utf32_with_a_byte_order_mark_are_read_as_such(
    tmp_path, monkeypatch, encoding, how
):
    """Notepad's "Unicode" (UTF-16 LE with its BOM) and the other wide
    encodings with theirs, whatever PYTHONIOENCODING says."""
    monkeypatch.setenv("PYTHONIOENCODING", "cp1252")
    data = "\ufeff你好\r\nsecond line\n".encode(encoding)
    path = tmp_path / "messages.txt"
    path.write_bytes(data)
    if how == "pipe":
        read, write = os.pipe()
        os.write(write, data)
        os.close(write)
        raw = os.fdopen(read, "rb")
    else:
        raw = path.open("rb")
    with raw, io.TextIOWrapper(raw) as stdin:
        lines = stdio.InputLines(stdin)
        assert [lines.readline() for _ in range(3)] == ["你好", "second line", None]


def test_a_wide_file_that_is_damaged_says_so_and_to_save_it_as_utf8(tmp_path):
    path = tmp_path / "messages.txt"
    path.write_bytes("\ufeffHello\n".encode("utf-16-le") + b"\x00\xdc")  # lone half
    with path.open("rb") as raw, io.TextIOWrapper(raw) as stdin:
        with pytest.raises(InputEncodingError) as info:
            stdio.InputLines(stdin).readline()
    assert str(info.value) == (
        "standard input starts with the byte-order mark of UTF-16 but is not "
        "UTF-16 text (byte 0x00 at byte 14); save it again as UTF-8."
    )


def test_another_encoding_is_advised_only_where_the_bytes_read_as_text(
    tmp_path, monkeypatch
):
    """cp1252 decodes almost any bytes: random ones are not sent to it."""
    monkeypatch.delenv("PYTHONIOENCODING", raising=False)
    monkeypatch.setattr(stdio.locale, "getpreferredencoding", lambda _: "UTF-8")
    # every byte value cp1252 decodes, as in a binary file
    noise = bytes(b for b in range(256) if b not in b"\x81\x8d\x8f\x90\x9d") * 4
    path = tmp_path / "noise.bin"
    path.write_bytes(noise)
    for check in (lambda: decode_input(noise), lambda: _check_file(path)):
        with pytest.raises(InputEncodingError) as info:
            check()
        assert "PYTHONIOENCODING" not in str(info.value)
        assert str(info.value).endswith(
            "nor text in gbk or cp1252; give it a text file saved as UTF-8."
        )
    # the advice reads every byte checked, not only the first bad line's
    path.write_bytes(GBK_HELLO + b"\ncaf\xe9\n")  # GBK reads line 1 only
    with pytest.raises(InputEncodingError) as info:
        _check_file(path)
    advised = str(info.value).rpartition("PYTHONIOENCODING=")[2].rstrip(".")
    path.read_bytes().decode(advised)


def _check_file(path: Path) -> None:
    with path.open("rb") as f:
        check_input_file(f)


def test_chat_answers_a_notepad_unicode_file(tiny_cli, tmp_path, monkeypatch, capsys):
    path = tmp_path / "messages.txt"
    path.write_bytes("\ufeff你好\r\n/history\r\n".encode("utf-16-le"))
    with path.open("rb") as raw, io.TextIOWrapper(raw) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        rc = cli.chat_main(["--device", "cpu", "--max-new-tokens", "2"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.count("Assistant: ") == 1 and "user: 你好\n" in out


def test_a_typed_line_the_terminal_cannot_read_is_skipped(
    tiny_cli, monkeypatch, capsys
):
    """At a terminal the reader can type the line again: one line, and the
    chat goes on (a file or a pipe ends it instead: below)."""
    typed = iter([UnicodeDecodeError("utf-8", b"\xc4\xe3", 0, 1, "bad"), "/quit"])

    def fake_input(prompt=""):
        item = next(typed)
        if isinstance(item, Exception):
            raise item
        return item

    monkeypatch.setattr(sys, "stdin", Console(io.BytesIO(), encoding="utf-8"))
    monkeypatch.setattr("builtins.input", fake_input)
    assert cli.chat_main(["--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert (
        "qwen3-chat: that line is not utf-8 text (bytes b'\\xc4' at position 0); "
        "it was skipped" in err
    )


# --------------------------------------------------------------------------
# The commands in real processes, under each code page
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return standin_env(tmp_path_factory)


def under(env: dict[str, str], code_page: str) -> dict[str, str]:
    return {**env, "PYTHONIOENCODING": code_page}


def run_to_file(args, env, tmp_path, name, stdin=None) -> tuple[bytes, str]:
    """(the bytes stdout wrote into a file, stderr) of a finished command."""
    out = tmp_path / name
    with out.open("wb") as f:
        proc = subprocess.run(
            args, stdin=stdin, stdout=f, stderr=subprocess.PIPE, env=env,
            timeout=600, cwd=REPO,
        )  # fmt: skip
    err = proc.stderr.decode("utf-8")
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "codec can't" not in err
    return out.read_bytes(), err


@pytest.mark.slow  # three 0.6B stand-in runs
def test_generate_writes_the_same_answer_under_every_code_page(
    env, tmp_path, tmp_path_factory
):
    """The issue's case: a Chinese prompt, --fast, answer redirected to a
    file; under GBK and cp1252 it was lost (rc 2, empty file)."""
    standin_files(tmp_path_factory, "base", tokenizer_only=False)
    args = [
        sys.executable,
        "-m",
        "utils.cli",
        "generate",
        "--prompt",
        "你好，请解释大语言模型。",
        "--max-new-tokens",
        "4",
        "--fast",
        "--device",
        "cpu",
        "--out-dir",
        str(standin_root(tmp_path_factory)),
    ]
    answers = {
        page: run_to_file(args, under(env, page), tmp_path, f"{page}.txt")[0]
        for page in CODE_PAGES
    }  # fmt: skip
    text = answers["utf-8"].decode("utf-8")
    assert text.strip() and not text.isascii()  # so a code page would show
    assert answers["gbk"] == answers["cp1252"] == answers["utf-8"]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return standin_files(tmp_path_factory, "reasoning", tokenizer_only=True)[0]


@pytest.mark.slow  # subprocesses (a tiny model, the real tokenizer)
def test_chat_answers_the_same_under_every_code_page(env, tokenizer_path, tmp_path):
    """A message typed in the code page's own encoding (what a Windows pipe
    gives with PYTHONIOENCODING set): the same answer, in UTF-8."""
    args = [sys.executable, "-c", CLI_DRIVER, str(tokenizer_path), "chat",
            "--fast", "--max-new-tokens", "6"]  # fmt: skip
    answers = {}
    for page in CODE_PAGES:
        message = tmp_path / f"{page}.in"
        message.write_bytes("Un café\n/history\n".encode(page))
        with message.open("rb") as stdin:
            answers[page] = run_to_file(
                args, under(env, page), tmp_path, f"{page}.txt", stdin
            )[0]
    text = answers["utf-8"].decode("utf-8")
    assert text.startswith("Assistant: ") and "user: Un café\n" in text
    assert not text.split("\n", 1)[0].isascii()  # the tiny model's answer
    assert answers["gbk"] == answers["cp1252"] == answers["utf-8"]


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize("how", ["pipe", "file"])
def test_chat_input_in_another_encoding_is_one_line_and_no_answer(
    env, tokenizer_path, tmp_path, how
):
    """GBK lines piped or redirected without PYTHONIOENCODING: one line that
    names the byte and the fix; a file is refused before any answer, even
    where its first line is plain ASCII."""
    data = GBK_HELLO + b"\n" if how == "pipe" else b"Hello\n" + GBK_HELLO + b"\n"
    args = [sys.executable, "-c", CLI_DRIVER, str(tokenizer_path), "chat",
            "--max-new-tokens", "2"]  # fmt: skip
    source = tmp_path / "in.txt"
    source.write_bytes(data)
    with source.open("rb") as f:
        proc = subprocess.run(
            args, stdin=f if how == "file" else None,
            input=data if how == "pipe" else None, capture_output=True,
            env={k: v for k, v in env.items() if k != "PYTHONIOENCODING"},
            timeout=300, cwd=REPO,
        )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err
    [line] = [x for x in err.splitlines() if x.startswith("qwen3-chat:")]
    where = "position 0 of a line" if how == "pipe" else "line 2, position 0"
    assert line == (
        f"qwen3-chat: error: standard input is not UTF-8 (byte 0xc4 at {where}); "
        "save it as UTF-8 or run with PYTHONIOENCODING=gbk."
    )
    assert b"Assistant" not in proc.stdout


BENCH_DRIVER = r"""
import json, sys
from utils.benchmark import runner as benchmark

rows = json.load(open(sys.argv[1], encoding="utf-8"))
benchmark.run_benchmark = lambda **kw: rows
sys.exit(benchmark.main(sys.argv[2:]))
"""


@pytest.mark.slow  # subprocesses
def test_benchmark_table_json_and_csv_are_the_same_under_every_code_page(env, tmp_path):
    """The report of a quick run (kv_cache, two tokens, on the tiny model;
    its rows given to the three runs, so they agree) to a file, --json and
    --csv: UTF-8 bytes alike (the table's header has a `±`)."""
    rows = tiny_run(["kv_cache"], max_new_tokens=2, repeats=1)
    rows[0]["note"] = "提示 ±"  # a field the CSV holds
    saved = tmp_path / "rows.json"
    saved.write_text(json.dumps(rows), encoding="utf-8")
    outputs = {}
    for page in CODE_PAGES:
        files = [tmp_path / f"{page}.json", tmp_path / f"{page}.csv"]
        args = [sys.executable, "-c", BENCH_DRIVER, str(saved), "--modes",
                "kv_cache", "--max-new-tokens", "2", "--json", str(files[0]),
                "--csv", str(files[1])]  # fmt: skip
        table, _ = run_to_file(args, under(env, page), tmp_path, f"{page}.txt")
        outputs[page] = [table] + [f.read_bytes() for f in files]
    assert "\nkv_cache " in outputs["utf-8"][0].decode("utf-8")
    assert "提示 ±" in outputs["utf-8"][2].decode("utf-8")  # the CSV
    assert outputs["gbk"] == outputs["cp1252"] == outputs["utf-8"]
