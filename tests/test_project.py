"""Project files that readers rely on stay consistent with each other."""

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the dev group installs tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
# Installed by the platform (Colab, Kaggle, ...) and kept as it is there.
PLATFORM_PROVIDED = {"torch", "jupyterlab", "ipywidgets"}


def _normalise(spec: str) -> tuple[str, str]:
    req = Requirement(spec)
    name = req.name.lower().replace("_", "-")
    return name, str(req.specifier)


def _requirement_lines(name: str) -> list[str]:
    lines = (ROOT / name).read_text().splitlines()
    return [ln for ln in lines if ln.strip() and not ln.startswith(("#", "-e"))]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _locked(name: str) -> dict:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (package,) = [p for p in lock["package"] if p["name"] == name]
    return package


def test_requirements_txt_matches_pyproject():
    project = _pyproject()["project"]
    wanted = {_normalise(d) for d in project["dependencies"]}
    reqs = _requirement_lines("requirements.txt")
    assert {_normalise(r) for r in reqs} == wanted
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    assert "-e ." in lines, "pip users also need this repository's utils package"


def test_colab_requirements_keep_the_platforms_torch():
    """requirements-colab.txt names no torch-pinning package, and with the
    book's package and utils installed --no-deps nothing needed is missing."""
    colab = dict(_normalise(r) for r in _requirement_lines("requirements-colab.txt"))
    assert not PLATFORM_PROVIDED & set(colab)
    assert "reasoning-from-scratch" not in colab  # it pins torch: --no-deps
    ours = dict(_normalise(d) for d in _pyproject()["project"]["dependencies"])
    book = _locked("reasoning-from-scratch")
    book_deps = {_normalise(d["name"])[0] for d in book["dependencies"]}
    needed = (set(ours) | book_deps) - PLATFORM_PROVIDED - {"reasoning-from-scratch"}
    missing = needed - set(colab)
    assert not missing, f"missing from requirements-colab.txt: {sorted(missing)}"
    for name, spec in ours.items():
        if name in colab:
            assert colab[name] == spec, f"{name}: {colab[name]} vs pyproject {spec}"
    # None of them drags torch in through its own dependencies (per the lock).
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    deps = {
        p["name"]: {d["name"] for d in p.get("dependencies", [])}
        for p in lock["package"]
    }
    assert set(colab) <= set(deps), "requirements-colab.txt: only locked packages"
    todo, seen = list(colab), set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(deps.get(name, ()))
    assert "torch" not in seen
    # The documented --no-deps command installs the locked book release.
    text = (ROOT / "requirements-colab.txt").read_text()
    assert (
        f"pip install --no-deps -e . reasoning-from-scratch=={book['version']}" in text
    )


def test_python_version_file_is_a_supported_python():
    pinned = (ROOT / ".python-version").read_text().strip()
    assert re.fullmatch(r"3\.\d+", pinned), pinned
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert Version(f"{pinned}.0") in requires
    lock_requires = tomllib.loads((ROOT / "uv.lock").read_text())["requires-python"]
    assert Version(f"{pinned}.0") in SpecifierSet(lock_requires.replace(" ", ""))


def test_requires_python_floor_can_run_the_tests():
    """The dev group brings what the tests import on the oldest Python."""
    dev = [Requirement(r) for r in _pyproject()["dependency-groups"]["dev"]]
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    (floor,) = [s.version for s in requires if s.operator == ">="]
    env = {
        "python_version": ".".join(floor.split(".")[:2]),
        "python_full_version": floor,
    }
    if Version(floor) < Version("3.11"):
        assert any(r.name == "tomli" and r.marker.evaluate(env) for r in dev)


INSTALLING = ROOT / "ch02" / "02_setup-tips" / "python-and-uv.md"


def test_newest_torch_script_is_valid_bash():
    script = ROOT / "scripts" / "check_newest_torch.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "VERDICT" in script.read_text()


def test_the_download_sizes_match_the_lock():
    """The per-platform table of the installing page is what uv.lock says
    today (the README rounds its total)."""
    if shutil.which("uv") is None:
        pytest.skip("needs uv (the sizes are read with `uv export`)")
    path = ROOT / "scripts" / "lock_download_sizes.py"
    spec = importlib.util.spec_from_file_location("lock_download_sizes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = {
        ln.split("|")[1].strip(): ln
        for ln in INSTALLING.read_text(encoding="utf-8").splitlines()
        if ln.startswith("| ") and " GB |" in ln
    }
    for label, (stack, rest) in module.sizes([]).items():
        (row,) = [r for name, r in rows.items() if name.startswith(label)]
        for size in (stack, rest, stack + rest):
            assert f"{size / 1e9:.2f} GB" in row, (label, row)
        if label.startswith("Linux x86-64"):
            readme = (ROOT / "README.md").read_text(encoding="utf-8")
            assert f"{(stack + rest) / 1e9:.1f} GB on Linux x86-64" in readme


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


def test_gpu_check_script_is_valid_bash_and_uses_real_modes():
    from utils.benchmark.runner import mode_names

    script = ROOT / "scripts" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    modes = script.read_text().split("--modes ", 1)[1].split()[0].split(",")
    assert modes and set(modes) <= set(mode_names())
