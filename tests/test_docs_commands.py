"""Every project command the docs print runs as printed.

The READMEs, the pages in docs/ and the set-up tips show `uv run python -m
utils.<command> ...`, `uv run qwen3-generate ...` and `uv run python
scripts/...` lines. Each one is parsed by the command's own argument parser
(required options, choices and types are checked without doing the work),
and each script it names exists. A line a reader would paste and see fail
with "the following arguments are required" fails here first.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.markdown_text import code_snippets
from utils.benchmark import runner as benchmark
from utils.cli import batch_parser
from utils.cli import commands as cli
from utils.hf_interop import convert as hf_interop

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [*ROOT.glob("README*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("ch02/**/*.md")],
    key=lambda p: str(p),
)
COMMANDS_PAGE = ROOT / "docs" / "commands.md"
# what starts a project command, after an optional `uv run [options]`
COMMAND = re.compile(
    r"(?:uv run (?:--\S+ (?:\S+ )?)*)?"
    r"(python -m utils\.(?:cli|benchmark|hf_interop|batch)\b"
    r"|qwen3-(?:generate|chat|batch)\b"
    r"|python scripts/\S+)"
)
PARSERS = {
    "python -m utils.benchmark": benchmark.build_parser,
    "python -m utils.hf_interop": hf_interop.build_parser,
    "qwen3-generate": cli.generate_parser,
    "qwen3-chat": cli.chat_parser,
    "qwen3-batch": batch_parser,
    "python -m utils.batch": batch_parser,
}


def doc_commands() -> list[tuple[str, str]]:
    """(doc file, command) for every project command the docs show."""
    found = []
    for doc in DOCS:
        for snippet in code_snippets(doc.read_text(encoding="utf-8")):
            snippet = snippet.split(" #", 1)[0]  # a trailing comment
            for m in COMMAND.finditer(snippet):
                rest = snippet[m.start(1) :].strip()
                if "..." in rest or re.search(r"\w\|\w", rest) or rest in PARSERS:
                    continue  # prose shorthand such as `generate|chat ...`, a name
                found.append((str(doc.relative_to(ROOT)), rest))
    return found


COMMANDS = doc_commands()


def test_the_docs_show_the_commands():
    names = " ".join(c for _, c in COMMANDS)
    for command in ("utils.benchmark", "utils.hf_interop", "qwen3-generate",
                    "qwen3-chat", "qwen3-batch", "scripts/"):  # fmt: skip
        assert command in names, command


def _parse(command: str) -> None:
    words = shlex.split(command)
    if words[:2] == ["python", "-m"] and words[2] == "utils.cli":
        name = {"generate": "qwen3-generate", "chat": "qwen3-chat"}[words[3]]
        args = words[4:]
    elif words[0] == "python" and words[1] == "-m":
        name, args = " ".join(words[:3]), words[3:]
    elif words[0] == "python":
        script = ROOT / words[1]
        assert script.is_file(), f"{words[1]} does not exist"
        return
    else:
        name, args = words[0], words[1:]
    parser = PARSERS[name]()
    try:
        parser.parse_args(args)
    except SystemExit as exc:
        assert exc.code == 0, f"{command!r} does not parse"


@pytest.mark.parametrize(
    ("doc", "command"), COMMANDS, ids=[f"{d}:{c[:40]}" for d, c in COMMANDS]
)
def test_each_command_in_the_docs_parses(doc, command, capsys):
    _parse(command)
    err = capsys.readouterr().err
    assert "error" not in err, f"{doc}: {command!r}: {err.strip()}"


def test_a_command_missing_a_required_option_is_caught():
    with pytest.raises(AssertionError, match="does not parse"):
        _parse("python -m utils.hf_interop import-qwen3 PATH")


def test_imports_in_the_docs_fill_a_folder_the_notebooks_read():
    """Every `import-qwen3` the docs print puts the files where notebooks
    look: the model store (`--store`, every folder links from it), or the
    `qwen3/` folder of the notebooks in the page's language (a Chinese page
    must not fill the English notebooks' folder)."""
    imports = [(d, c) for d, c in COMMANDS if "import-qwen3" in c]
    assert any(d.endswith(".zh.md") for d, _ in imports)
    for doc, command in imports:
        words = shlex.split(command)
        if "--store" in words:
            continue
        assert "--out-dir" in words, f"{doc}: {command!r} fills ./qwen3"
        folder = words[words.index("--out-dir") + 1].rstrip("/")
        wanted = "ch02/01_main-chapter-code" + ("/zh" if ".zh." in doc else "")
        assert folder == f"{wanted}/qwen3", f"{doc}: {command!r}"


