"""Project files that readers rely on stay consistent with each other."""

from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _normalise(spec: str) -> tuple[str, str]:
    req = Requirement(spec)
    name = req.name.lower().replace("_", "-")
    return name, str(req.specifier)


def test_requirements_txt_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_normalise(d) for d in project["dependencies"]}
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    reqs = [ln for ln in lines if ln.strip() and not ln.startswith(("#", "-e"))]
    assert {_normalise(r) for r in reqs} == wanted
    assert "-e ." in lines, "pip users also need this repository's utils package"


def test_readme_names_the_two_commands_that_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert "uv run jupyter lab" in readme
    assert "uv run pytest" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "uv run --locked pytest" in ci


def test_gitignore_keeps_weights_out():
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    for pattern in ("qwen3/", "*.pth", "*.safetensors"):
        assert pattern in ignored
