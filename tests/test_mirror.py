"""The PyPI-mirror recipe of the setup tips, checked against uv itself.

A throw-away project is locked against a loopback "PyPI"; then that PyPI goes
away and only a loopback mirror (same files, plus a newer release) is left,
as for a reader in mainland China. The test shows what the Chinese setup tips
claim: `--locked` with a mirror fails, a plain sync rewrites `uv.lock`,
`--frozen` ignores the mirror, and the recipe (export the lock, `uv pip sync`
from the mirror) installs exactly the locked versions and leaves the lock
alone, after which `uv run --locked` works offline.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

UV = os.environ.get("UV") or shutil.which("uv")
pytestmark = pytest.mark.skipif(UV is None, reason="needs the uv executable")


def build_wheel(folder: Path, name: str, version: str, requires=()) -> Path:
    """A minimal pure-Python wheel: one module that knows its version."""
    dist = f"{name.replace('-', '_')}-{version}"
    module = name.replace("-", "_")
    files = {
        f"{module}.py": f"__version__ = {version!r}\n",
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{path},sha256={b64},{len(text.encode())}")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(
        record + [f"{dist}.dist-info/RECORD,,"]
    )
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(zipfile.ZipInfo(path, (2020, 1, 1, 0, 0, 0)), text)
    return wheel


def write_index(root: Path, wheels: list[Path]) -> None:
    """A PEP 503 simple index: root/simple/<name>/index.html + root/files/."""
    (root / "files").mkdir(parents=True)
    by_name: dict[str, list[Path]] = {}
    for wheel in wheels:
        shutil.copy(wheel, root / "files" / wheel.name)
        by_name.setdefault(wheel.name.split("-")[0].replace("_", "-"), []).append(wheel)
    for name, group in by_name.items():
        links = "".join(
            f'<a href="../../files/{w.name}#sha256='
            f'{hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n'
            for w in group
        )
        page = root / "simple" / name / "index.html"
        page.parent.mkdir(parents=True)
        page.write_text(f"<html><body>\n{links}</body></html>\n")


class Index:
    """A loopback HTTP server over a folder that records the paths it served."""

    def __init__(self, root: Path) -> None:
        served = self.served = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):  # noqa: N802 - http.server's naming
                served.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(
            target=self.server.serve_forever, args=(0.005,), daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def world(tmp_path):
    """(project folder, env for uv, the mirror) after locking against "PyPI"."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    old = [
        build_wheel(wheels, "mirrortest-alpha", "1.0"),
        build_wheel(wheels, "mirrortest-beta", "1.0", ["mirrortest-alpha>=1.0"]),
    ]
    newer = build_wheel(wheels, "mirrortest-alpha", "2.0")
    write_index(tmp_path / "pypi", old)
    write_index(tmp_path / "mirror", old + [newer])

    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "mirror-demo"\nversion = "0.1.0"\n'
        f'requires-python = ">={sys.version_info[0]}.{sys.version_info[1]}"\n'
        'dependencies = ["mirrortest-beta"]\n'
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("UV_", "VIRTUAL_ENV", "PIP_"))
    }
    env.update(
        UV_CACHE_DIR=str(tmp_path / "uv-cache"),
        UV_NO_CONFIG="1",
        UV_PYTHON_DOWNLOADS="never",
        UV_HTTP_RETRIES="0",  # the unreachable "PyPI" fails at once
        NO_COLOR="1",
    )
    pypi = Index(tmp_path / "pypi")
    try:
        run(["lock", "--python", sys.executable, "--default-index", pypi.url],
            project, env)  # fmt: skip
    finally:
        pypi.close()  # from here on "PyPI" is unreachable
    mirror = Index(tmp_path / "mirror")
    yield project, env, mirror
    mirror.close()


def venv_python(project: Path) -> str:
    scripts = "Scripts/python.exe" if os.name == "nt" else "bin/python"
    return str(project / ".venv" / scripts)


