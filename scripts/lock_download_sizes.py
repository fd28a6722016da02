"""How much the default install downloads on each platform, read from uv.lock.

Usage (from the repository root): uv run python scripts/lock_download_sizes.py

For each platform it takes the packages that `uv export` lists for the default
install (the project's dependencies plus the dev group), keeps those whose
markers match the platform, picks the wheel pip or uv would choose there and
adds up the sizes recorded in the lock. Nothing is downloaded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PY = (3, 11)  # the Python in .python-version
TORCH_STACK = ("torch", "triton", "nvidia-", "cuda-")

_MANYLINUX = [f"manylinux_2_{m}" for m in range(39, 4, -1)]
_MANYLINUX += ["manylinux2014", "manylinux2010", "manylinux1"]
_MAC_ARCHS = ("arm64", "universal2")
PLATFORMS: dict[str, tuple[dict[str, str], list[str]]] = {
    "Linux x86-64": (
        {"sys_platform": "linux", "platform_machine": "x86_64"},
        [f"{p}_x86_64" for p in _MANYLINUX] + ["linux_x86_64"],
    ),
    "Linux aarch64": (
        {"sys_platform": "linux", "platform_machine": "aarch64"},
        [f"{p}_aarch64" for p in _MANYLINUX] + ["linux_aarch64"],
    ),
    "macOS arm64": (
        {"sys_platform": "darwin", "platform_machine": "arm64"},
        [f"macosx_{v}_0_{arch}" for v in range(15, 10, -1) for arch in _MAC_ARCHS],
    ),
    "Windows x86-64": (
        {"sys_platform": "win32", "platform_machine": "AMD64"},
        ["win_amd64"],
    ),
}


def _environment(overrides: dict[str, str]) -> dict[str, str]:
    """Marker environment for CPython PY on the given platform."""
    system = {"linux": "Linux", "darwin": "Darwin", "win32": "Windows"}
    env = {
        "python_version": f"{PY[0]}.{PY[1]}",
        "python_full_version": f"{PY[0]}.{PY[1]}.7",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "nt" if overrides["sys_platform"] == "win32" else "posix",
        "platform_system": system[overrides["sys_platform"]],
        "extra": "",
    }
    env.update(overrides)
    return env


def _tag_order(platform_tags: list[str]) -> dict[Tag, int]:
    """Preference of each wheel tag on that platform (lower is better)."""
    tags = list(cpython_tags(PY, platforms=platform_tags))
    tags += list(compatible_tags(PY, f"cp{PY[0]}{PY[1]}", platform_tags))
    return {tag: i for i, tag in enumerate(tags)}


def _pick_size(package: dict, order: dict[Tag, int]) -> int:
    """Size of the wheel chosen for the platform (the sdist if none fits)."""
    best: tuple[int, int] | None = None
    for wheel in package.get("wheels", []):
        name = wheel["url"].rsplit("/", 1)[-1]
        ranks = [order[t] for t in parse_wheel_filename(name)[3] if t in order]
        if ranks and (best is None or min(ranks) < best[0]):
            best = (min(ranks), wheel["size"])
    if best is not None:
        return best[1]
    if "sdist" in package:
        return package["sdist"]["size"]
    name, version = package["name"], package["version"]
    raise LookupError(f"{name} {version}: no file for this platform in uv.lock")


def sizes(export_args: list[str]) -> dict[str, tuple[int, int]]:
    """(torch stack, everything else) download bytes per platform."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    packages = {(p["name"], p["version"]): p for p in lock["package"]}
    exported = subprocess.run(
        ["uv", "export", "--frozen", "--no-hashes", "--no-annotate", "--no-header"]
        + ["--no-emit-project", *export_args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    reqs = [Requirement(ln) for ln in exported.splitlines() if ln and ln[0] != "#"]
    result = {}
    for label, (overrides, platform_tags) in PLATFORMS.items():
        env, order = _environment(overrides), _tag_order(platform_tags)
        stack = rest = 0
        for req in reqs:
            if req.marker and not Marker(str(req.marker)).evaluate(env):
                continue
            name = canonicalize_name(req.name)
            version = next(iter(req.specifier)).version
            size = _pick_size(packages[(name, version)], order)
            if name.startswith(TORCH_STACK):
                stack += size
            else:
                rest += size
        result[label] = (stack, rest)
    return result


def main() -> None:
    """Print one table: download size per platform, with and without dev tools."""
    default, runtime = sizes([]), sizes(["--no-dev"])
    gb = 1e9
    print(f"Python {PY[0]}.{PY[1]}; sizes of the wheels in uv.lock, in GB (1e9 bytes)")
    print(f"{'platform':16} {'torch+CUDA':>10} {'other':>7} {'total':>7} {'no dev':>7}")
    for label, (stack, rest) in default.items():
        no_dev = sum(runtime[label])
        print(
            f"{label:16} {stack / gb:10.2f} {rest / gb:7.2f} "
            f"{(stack + rest) / gb:7.2f} {no_dev / gb:7.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
