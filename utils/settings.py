"""Every environment variable the project reads, in one table, and the one
way to read them.

Why one module: a setting a reader cannot find does not exist for them. The
settings table of docs/commands.md is checked against `SETTINGS` by a test, and a
structure test fails on any `os.environ` read elsewhere in `utils/` that
names a variable missing here. Flags share one set of true words, so
`QWEN3_STANDIN=yes` and `QWEN3_NO_WIDGETS=yes` mean the same.

The project's own variables start with `QWEN3_`; the others belong to the
tools named in `what` and are read as those tools document them. Variables
only the tests read are listed in `tests/conftest.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SETTINGS",
    "TRUE_WORDS",
    "Setting",
    "cache_root",
    "flag",
    "is_true",
    "text",
]

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, what applies when it is unset,
    and what it does (one line each, as the README table shows them)."""

    name: str
    default: str
    what: str


SETTINGS: tuple[Setting, ...] = (
    Setting("QWEN3_STANDIN", "off",
            "1/true/yes/on: offline stand-ins (the real tokenizer, random "
            "weights of the real shape) instead of downloads"),
    Setting("QWEN3_STANDIN_DIR", "`<cache>/standin/files`",
            "where stand-in mode puts its files (never a folder of real downloads)"),
    Setting("QWEN3_STANDIN_CACHE", "`<cache>/standin`",
            "where built stand-ins are kept between runs"),
    Setting("QWEN3_BACKUP_URL", "the book's Backblaze B2 mirror",
            "base URL of the backup mirror tried after Hugging Face"),
    Setting("QWEN3_DOWNLOAD_TIMEOUT", "10",
            "seconds of silence after which one download try fails (1 to 3600)"),
    Setting("QWEN3_MODEL_STORE", "`<cache>/models`",
            "where the verified model files are kept once per user; a "
            "download's folder gets hard links (or copies) of them"),
    Setting("QWEN3_KERNEL_CACHE", "`<cache>/kernels`",
            "where the fast decoder's compiled C library is kept"),
    Setting("QWEN3_KERNEL_VARIANTS", "the rule table's choice",
            "`default` (the first kernels: AVX2 or NEON) or kernel names to "
            "force, e.g. "
            "`bf16_exact_avx2,int8_avx2`"),
    Setting("QWEN3_LANG", "`zh` in a `zh` folder, else `en`",
            "language of the notebooks' charts and widgets (`en` or `zh`)"),
    Setting("QWEN3_NO_WIDGETS", "off",
            "1/true/yes/on: notebooks print plain results instead of widgets"),
    Setting("XDG_CACHE_HOME", "`~/.cache`",
            "`<cache>` above is `$XDG_CACHE_HOME/qwen3-ch02` (freedesktop.org)"),
    Setting("HF_ENDPOINT", "`https://huggingface.co`",
            "a Hugging Face mirror, read at each download (huggingface_hub)"),
    Setting("HF_HUB_DISABLE_XET", "unset",
            "1: no Xet transfers, so a mirror is used for every byte "
            "(huggingface_hub)"),
    Setting("TORCHINDUCTOR_CACHE_DIR", "torch's own",
            "inductor's cache; unset, compiled code goes to one subfolder per "
            "`ATEN_CPU_CAPABILITY` (PyTorch)"),
    Setting("ATEN_CPU_CAPABILITY", "the CPU's best",
            "the vector width PyTorch's CPU kernels use, e.g. `avx2` (PyTorch)"),
    Setting("PYTHONIOENCODING", "unset: UTF-8",
            "the encoding the commands read standard input in, e.g. `gbk` "
            "(what they write to files and pipes is UTF-8 whatever it says; Python)"),
    Setting("CC", "`cc`, `gcc`, then `clang`",
            "the C compiler that builds the fast decoder's library"),
)  # fmt: skip

_KNOWN = frozenset(s.name for s in SETTINGS)


def _known(name: str) -> str:
    if name not in _KNOWN:
        raise KeyError(f"{name} is not in utils.settings.SETTINGS")
    return name


def text(name: str) -> str | None:
    """The value of setting `name`, stripped; None when unset or blank."""
    value = os.environ.get(_known(name), "").strip()
    return value or None


def is_true(value: str | None) -> bool:
    """Whether `value` is one of `TRUE_WORDS` (any case, spaces ignored)."""
    return (value or "").strip().lower() in TRUE_WORDS


def flag(name: str) -> bool:
    """Whether setting `name` is switched on (one of `TRUE_WORDS`)."""
    return is_true(text(name))


def cache_root() -> Path:
    """The one folder the project keeps its caches under, per user:
    `$XDG_CACHE_HOME/qwen3-ch02`, else `~/.cache/qwen3-ch02`."""
    base = text("XDG_CACHE_HOME")
    return (
        Path(base).expanduser() / "qwen3-ch02"
        if base
        else (Path.home() / ".cache" / "qwen3-ch02")
    )
