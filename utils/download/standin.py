"""Offline stand-ins for the Qwen3 0.6B files, for machines without internet.

With `QWEN3_STANDIN=1`, `download_qwen3_small` calls `provide_standins`
instead of downloading, which writes:

* the tokenizer: the exact Qwen3 tokenizer, rebuilt from the Qwen BPE ranks
  that ship inside the `dashscope` wheel (see `utils.qwen3_tokenizer`);
* the weights: a seeded random initialisation of the real 0.6B shape (bf16).
  Same architecture, memory and speed as the real model, but the text it
  writes is gibberish.

Stand-ins never live where real downloads do: they go to
`standin_files_dir()` (env `QWEN3_STANDIN_DIR`, else a folder in the stand-in
cache), whatever `out_dir` the download was given, and no function here
replaces a verified real download. Every stand-in file gets a sidecar
`<file>.STANDIN.json`; the weights also carry the mark inside the checkpoint
(both defined in `utils.download.provenance`, which recognises them). Builds are
cached under `standin_cache_dir()`; later calls only link the cached file
into place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import utils.download.provenance as provenance
from utils import linksafe, settings
from utils.download.provenance import print_standin_banner
from utils.fileio import atomic_output, atomic_place, atomic_write_bytes
from utils.log import get_logger

if TYPE_CHECKING:
    import torch

__all__ = [  # print_standin_banner: the notebooks import it from here
    "StandinFolderError",
    "provide_standins",
    "print_standin_banner",
    "refuse_to_replace_real",
    "save_marked_state_dict",
    "standin_cache_dir",
    "standin_enabled",
    "standin_files_dir",
    "standin_state_dict",
    "write_standin_tokenizer",
    "write_standin_weights",
]

STANDIN_ENV = "QWEN3_STANDIN"
CACHE_ENV = "QWEN3_STANDIN_CACHE"
DIR_ENV = "QWEN3_STANDIN_DIR"
FORMAT_VERSION = 2
SEEDS = {"base": 20250601, "reasoning": 20250602}

log = get_logger("utils.download")  # one name for the package's lines


class StandinFolderError(OSError, ValueError):
    """The stand-in files cannot be written where they are kept. A
    ValueError too, so the commands report it in one line."""


def standin_enabled() -> bool:
    """True when `QWEN3_STANDIN` asks for offline stand-ins (1/true/yes/on)."""
    return settings.flag(STANDIN_ENV)


def standin_cache_dir() -> Path:
    """Where built stand-ins are kept (`QWEN3_STANDIN_CACHE` or ~/.cache)."""
    root = settings.text(CACHE_ENV)
    return Path(root).expanduser() if root else settings.cache_root() / "standin"


def standin_files_dir() -> Path:
    """Where stand-in mode puts its files: `QWEN3_STANDIN_DIR`, else
    `files/` in the stand-in cache; never a folder for real downloads."""
    root = settings.text(DIR_ENV)
    return Path(root).expanduser() if root else standin_cache_dir() / "files"


def refuse_to_replace_real(path: str | os.PathLike) -> None:
    """Raise `FileExistsError` (after saying so in one line) if `path` is a
    verified real download, so no stand-in can ever take its place."""
    if Path(path).is_file() and provenance.is_verified(path):
        message = (
            f"Stand-in mode will not replace the verified real file {path}; "
            f"point {DIR_ENV} at another folder."
        )
        log.warning(message)
        raise FileExistsError(message)


# --------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------


def standin_state_dict(cfg: Mapping[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """A seeded random state dict with the keys and shapes of the book's
    `Qwen3Model(cfg)`, in `cfg["dtype"]`.

    The scales are chosen so the stand-in behaves like a working network
    rather than a collapsed one: unit-gain input projections, small residual
    updates (so each step depends on the current token and its context), an
    independent output head and a large final-norm scale, so the logits spread
    widely and greedy decoding is stable across float formats. The text it
    produces is still gibberish.
    """
    import torch
    from reasoning_from_scratch.qwen3 import Qwen3Model

    with torch.device("meta"):
        model = Qwen3Model(dict(cfg))
        shapes = {k: (v.shape, v.dtype) for k, v in model.state_dict().items()}
    n_layers = cfg["n_layers"]
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, (shape, dtype) in shapes.items():
        if name.endswith("scale"):
            value = 8.0 if name == "final_norm.scale" else 1.0
            out[name] = torch.full(shape, value, dtype=dtype)
            continue
        fan_in = shape[-1]
        if name == "tok_emb.weight":
            std = 1.0
        elif name.endswith(("out_proj.weight", "ff.fc3.weight")):
            # residual branches: keep the stream close to the token embedding
            std = 0.5 / (fan_in * n_layers) ** 0.5
        else:
            std = 1.0 / fan_in**0.5
        out[name] = (torch.randn(shape, generator=gen) * std).to(dtype)
    return out


def save_marked_state_dict(
    state_dict: Mapping[str, torch.Tensor], path: Path, note: str
) -> None:
    """Save a state dict with the stand-in mark in its `_metadata`, which
    `load_state_dict` ignores, so the mark travels with the file itself."""
    from collections import OrderedDict

    import torch

    refuse_to_replace_real(path)
    sd = OrderedDict(state_dict)
    sd._metadata = provenance.standin_mark(note)  # type: ignore[attr-defined]
    with atomic_output(path) as tmp:
        torch.save(sd, tmp)


def write_standin_weights(
    path: str | os.PathLike,
    kind: str = "base",
    cfg: Mapping[str, Any] | None = None,
) -> Path:
    """Write stand-in weights for `kind` ("base"/"reasoning") to `path`.

    With the default config (the real 0.6B shape) the build is cached and
    deterministic; a custom `cfg` (tiny test models) is built directly.
    """
    from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B

    if kind not in SEEDS:
        raise ValueError(f"kind must be 'base' or 'reasoning', got {kind!r}")
    path = Path(path)
    refuse_to_replace_real(path)
    seed = SEEDS[kind]
    note = f"stand-in Qwen3 {kind} weights, seed {seed}"
    if cfg is None or dict(cfg) == QWEN_CONFIG_06_B:
        cached = standin_cache_dir() / f"v{FORMAT_VERSION}" / f"qwen3-0.6B-{kind}.pth"
        if not cached.is_file():
            save_marked_state_dict(
                standin_state_dict(QWEN_CONFIG_06_B, seed), cached, note
            )
        atomic_place(cached, path)
    else:
        save_marked_state_dict(standin_state_dict(cfg, seed), path, note)
    provenance.write_sidecar(
        path, format_version=FORMAT_VERSION, kind=kind, seed=seed, file="weights"
    )
    return path


# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------


def write_standin_tokenizer(path: str | os.PathLike, kind: str = "base") -> Path:
    """Write the rebuilt Qwen3 tokenizer JSON to `path` (cached after the
    first build). Base and reasoning files are the same; the book's
    `Qwen3Tokenizer` picks the end-of-sequence token from the file name."""
    from utils.qwen3_tokenizer import build_qwen3_tokenizer_json

    if kind not in SEEDS:
        raise ValueError(f"kind must be 'base' or 'reasoning', got {kind!r}")
    path = Path(path)
    refuse_to_replace_real(path)
    cached = standin_cache_dir() / f"v{FORMAT_VERSION}" / "tokenizer.json"
    if not cached.is_file():
        atomic_write_bytes(cached, build_qwen3_tokenizer_json().encode("utf-8"))
    atomic_place(cached, path)
    provenance.write_sidecar(
        path, format_version=FORMAT_VERSION, kind=kind, file="tokenizer"
    )
    return path


# --------------------------------------------------------------------------
# What stand-in mode hands out
# --------------------------------------------------------------------------


def _unwritable(folder: Path, exc: OSError) -> StandinFolderError:
    return StandinFolderError(
        f"cannot write the stand-in files in {folder}/ ({exc.strerror or exc}): "
        f"set {DIR_ENV} to a folder you can write to"
    )


def _check_trust(folder: Path) -> None:
    """Refuse a stand-in folder that another user could change (their
    files would be loaded as ours): `utils.linksafe.untrusted_reason`, judged
    once the folder is made (a new one under /tmp is this user's own)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if not folder.is_dir():  # nothing there to distrust: say why
            raise _unwritable(folder, exc) from exc
    reason = linksafe.untrusted_reason(folder)
    if reason is not None:
        raise StandinFolderError(
            f"cannot use the stand-in files in {folder}/: {reason}, so another "
            f"user could replace them; set {DIR_ENV} to a folder of your own"
        )


def provide_standins(out: Path, kind: str, names: list[str]) -> list[Path]:
    """Stand-ins for the book's files `names` of `kind`, in
    `standin_files_dir()` (built once, then reused); `out`, the folder the
    caller asked for, is only named in the message and never touched. The
    banner ("gibberish") comes only with weights: the stand-in tokenizer is
    the real one."""
    if any(name.endswith(".pth") for name in names):
        print_standin_banner()
    folder = standin_files_dir()
    _check_trust(folder)
    paths = [folder / name for name in names]
    for path in paths:
        if path.is_file() and provenance.sidecar_path(path).is_file():
            continue  # already a stand-in
        refuse_to_replace_real(path)
        try:
            provenance.record_path(path).unlink(missing_ok=True)  # never "verified"
            if path.suffix == ".pth":
                write_standin_weights(path, kind)
            else:
                write_standin_tokenizer(path, kind)
        except OSError as exc:
            raise _unwritable(folder, exc) from exc
    log.info(
        f"Stand-in files in {folder}/ (no download: QWEN3_STANDIN is set; "
        f"nothing in {out}/ was touched)"
    )
    return paths
