"""The ModelScope route of `china-network.zh.md`, run as the guide prints it.

The guide's block of commands is read from the page and run line by line in
an empty folder: each `uvx ... modelscope download ...` by a stand-in for
the `modelscope` command that fetches the named files from a loopback
"ModelScope" (an official Qwen3 folder of a tiny Qwen3 with the real
tokenizer, for the base and the reasoning model), each `uv run python -m
utils.hf_interop ...` by the command itself. Then, with every download
source unreachable and no stand-ins, the Chinese notebook 01 runs from top
to bottom and notebook 02's download cell finds the base weights: what a
reader behind the Great Firewall needs from the guide (notebook 01 once
failed there: it reads the reasoning tokenizer, which the guide's base-only
import did not bring).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import urllib.request
from pathlib import Path

import nbformat
import pytest
import torch

from tests._view_fixtures import TINY_CFG
from tests.fake_hosts import FakeHost, Resource
from tests.markdown_text import code_snippets
from tests.tiny import tiny_state_dict

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "ch02" / "02_setup-tips" / "china-network.zh.md"
ZH_NOTEBOOKS = ROOT / "ch02" / "01_main-chapter-code" / "zh"
ROUTE_HEADING = "### 方案 B：ModelScope + `import-qwen3`"
REPOS = {"Qwen/Qwen3-0.6B-Base": 151643, "Qwen/Qwen3-0.6B": 151645}  # eos


def route_commands() -> list[str]:
    """The commands of the guide's first code block under the ModelScope
    heading (continuation lines joined)."""
    text = GUIDE.read_text(encoding="utf-8")
    section = text[text.index(ROUTE_HEADING) :]
    block = section[section.index("```bash") : section.index("```\n", 8) + 4]
    return code_snippets(block)


def official_folders(folder: Path) -> dict[str, dict[str, bytes]]:
    """{repo: {file name: bytes}}: what ModelScope serves for each repo, a
    tiny Qwen3 in bfloat16 as `save_pretrained` lays it out."""
    from utils.download.standin import write_standin_tokenizer
    from utils.hf_interop import export_hf_folder

    tokenizer = folder / "tokenizer.json"
    write_standin_tokenizer(tokenizer)
    sd = tiny_state_dict(seed=3, cfg=TINY_CFG)
    repos = {}
    for repo, eos in REPOS.items():
        name = repo.split("/")[1]
        out = export_hf_folder(sd, TINY_CFG, folder / name, tokenizer,
                               dtype=torch.bfloat16, eos_token_id=eos)  # fmt: skip
        repos[repo] = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    return repos


def modelscope(url: str, argv: list[str], cwd: Path) -> None:
    """`modelscope download --model REPO [FILE ...] --local_dir DIR`: the
    named files of REPO (all of them without names) into DIR."""
    assert argv[0] == "download", argv
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--local_dir", required=True)
    p.add_argument("files", nargs="*")
    args = p.parse_args(argv[1:])
    listing = urllib.request.urlopen(f"{url}/models/{args.model}/files").read()
    local = cwd / args.local_dir
    local.mkdir(parents=True, exist_ok=True)
    for name in args.files or listing.decode().split():
        with urllib.request.urlopen(f"{url}/models/{args.model}/{name}") as got:
            (local / name).write_bytes(got.read())


def run_guide(commands: list[str], url: str, cwd: Path) -> list[str]:
    """Run the guide's commands; what each one ran as."""
    from utils.hf_interop import main as hf_interop

    ran = []
    for command in commands:
        words = shlex.split(command.split(" #", 1)[0])
        if len(words) == 1 and "=" in words[0]:  # MIRROR=...
            ran.append("set " + words[0].split("=")[0])
        elif words[0] == "uvx":
            at = words.index("--from")
            assert words[at + 1 : at + 3] == ["modelscope", "modelscope"], words
            modelscope(url, words[at + 3 :], cwd)
            ran.append("modelscope " + " ".join(words[at + 3 :]))
        elif words[:5] == ["uv", "run", "python", "-m", "utils.hf_interop"]:
            assert hf_interop(words[5:]) == 0, command
            ran.append("import-qwen3 " + " ".join(words[6:]))
        else:
            raise AssertionError(f"the test does not know this command: {command}")
    return ran


