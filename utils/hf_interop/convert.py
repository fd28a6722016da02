"""Move Qwen3 weights between the book's `Qwen3Model` and Hugging Face.

The tensors are identical; only the names differ (`tok_emb` is
`model.embed_tokens`, ...), so converting is a renaming: `utils.hf_interop.mapping`
holds the names and configs (re-exported here). This module works with the
files:

* `load_hf_checkpoint` reads an official `Qwen/Qwen3-0.6B(-Base)` folder
  (downloaded from Hugging Face or ModelScope) into the book's format, so
  `Qwen3Model(cfg).load_state_dict(sd)` works.
* `import_qwen3` (command line: `python -m utils.hf_interop import-qwen3
  PATH --kind base`) turns such a folder into the book's verified
  `qwen3-0.6B-<kind>.pth` and `tokenizer-<kind>.json`, all or nothing.
* `export_hf_folder` writes book-format weights as a Hugging Face folder
  that `transformers`, vLLM and SGLang load directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from utils import linksafe
from utils.errors import CommandParser, UsageError, first_line, run_command
from utils.fileio import atomic_folder, atomic_move, refuse_link
from utils.hf_interop.mapping import (
    _HF_IGNORED_SUFFIXES,
    TyingError,
    book_config_from_hf,
    book_key_to_hf,
    book_to_hf_state_dict,
    check_cfg,
    check_state_dict_shapes,
    hf_config_from_book,
    hf_key_to_book,
    hf_to_book_state_dict,
)
from utils.qwen3_tokenizer import ENDOFTEXT_ID, IM_END_ID
from utils.stdio import utf8_streams

if TYPE_CHECKING:
    from utils.download import Qwen3Files

__all__ = [
    "TyingError",
    "book_config_from_hf",
    "book_key_to_hf",
    "book_to_hf_state_dict",
    "check_state_dict_shapes",
    "download_official_qwen3",
    "export_hf_folder",
    "hf_config_from_book",
    "hf_key_to_book",
    "hf_to_book_state_dict",
    "import_qwen3",
    "load_hf_checkpoint",
    "main",
]

_ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
]


# --------------------------------------------------------------------------
# Loading official checkpoints
# --------------------------------------------------------------------------


def _read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; ValueError naming the file otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}).") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{path} holds a JSON {type(data).__name__}, not an object; it is "
            "not a Hugging Face file: download it again."
        )
    return data


def _read_safetensors(file: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file in `dtype`; ValueError naming the
    file when it is truncated or damaged."""
    out = {}
    try:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                out[key] = f.get_tensor(key).to(dtype)
    except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError, ...
        raise ValueError(
            f"{file} is not a complete safetensors file ({first_line(exc, 140)}); the "
            "download is damaged or incomplete: fetch it again."
        ) from None
    return out


def _find_weight_files(path: Path) -> tuple[Path, list[Path]]:
    """(folder holding config.json, safetensors files) for a folder, a
    `.safetensors` file or a `model.safetensors.index.json`."""
    if path.is_file() and path.name.endswith(".safetensors"):
        return path.parent, [path]
    if path.is_file() and path.name.endswith(".index.json"):
        index = path
        folder = path.parent
    elif path.is_dir():
        folder = path
        single = folder / "model.safetensors"
        if single.is_file():
            return folder, [single]
        index = folder / "model.safetensors.index.json"
        if not index.is_file():
            found = sorted(p.name for p in folder.iterdir())[:10]
            raise FileNotFoundError(
                f"No model.safetensors or model.safetensors.index.json in "
                f"{folder} (found: {found}). Download the Hugging Face files "
                f"(config.json and *.safetensors), e.g. from Qwen/Qwen3-0.6B-Base. "
                f"The book's .pth files load directly with torch.load."
            )
    else:
        raise FileNotFoundError(_not_a_checkpoint(path))
    weight_map = _read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index} has no weight_map; download it again.")
    files = [folder / name for name in dict.fromkeys(weight_map.values())]
    absent = [f.name for f in files if not f.is_file()]
    if absent:
        raise FileNotFoundError(
            f"{index.name} lists shard(s) that are missing: {absent}; the "
            f"download is incomplete, fetch them again."
        )
    return folder, files


