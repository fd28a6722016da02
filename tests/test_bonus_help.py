"""Every option of every bonus script says in `--help` what it does and its
default (`chat_ttft.py --help` once listed bare option names)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

BONUS = Path(__file__).resolve().parents[1] / "ch02" / "03_fast-decoding"
SCRIPTS = sorted(BONUS.glob("*.py"))


def parser_of(path: Path) -> argparse.ArgumentParser:
    spec = importlib.util.spec_from_file_location(f"bonus_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the scripts do no work at import
    return module._parser()


def _formatted(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    formatter.add_argument(action)
    return " ".join(formatter.format_help().split())


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_option_says_what_it_does_and_its_default(path):
    parser = parser_of(path)
    assert parser.description
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        name = action.option_strings[-1]
        assert action.help and len(action.help.split()) >= 2, (path.name, name)
        shown = _formatted(parser, action)
        if isinstance(action, argparse._StoreTrueAction):
            continue  # a switch: off unless given
        if action.default in (None, "", []):
            assert "default" in action.help, f"{path.name} {name}: say the default"
        else:
            assert f"(default: {action.default})" in shown, (path.name, shown)


def test_the_test_sees_every_script():
    assert {p.name for p in SCRIPTS} >= {"agreement.py", "busy_machine.py",
                                         "chat_ttft.py", "prefill_rate.py",
                                         "step_bandwidth.py"}  # fmt: skip