# "copy the qwen3/ folder ...", "把整个 `qwen3/` 文件夹……复制过去", "cp -r ... qwen3"
COPY_MODEL_FILES = re.compile(
    r"\b[Cc]opy (?!of\b)(?:the |your |both |that )?[^.]{0,60}?(?:qwen3/|model files)"
    r"|把[^。]{0,80}复制过去|复制[^。]{0,20}(?:qwen3/|模型文件)|cp -r[^\n]*qwen3"
)


def test_no_page_tells_a_reader_to_copy_model_files():
    """The model store links the files into each notebook folder; a page
    that says to copy `qwen3/` between folders is out of date."""
    pages = [*DOCS, *ROOT.glob("ch02/**/*.ipynb")]
    said = [
        f"{p.relative_to(ROOT)}: {m.group(0)!r}"
        for p in pages
        for m in COPY_MODEL_FILES.finditer(p.read_text(encoding="utf-8"))
    ]
    assert not said, said


# What the commands page says a failed download prints, and what it does print.
DOWNLOAD_HINTS = {  # the page's words -> what the message must contain
    "proxy": "HTTPS_PROXY",
    "captive portal": "captive portal",
    "`HF_ENDPOINT`": "HF_ENDPOINT=https://hf-mirror.com",
    "`QWEN3_DOWNLOAD_TIMEOUT`": "QWEN3_DOWNLOAD_TIMEOUT=",
    "ModelScope": "ModelScope",
    "`import-qwen3`": "import-qwen3 FOLDER --kind base",
    "`QWEN3_STANDIN=1`": "QWEN3_STANDIN=1",
}


def readme_failed_download() -> str:
    text = " ".join(COMMANDS_PAGE.read_text(encoding="utf-8").split())
    start = text.index("A failed download ends the same way")
    return text[start : text.index(".", text.index("lines", start))]


@pytest.mark.slow  # a subprocess that imports torch
def test_a_failed_download_prints_what_the_readme_says(tmp_path):
    """Offline, `qwen3-generate` ends with progress lines (each source as it
    fails), then one `error:` line, the addresses tried and the hints the
    commands page lists; about as many lines as it says; exit status 2."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("QWEN3_")}
    env.update(HOME=str(tmp_path), QWEN3_MODEL_STORE=str(tmp_path / "store"),
               HF_ENDPOINT="http://127.0.0.1:9", QWEN3_BACKUP_URL="http://127.0.0.1:9",
               XDG_CACHE_HOME=str(tmp_path / "cache"))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "utils.cli", "generate", "--prompt", "hi"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [
        i for i, line in enumerate(lines) if line.startswith("qwen3-generate: error: ")
    ]
    assert len(errors) == 1, proc.stderr
    before, after = lines[: errors[0]], "\n".join(lines[errors[0] :])
    assert sum("failed: connection refused" in line for line in before) == 2
    assert after.index("Tried:") < after.index("What you can try:")
    said = readme_failed_download()
    for words, shown in DOWNLOAD_HINTS.items():
        assert words in said, words
        assert shown in after, shown
    about = int(re.search(r"about (\d+) lines", said).group(1))
    assert abs(len(lines) - about) <= 6, (len(lines), about)
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())


def test_pages_that_say_no_sync_say_why():
    """`--no-sync` on every later `uv run` needs its reason beside it: a
    plain `uv run` syncs `.venv` to `uv.lock` and puts PyPI's torch back."""
    for doc in DOCS:
        text = " ".join(doc.read_text(encoding="utf-8").split())
        if "--no-sync" in text and "torch-backend" in text:
            assert re.search(r"uv run`? (first )?(syncs|makes|会先)", text) or (
                "会先让 `.venv` 与 `uv.lock` 一致" in text
            ), doc.name