def _not_a_checkpoint(path: Path) -> str:
    """What to do with a `path` that is no folder, .safetensors or index."""
    wanted = (
        "give the folder of an official Qwen3 download (config.json, "
        "tokenizer.json and the *.safetensors files)"
    )
    if path.suffix == ".pth" and path.is_file():
        return (
            f"{path} is a .pth file, the book's own format: it needs no "
            f"conversion (the commands take it with --model-file); {wanted}."
        )
    if not path.exists():
        return f"{path} does not exist; {wanted}."
    return f"{path} is not a folder, .safetensors or .index.json file; {wanted}."


def load_hf_checkpoint(
    path_or_dir: str | os.PathLike,
    cfg: Mapping[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a Hugging Face Qwen3 checkpoint into the book's format.

    Returns `(state_dict, cfg)` such that `Qwen3Model(cfg).load_state_dict(sd)`
    works. Without `cfg` it is derived from the folder's config.json. Tensors
    are cast to `dtype` (default: `cfg["dtype"]`, else bfloat16).
    """
    folder, files = _find_weight_files(Path(path_or_dir))
    hf_config: dict[str, Any] = {}
    config_path = folder / "config.json"
    if config_path.is_file():
        hf_config = _read_json_object(config_path)
    if cfg is None:
        if not hf_config:
            raise FileNotFoundError(
                f"No config.json next to the weights in {folder}; download it "
                f"too, or pass cfg=... explicitly."
            )
        cfg = book_config_from_hf(hf_config, dtype or torch.bfloat16)
    else:
        check_cfg(cfg)
        cfg = dict(cfg)
    if dtype is not None:
        cfg["dtype"] = dtype

    hf_sd: dict[str, torch.Tensor] = {}
    for file in files:
        hf_sd.update(_read_safetensors(file, cfg["dtype"]))
    tie = hf_config.get("tie_word_embeddings")
    sd = hf_to_book_state_dict(
        hf_sd, tie_word_embeddings=None if tie is None else bool(tie), cfg=cfg
    )
    return sd, cfg


def download_official_qwen3(
    repo_id: str = "Qwen/Qwen3-0.6B-Base",
    out_dir: str | os.PathLike | None = None,
    *,
    revision: str | None = None,
) -> Path:
    """Download an official Qwen3 repo's config, weights and tokenizer files.

    Honours `HF_ENDPOINT` (e.g. a mirror) as set at call time. Returns the
    folder, ready for `load_hf_checkpoint`. Needs internet.
    """
    from huggingface_hub import snapshot_download

    if out_dir is None:
        out_dir = Path("qwen3") / repo_id.split("/")[-1]
    endpoint = os.environ.get("HF_ENDPOINT") or None
    folder = snapshot_download(
        repo_id,
        revision=revision,
        local_dir=str(out_dir),
        allow_patterns=_ALLOW_PATTERNS,
        endpoint=endpoint.rstrip("/") if endpoint else None,
    )
    return Path(folder)


# --------------------------------------------------------------------------
# Exporting book weights as a Hugging Face folder
# --------------------------------------------------------------------------


def _tokenizer_config(tokenizer_file: Path, eos_token_id, context_length: int):
    """A `tokenizer_config.json` for the Qwen3 tokenizer.json, so
    `AutoTokenizer.from_pretrained` needs no network."""
    data = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    id_to_token = {t["id"]: t["content"] for t in data.get("added_tokens", [])}
    eos_first = eos_token_id[0] if isinstance(eos_token_id, list) else eos_token_id
    eos_id = ENDOFTEXT_ID if eos_first is None else eos_first
    if eos_id not in id_to_token or ENDOFTEXT_ID not in id_to_token:
        raise ValueError(
            f"{tokenizer_file} has no added token with id {eos_id} (or "
            f"{ENDOFTEXT_ID}); pass the Qwen3 tokenizer.json."
        )
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": id_to_token[eos_id],
        "pad_token": id_to_token[ENDOFTEXT_ID],
        "unk_token": None,
        "add_prefix_space": False,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": context_length,
    }


def _tokenizer_max_id(tokenizer_file: Path) -> int:
    data = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    ids = list(data.get("model", {}).get("vocab", {}).values())
    ids += [t["id"] for t in data.get("added_tokens", [])]
    return max(ids, default=-1)


def export_hf_folder(
    model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
    cfg: Mapping[str, Any],
    out_dir: str | os.PathLike,
    tokenizer_file: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype | None = None,
    bos_token_id: int | None = ENDOFTEXT_ID,
    eos_token_id: int | list[int] | None = ENDOFTEXT_ID,
    overwrite: bool = False,
) -> Path:
    """Write book-format Qwen3 weights as a Hugging Face model folder.

    The folder (config.json, model.safetensors, generation_config.json and,
    given `tokenizer_file`, tokenizer.json + tokenizer_config.json) loads
    with `AutoModelForCausalLM`/`AutoTokenizer.from_pretrained` and serves
    with vLLM or SGLang. The output head is tied (stored once) exactly when
    it equals the embedding. Use `eos_token_id=151645` for the reasoning
    model. The folder appears atomically: a failure leaves nothing behind
    (and the temporaries of an earlier, killed export are removed). Its
    files get the modes the umask gives new files (0644 under 022). An
    `out_dir` that is a symbolic link is refused in one line, neither
    replaced nor written through: name the folder it points to.
    """
    out_dir = refuse_link(out_dir)
    _refuse_a_full_folder(out_dir, overwrite)
    if isinstance(model_or_state_dict, torch.nn.Module):
        sd = model_or_state_dict.state_dict()
    else:
        sd = dict(model_or_state_dict)
    tok_path = None if tokenizer_file is None else Path(tokenizer_file)
    if tok_path is not None and not tok_path.is_file():
        raise FileNotFoundError(f"tokenizer_file {tok_path} does not exist.")
    check_state_dict_shapes(sd, cfg)
    dtype = dtype or cfg["dtype"]
    tied = sd["out_head.weight"].dtype == sd["tok_emb.weight"].dtype and bool(
        torch.equal(sd["out_head.weight"], sd["tok_emb.weight"])
    )
    files = _json_files(cfg, tied, dtype, bos_token_id, eos_token_id, tok_path)
    hf_sd = book_to_hf_state_dict(sd, tie_word_embeddings=tied)
    # Own, contiguous copies on the CPU: safetensors refuses shared storage.
    hf_sd = {
        k: v.detach().to(device="cpu", dtype=dtype).contiguous().clone()
        for k, v in hf_sd.items()
    }
    _write_folder(out_dir, files, hf_sd, tok_path)
    return out_dir


def _refuse_a_full_folder(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        if not overwrite:
            raise FileExistsError(
                f"{out_dir} already exists and is not empty; choose a new "
                f"folder or pass overwrite=True."
            )


def _json_files(
    cfg: Mapping[str, Any],
    tied: bool,
    dtype: torch.dtype,
    bos_token_id: int | None,
    eos_token_id: int | list[int] | None,
    tok_path: Path | None,
) -> dict[str, Any]:
    """{file name: content} of the folder's JSON files."""
    files: dict[str, Any] = {
        "config.json": hf_config_from_book(
            cfg, tie_word_embeddings=tied, dtype=dtype,
            bos_token_id=bos_token_id, eos_token_id=eos_token_id,
        ),
        "generation_config.json": {
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "pad_token_id": ENDOFTEXT_ID if ENDOFTEXT_ID < cfg["vocab_size"] else None,
        },
    }  # fmt: skip
    if tok_path is not None:
        files["tokenizer_config.json"] = _checked_tokenizer_config(
            tok_path, eos_token_id, cfg
        )
    return files


def _checked_tokenizer_config(
    tok_path: Path, eos_token_id: Any, cfg: Mapping[str, Any]
) -> dict[str, Any]:
    max_id = _tokenizer_max_id(tok_path)
    if max_id >= cfg["vocab_size"]:
        raise ValueError(
            f"{tok_path} has token ids up to {max_id}, beyond the model's "
            f"vocab_size={cfg['vocab_size']}; it is not this model's tokenizer."
        )
    return _tokenizer_config(tok_path, eos_token_id, cfg["context_length"])


def _write_folder(
    out_dir: Path,
    json_files: Mapping[str, Any],
    hf_sd: dict[str, torch.Tensor],
    tok_path: Path | None,
) -> None:
    """Write everything into a temporary folder that then takes the place of
    `out_dir` (`utils.fileio.atomic_folder`: a failure leaves nothing)."""
    with atomic_folder(out_dir) as tmp:
        for name, data in json_files.items():
            (tmp / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        save_file(hf_sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tok_path is not None:
            shutil.copyfile(tok_path, tmp / "tokenizer.json")


# --------------------------------------------------------------------------
# Importing an official Qwen3 folder as the book's files
# --------------------------------------------------------------------------

# The end-of-sequence id each kind's config.json names (base / chat model).
_KIND_EOS = {"base": ENDOFTEXT_ID, "reasoning": IM_END_ID}
_IMPORT_CHECK = "converted from the official safetensors"


def _config_eos_ids(hf_config: Mapping[str, Any]) -> set[int]:
    eos = hf_config.get("eos_token_id")
    if eos is None:
        return set()
    return {int(i) for i in (eos if isinstance(eos, list) else [eos])}


def _check_kind(hf_config: Mapping[str, Any], kind: str, folder: Path) -> None:
    """Refuse a base folder imported as "reasoning" and vice versa."""
    eos = _config_eos_ids(hf_config) & set(_KIND_EOS.values())
    if not eos or _KIND_EOS[kind] in eos:
        return
    other = next(k for k, v in _KIND_EOS.items() if v in eos)
    raise ValueError(
        f"{folder} looks like the {other} model (config.json has "
        f"eos_token_id={hf_config['eos_token_id']}), not {kind!r}: Qwen3-0.6B-Base "
        f"is --kind base, Qwen3-0.6B is --kind reasoning."
    )


def _check_tokenizer(path: Path) -> None:
    """The content check the book's tokenizer files pass (Qwen3's vocabulary
    and added tokens at their ids), in a message that names `path`."""
    from utils.download import IntegrityError, check_tokenizer

    if not path.is_file():
        raise FileNotFoundError(
            f"No tokenizer.json in {path.parent}; download it together with "
            f"config.json and the *.safetensors files."
        )
    try:
        check_tokenizer(path)
    except (IntegrityError, RecursionError) as exc:
        detail = str(exc) if isinstance(exc, IntegrityError) else "nested too deep"
        raise ValueError(
            f"{path} is not the Qwen3 tokenizer ({detail}); use the tokenizer.json "
            "of Qwen/Qwen3-0.6B-Base or Qwen/Qwen3-0.6B."
        ) from None


def _check_weights(sd: Mapping[str, torch.Tensor], folder: Path) -> None:
    """The content check the book's weights file must pass, before writing."""
    from utils.download import model_config
    from utils.models import shape_problems, summarize_problems

    problems = shape_problems(sd, model_config())
    if problems:
        raise ValueError(
            f"the weights in {folder} are not the book's model "
            f"({summarize_problems(problems)}); use Qwen/Qwen3-0.6B-Base or "
            "Qwen/Qwen3-0.6B."
        )


class DestinationError(OSError):
    """The folder the book's files were to go to cannot take them;
    `problem` names it and says why (a file, another user's, read-only,
    full), before any of the official folder is read where it can."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"{problem}; choose a folder of your own (out_dir)")
        self.problem = problem


def import_qwen3(
    src: str | os.PathLike,
    kind: str,
    out_dir: str | os.PathLike = "qwen3",
    *,
    require_06b: bool = True,
    tokenizer_only: bool = False,
    where: str | None = None,
) -> Qwen3Files:
    """Turn an official Qwen3 folder into the book's verified files.

    `src` holds config.json, tokenizer.json and the safetensors weights (as
    downloaded from Hugging Face or ModelScope). Writes `qwen3-0.6B-<kind>.pth`
    (bfloat16, the book's key names) and `tokenizer-<kind>.json` to `out_dir`
    with the verification record `download_qwen3_small` accepts, so the
    notebooks use them without a download. `tokenizer_only`: `src` needs
    only config.json (which model the tokenizer is of) and tokenizer.json, a
    few MB, and only `tokenizer-<kind>.json` is written (notebook 01 reads
    the reasoning model's tokenizer, never its weights). `out_dir` must be
    a folder no other user could change (`utils.linksafe.untrusted_reason`,
    the rule of every folder files are kept in for later) that takes a new
    file: `DestinationError` otherwise, naming it as `where` says (default:
    its path), before the official folder is read. All or nothing: every
    input is read and checked before anything is written; the files are
    written and checked in a temporary folder inside `out_dir`, then moved
    into place with their records. A failure leaves `out_dir` as it was
    (not there, if it was not). Returns `utils.download.Qwen3Files`.
    """
    from utils.download import Qwen3Files, file_names

    tok_name, model_name = file_names(kind)
    out = Path(out_dir)
    where = where or str(out)
    with _staging(out, where) as stage:
        if tokenizer_only:
            folder, sd = _read_official_tokenizer(Path(src), kind), None
            names = [tok_name]
        else:
            folder, sd = _read_official_folder(Path(src), kind, require_06b)
            names = [model_name, tok_name]
        source = f"import-qwen3 from {folder.resolve()}"
        with _writing(where):
            if sd is not None:  # into a file of ours: a full disk is an OSError
                with (stage / model_name).open("wb") as f:
                    torch.save(sd, f)
                del sd
            shutil.copyfile(folder / "tokenizer.json", stage / tok_name)
        records = {name: _staged_record(stage / name, source) for name in names}
        with _writing(where):
            _put_in_place(stage, out, records)
    model = None if tokenizer_only else out / model_name
    return Qwen3Files(tokenizer=out / tok_name, model=model, standin=False)


@contextlib.contextmanager
def _writing(where: str) -> Iterator[None]:
    """Turn the disk's refusal (full, read-only, not writable) of a write
    into `where` into a `DestinationError` naming it, not a temporary file
    (torch.save wraps it in a RuntimeError)."""
    from utils.download import disk_reason

    try:
        yield
    except (OSError, RuntimeError) as exc:
        reason = disk_reason(exc)
        if reason is None or isinstance(exc, DestinationError):
            raise
        raise DestinationError(f"cannot write into {where} ({reason})") from None


def _check_folder(out: Path, where: str) -> None:
    """`DestinationError` if `out`, or the nearest part of it that exists,
    is not a folder."""
    for path in (out, *out.parents):
        if os.path.lexists(path):
            if path.is_dir():
                return
            if path == out:
                raise DestinationError(f"{where} is a file, not a folder")
            raise DestinationError(f"{path} is a file, so {where} cannot be a folder")


@contextlib.contextmanager
def _staging(out: Path, where: str) -> Iterator[Path]:
    """A new temporary folder inside `out` (so each move into place is a
    rename on `out`'s file system), removed afterwards; made once `out` is
    a folder (made if missing) that no other user could change. On a
    failure the folders made for it go too, `out` included."""
    _check_folder(out, where)
    made = [p for p in (out, *out.parents) if not os.path.lexists(p)]
    try:
        with _writing(where):
            out.mkdir(parents=True, exist_ok=True)
        reason = linksafe.untrusted_reason(out)  # judged once `out` is there
        if reason is not None:
            raise DestinationError(
                f"{where} cannot be trusted ({reason}, so another user could "
                "replace the files there)"
            )
        with _writing(where):
            staging = tempfile.TemporaryDirectory(dir=out, prefix=".import-")
        with staging as stage:
            yield Path(stage)
    except BaseException:
        for folder in made:  # deepest first; only those left empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _staged_record(path: Path, source: str) -> dict[str, str]:
    """Check a staged file's content as the book's file of its name; its
    verification record (written once it is in place)."""
    from utils.download import check_content, hash_file

    content = check_content(path)
    sha256 = hash_file(path)["sha256"]
    return {"sha256": sha256, "checked": _IMPORT_CHECK, "source": source,
            "content": content}  # fmt: skip


def _put_in_place(stage: Path, out: Path, records: Mapping[str, Any]) -> None:
    """Move the staged files into `out` and record them as verified. What
    they replace (the old file, its record, a stand-in mark) is moved into
    the stage first, and back if anything fails."""
    from utils.download import record_path, sidecar_path, write_record

    aside = stage / "replaced"
    aside.mkdir()
    moved: list[tuple[Path, Path]] = []  # (where it is now, where it was)
    placed: list[Path] = []
    try:
        for name in records:
            for old in (out / name, record_path(out / name), sidecar_path(out / name)):
                if os.path.lexists(old):
                    os.replace(old, aside / old.name)
                    moved.append((aside / old.name, old))
        for name, record in records.items():
            placed.append(atomic_move(stage / name, out / name))
            write_record(out / name, record)
            placed.append(record_path(out / name))
    except BaseException:
        for path in placed:
            path.unlink(missing_ok=True)
        for now, was in reversed(moved):
            os.replace(now, was)
        raise


def _header_shapes(folder: Path) -> dict[str, torch.Tensor] | None:
    """{book key (or the file's own, if unknown): an empty tensor of its
    shape} from the safetensors headers, no data read; None where a file
    cannot be read (its own error comes when it is loaded)."""
    shapes: dict[str, torch.Tensor] = {}
    try:
        for file in _find_weight_files(folder)[1]:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    shape = f.get_slice(key).get_shape()
                    try:
                        name = hf_key_to_book(key)
                    except ValueError:
                        name = key
                    shapes[name] = torch.empty(shape, device="meta")
    except Exception:  # noqa: BLE001 - damaged: said by the loading
        return None
    return shapes


def _check_shapes(folder: Path, hf_config: Mapping[str, Any]) -> None:
    """Refuse weights whose shapes do not fit the folder's own config.json
    (read from the headers, before any tensor): the two come from different
    models, whatever else (the tied head) looks wrong too."""
    from utils.models import shape_problems, summarize_problems

    shapes = _header_shapes(folder)
    try:
        cfg = book_config_from_hf(hf_config, torch.bfloat16)
    except ValueError:
        return  # said by the loading, naming config.json
    shapes = {
        k: v for k, v in (shapes or {}).items() if not k.endswith(_HF_IGNORED_SUFFIXES)
    }
    problems = shape_problems(shapes, cfg, tied_head_ok=True) if shapes else []
    problems.sort(key=lambda problem: "has shape" not in problem)  # most telling
    if problems:
        raise ValueError(
            f"the weights in {folder} do not fit its config.json "
            f"({summarize_problems(problems)}): they are another model's; "
            "download the folder again, from Qwen/Qwen3-0.6B-Base or Qwen/Qwen3-0.6B."
        )


def _checked_config(folder: Path, kind: str) -> dict[str, Any]:
    """The folder's config.json, after checking it names `kind`'s model and
    that its tokenizer.json is Qwen3's."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"No config.json in {folder}; download it together with "
            "tokenizer.json (and the weights, unless --tokenizer-only)."
        )
    hf_config = _read_json_object(config_path)
    _check_kind(hf_config, kind, folder)
    _check_tokenizer(folder / "tokenizer.json")
    return hf_config


def _read_official_tokenizer(src: Path, kind: str) -> Path:
    """The folder of an official download's config.json and tokenizer.json,
    checked (the weights, if there, are not read); writes nothing."""
    folder = src.parent if src.is_file() else src
    if not folder.is_dir():
        raise FileNotFoundError(f"{src} does not exist or is not a folder.")
    _checked_config(folder, kind)
    return folder


def _read_official_folder(
    src: Path, kind: str, require_06b: bool
) -> tuple[Path, dict[str, torch.Tensor]]:
    """(folder, book state dict in bf16) of an official Qwen3 folder, after
    checking its config, tokenizer and weights; writes nothing."""
    folder, _ = _find_weight_files(src)
    hf_config = _checked_config(folder, kind)
    _check_shapes(folder, hf_config)
    try:
        sd, cfg = load_hf_checkpoint(folder, dtype=torch.bfloat16)
    except TyingError:
        raise ValueError(
            f"{folder / 'config.json'} says tie_word_embeddings="
            f"{hf_config.get('tie_word_embeddings')}, which its weights "
            "contradict (lm_head.weight missing or not the embedding): the "
            "folder mixes files of different models; download it again."
        ) from None
    if require_06b:
        from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B

        if cfg != QWEN_CONFIG_06_B:
            diff = sorted(k for k in cfg if cfg[k] != QWEN_CONFIG_06_B.get(k))
            raise ValueError(
                f"{folder} is not Qwen3-0.6B (differs in {diff}); the notebooks "
                f"build the 0.6B model. Use Qwen/Qwen3-0.6B-Base or Qwen/Qwen3-0.6B."
            )
    _check_weights(sd, folder)
    return folder, sd


PROG = "python -m utils.hf_interop"


def build_parser() -> CommandParser:
    """`import-qwen3 PATH --kind base|reasoning [--out-dir DIR | --store]`."""
    parser = CommandParser(
        prog=PROG,
        description="Convert between official Qwen3 checkpoints and the book's files.",
        epilog=None,
    )
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=CommandParser
    )
    imp = sub.add_parser(
        "import-qwen3",
        help="official Qwen3-0.6B(-Base) folder -> the book's .pth + tokenizer",
        description=(
            "Convert a folder downloaded from Hugging Face or ModelScope "
            "(config.json, tokenizer.json, *.safetensors) into the book's "
            "qwen3-0.6B-<kind>.pth and tokenizer-<kind>.json, with the "
            "verification record the notebooks' download accepts."
        ),
        epilog="Example: uv run python -m utils.hf_interop import-qwen3 "
        "Qwen3-0.6B-Base --kind base --store",
    )
    imp.add_argument("path", help="folder with config.json, tokenizer.json, weights")
    imp.add_argument(
        "--kind",
        required=True,
        choices=["base", "reasoning"],
        help="base for Qwen3-0.6B-Base, reasoning for Qwen3-0.6B",
    )
    imp.add_argument(
        "--tokenizer-only", action="store_true", help="import only the "
        "tokenizer: the folder needs config.json and tokenizer.json, a few MB "
        "(notebook 01 reads the reasoning model's tokenizer, not its weights)",
    )  # fmt: skip
    where = imp.add_mutually_exclusive_group()
    where.add_argument(
        "--out-dir", default="qwen3", help="where the book's files go (the "
        "notebooks read the qwen3/ folder next to them)"
    )  # fmt: skip
    where.add_argument(
        "--store", action="store_true", help="put them into the per-user model "
        "store instead (QWEN3_MODEL_STORE, else ~/.cache/qwen3-ch02/models), "
        "where every notebook folder, English and Chinese, and the commands "
        "find them; as with --out-dir, a folder another user could change is "
        "refused before anything is read or written"
    )  # fmt: skip
    return parser


_FIXES = {  # what to do about a folder the files cannot go to
    "--store": "set QWEN3_MODEL_STORE to a folder of your own on a disk you "
    "can write to, or use --out-dir DIR instead of --store",
    "--out-dir": "choose, with --out-dir, a folder of your own on a disk you "
    "can write to",
}


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from utils.download import store_dir

    out = store_dir() if args.store else Path(args.out_dir)
    option = "--store" if args.store else "--out-dir"
    where = f"the model store {out}" if args.store else f"--out-dir {out}"
    try:
        files = import_qwen3(
            args.path, args.kind, out, tokenizer_only=args.tokenizer_only, where=where
        )
    except DestinationError as exc:
        raise UsageError(f"{exc.problem}; {_FIXES[option]}.") from None
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    for path in files:
        print(f"Wrote {path} ({path.stat().st_size / 1e6:.1f} MB), verified")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: `python -m utils.hf_interop import-qwen3 PATH --kind base`;
    exit status 2 after one line for a bad folder or option."""
    utf8_streams()  # output in UTF-8 to files and pipes (utils.stdio)
    return run_command(PROG, lambda: _main(argv))