@pytest.fixture
def reader(tmp_path, monkeypatch):
    """A reader's machine: an empty folder to type in, a model store of its
    own, no stand-ins, every download source unreachable."""
    from reasoning_from_scratch import qwen3

    for var in [v for v in os.environ if v.startswith("QWEN3_")]:
        monkeypatch.delenv(var)
    store = tmp_path / "store"
    monkeypatch.setenv("QWEN3_MODEL_STORE", str(store))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("QWEN3_NO_WIDGETS", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("QWEN3_BACKUP_URL", "http://127.0.0.1:9")
    # the command accepts Qwen3-0.6B only; here "0.6B" is the tiny config
    tiny = {**TINY_CFG, "dtype": torch.bfloat16}
    monkeypatch.setattr(qwen3, "QWEN_CONFIG_06_B", tiny)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(home)
    return home, store


@pytest.mark.slow  # a notebook kernel
def test_the_guides_commands_leave_notebooks_01_and_02_runnable(reader, tmp_path):
    from nbclient import NotebookClient

    from tests.sigint_guard import execute_notebook

    home, store = reader
    with FakeHost() as host:
        for repo, files in official_folders(tmp_path / "official").items():
            listing = " ".join(sorted(files)).encode()
            host.resources[f"/models/{repo}/files"] = Resource(listing)
            for name, data in files.items():
                host.resources[f"/models/{repo}/{name}"] = Resource(data)
        ran = run_guide(route_commands(), host.url, home)
        fetched = {s.path for s in host.seen("GET")}
    assert ran == [
        "set MIRROR",
        "modelscope download --model Qwen/Qwen3-0.6B-Base --local_dir Qwen3-0.6B-Base",
        "import-qwen3 Qwen3-0.6B-Base --kind base --store",
        "modelscope download --model Qwen/Qwen3-0.6B config.json tokenizer.json "
        "--local_dir Qwen3-0.6B",
        "import-qwen3 Qwen3-0.6B --kind reasoning --tokenizer-only --store",
    ]
    # the reasoning model's weights were neither fetched nor made
    assert not [p for p in fetched if "Qwen3-0.6B/model" in p]
    assert sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) == [
        "qwen3-0.6B-base.pth", "tokenizer-base.json", "tokenizer-reasoning.json"
    ]  # fmt: skip

    # Notebook 01, Chinese, top to bottom, in a notebook folder of its own
    folder = tmp_path / "repo" / "ch02" / "01_main-chapter-code" / "zh"
    folder.mkdir(parents=True)
    shutil.copy(ZH_NOTEBOOKS / "01_tokenizer.ipynb", folder)
    nb = nbformat.read(folder / "01_tokenizer.ipynb", as_version=4)
    where = {"metadata": {"path": str(folder)}}
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources=where)
    execute_notebook(client)
    errors = [o for c in nb.cells for o in c.get("outputs", [])
              if o.output_type == "error"]  # fmt: skip
    assert errors == []
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "151645" in text and "STAND-IN" not in text  # the reasoning EOS, real

    # Notebook 02's download cell, as written, finds the base weights
    from utils.download.provenance import is_verified

    nb02 = nbformat.read(ZH_NOTEBOOKS / "02_load-model.ipynb", as_version=4)
    code = [c.source for c in nb02.cells if c.cell_type == "code"]
    cells = [source for source in code if "download_qwen3_small(" in source]
    namespace: dict = {}
    os.chdir(folder)
    for source in ["from utils.download import download_qwen3_small", *cells]:
        exec(compile(source, "<notebook 02>", "exec"), namespace)
    files = namespace["files"]
    assert files.model.name == "qwen3-0.6B-base.pth" and not files.standin
    assert is_verified(files.model)


def test_the_guide_shows_the_commands_the_test_runs():
    """The block the test runs is the one under the ModelScope heading, and
    every `uv export` command the guide shows is quiet (tests/test_mirror.py:
    without `--quiet` it also prints the whole file, 4,091 lines here)."""
    commands = route_commands()
    assert any("--tokenizer-only" in c for c in commands)
    text = GUIDE.read_text(encoding="utf-8")
    exports = [c for c in code_snippets(text) if c.startswith("uv export -")]
    assert len(exports) == 2 and all("--quiet" in c.split() for c in exports)


def test_a_tokenizer_only_import_checks_whose_tokenizer_it_is(tmp_path, capsys):
    """config.json says which model the tokenizer is of: the base model's is
    refused as the reasoning one; no config, one line saying what to fetch;
    nothing written either way, and the right one writes the tokenizer only."""
    import json

    from utils.download.standin import write_standin_tokenizer
    from utils.hf_interop import main as hf_interop

    folder, out = tmp_path / "Qwen3-0.6B", tmp_path / "qwen3"
    folder.mkdir()
    write_standin_tokenizer(folder / "tokenizer.json")
    argv = ["import-qwen3", str(folder), "--kind", "reasoning", "--tokenizer-only",
            "--out-dir", str(out)]  # fmt: skip
    assert hf_interop(argv) == 2
    assert "No config.json in" in capsys.readouterr().err and not out.exists()
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 151643}))
    assert hf_interop(argv) == 2
    assert "looks like the base model" in capsys.readouterr().err
    assert not out.exists()
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 151645}))
    assert hf_interop(argv) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "tokenizer-reasoning.json"
    ]