def run(args, cwd, env, ok=True):
    # Every command names its interpreter or runs in the project, so no uv
    # call here can touch the environment pytest itself runs in.
    assert args[0] in {"lock", "sync", "export", "run"} or "--python" in args
    proc = subprocess.run(
        [UV, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    if ok and proc.returncode != 0:
        raise AssertionError(f"uv {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def test_mirror_recipe_keeps_the_lock_and_its_versions(world):
    project, env, mirror = world
    lock = (project / "uv.lock").read_bytes()
    assert b"mirrortest-alpha" in lock and b'version = "1.0"' in lock
    with_mirror = {**env, "UV_DEFAULT_INDEX": mirror.url}

    # --locked refuses: the lock names another index than the one configured
    proc = run(["sync", "--locked"], project, with_mirror, ok=False)
    assert proc.returncode != 0 and "--locked" in proc.stderr
    mirror.served.clear()
    # --frozen installs from the URLs in the lock (unreachable "PyPI"), never
    # asking the mirror
    proc = run(["sync", "--frozen"], project, with_mirror, ok=False)
    assert proc.returncode != 0 and not mirror.served
    assert (project / "uv.lock").read_bytes() == lock

    # The recipe: the lock as a hashed requirements file, installed from the
    # mirror; the lock is only read.
    req = project.parent / "requirements-locked.txt"
    # as the guide exports it: --quiet, or uv prints the whole file too
    loud = run(
        ["export", "--frozen", "--no-emit-project", "-o", str(req)], project, env
    )
    assert "mirrortest-alpha==1.0" in loud.stdout
    quiet = ["export", "--frozen", "--quiet", "--no-emit-project", "-o", str(req)]
    assert run(quiet, project, env).stdout == ""
    assert "mirrortest-alpha==1.0" in req.read_text()
    assert "--hash=sha256:" in req.read_text()
    run(
        [
            "venv",
            "--allow-existing",
            "--python",
            sys.executable,
            str(project / ".venv"),
        ],
        project,
        env,
    )
    run(["pip", "sync", "--python", venv_python(project),
         "--default-index", mirror.url, str(req)], project, env)  # fmt: skip
    assert any(p.endswith(".whl") for p in mirror.served)
    assert (project / "uv.lock").read_bytes() == lock

    # Everyday commands stay as in the English README, offline even.
    offline = {**env, "UV_OFFLINE": "1"}
    code = "import mirrortest_alpha as a, mirrortest_beta as b; print(a.__version__)"
    proc = run(["run", "--locked", "python", "-c", code], project, offline)
    assert proc.stdout.strip() == "1.0"  # the locked version, not the mirror's 2.0
    assert (project / "uv.lock").read_bytes() == lock

    # ...plain `uv run` too, and `--frozen` where a mirror is configured
    # globally (e.g. in uv.toml): the environment matches, nothing is fetched.
    for args, extra in ((["run"], {}), (["run", "--frozen"], with_mirror)):
        served = len(mirror.served)
        proc = run([*args, "python", "-c", code], project, {**offline, **extra})
        assert proc.stdout.strip() == "1.0" and len(mirror.served) == served
    assert (project / "uv.lock").read_bytes() == lock

    # What the recipe avoids: a plain sync re-resolves and rewrites uv.lock.
    run(["sync"], project, with_mirror)
    rewritten = (project / "uv.lock").read_text()
    assert mirror.url in rewritten and rewritten.encode() != lock


def test_recipe_requirements_refuse_a_tampered_wheel(world, tmp_path):
    project, env, mirror = world
    req = tmp_path / "req.txt"
    run(["export", "--frozen", "--no-emit-project", "-o", str(req)], project, env)
    wheel = next((tmp_path / "mirror" / "files").glob("mirrortest_alpha-1.0-*"))
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("extra.txt", "changed by the mirror")
    run(
        [
            "venv",
            "--allow-existing",
            "--python",
            sys.executable,
            str(project / ".venv"),
        ],
        project,
        env,
    )
    proc = run(["pip", "sync", "--python", venv_python(project),
                "--default-index", mirror.url, str(req)], project, env,
               ok=False)  # fmt: skip
    assert proc.returncode != 0 and "hash" in proc.stderr.lower()
