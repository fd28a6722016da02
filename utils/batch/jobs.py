"""The files of `qwen3-batch`: prompts in, answers out, one JSON object a line.

`read_jobs` checks every line of the prompts file before any work starts: a
bad line is named by its number and what is wrong with it. `AnswerLog`
appends one whole line per finished answer (one `write` of the complete
line, then `fsync`), so a run killed at any moment leaves only whole lines;
opened again, it knows which (id, sample) pairs are done, and a run with the
same `--out` skips them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.errors import UsageError
from utils.fileio import file_mode, refuse_link
from utils.log import get_logger
from utils.sampling import Sampling, sampling_problem

SETTINGS = ("temperature", "top_k", "top_p", "seed")  # a line may set these
_log = get_logger(__name__)
NUMBERS = ("max_new_tokens", "num_samples")  # whole numbers >= 1


@dataclass(frozen=True)
class Job:
    """One line of the prompts file: its id, prompt, new tokens, samples
    and sampling (the command's options where the line says nothing)."""

    id: str | int
    prompt: str
    max_new_tokens: int
    num_samples: int
    sampling: Sampling
    line: int


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _line_problem(obj: Any) -> str:
    """What is wrong with one parsed line ("" when nothing)."""
    if not isinstance(obj, dict):
        return 'not a JSON object like {"id": 1, "prompt": "..."}'
    key = obj.get("id")
    if isinstance(key, bool) or not isinstance(key, str | int):
        return 'needs an "id" (a string or a whole number)'
    if not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
        return 'needs a "prompt" (text that is not empty)'
    for name in NUMBERS:
        if name in obj and not _whole(obj[name]):
            return f'"{name}" must be a whole number >= 1, got {obj[name]!r}'
    seed = obj.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        return f'"seed" must be a whole number, got {seed!r}'
    problem = sampling_problem(
        obj.get("temperature", 0.0), obj.get("top_k"), obj.get("top_p")
    )
    return f"{problem.replace('top-', 'top_')}" if problem else ""


def read_jobs(path: Path, defaults: Mapping[str, Any]) -> list[Job]:
    """Every job of the prompts file at `path`; `defaults` give
    max_new_tokens, num_samples and the SETTINGS a line leaves out. One
    UsageError naming the first bad line (blank lines are skipped; keys
    other than these are left for the reader, e.g. a reference answer)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    jobs, seen = [], {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path} line {number}: not JSON ({exc.msg})") from None
        problem = _line_problem(obj)
        if problem:
            raise UsageError(f"{path} line {number}: {problem}")
        key = json.dumps(obj["id"])
        if key in seen:
            raise UsageError(f"{path} line {number}: id {key} is already on line "
                             f"{seen[key]}; give every prompt its own id")  # fmt: skip
        seen[key] = number
        jobs.append(_job(obj, defaults, number))
    if not jobs:
        raise UsageError(f"{path} holds no prompts (one JSON object a line)")
    return jobs


def _job(obj: dict, defaults: Mapping[str, Any], number: int) -> Job:
    settings = {name: obj.get(name, defaults.get(name)) for name in SETTINGS}
    settings["temperature"] = settings["temperature"] or 0.0
    return Job(
        obj["id"], obj["prompt"],
        obj.get("max_new_tokens", defaults["max_new_tokens"]),
        obj.get("num_samples", defaults["num_samples"]),
        Sampling(**settings), number,
    )  # fmt: skip


def answer_key(job_id: str | int, sample: int) -> tuple[str, int]:
    """How an answer is known in the answers file: its id (as JSON, so 1
    and "1" differ) and sample number."""
    return json.dumps(job_id), sample


class AnswerLog:
    """The answers file: what is done, and whole lines appended."""

    def __init__(self, path: Path) -> None:
        self.path = refuse_link(path)
        self.done: set[tuple[str, int]] = set()
        if path.exists():
            self._read_done()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        self._fd = os.open(path, flags, file_mode())

    def _read_done(self) -> None:
        data = self.path.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]
        self._check_lines(whole)
        if len(whole) < len(data):  # a line cut by a crash (one write each)
            os.truncate(self.path, len(whole))
            _log.warning("%s: dropped an unfinished last line; that answer is "
                         "made again", self.path)  # fmt: skip

    def _check_lines(self, whole: bytes) -> None:
        for number, raw in enumerate(whole.decode("utf-8", "replace").splitlines(), 1):
            try:
                obj = json.loads(raw)
                self.done.add(answer_key(obj["id"], int(obj["sample"])))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise UsageError(
                    f"{self.path} line {number} is not an answer of qwen3-batch; "
                    "give another --out"
                ) from None

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one answer as one whole line, on disk before it returns."""
        line = json.dumps(record, ensure_ascii=False) + "\n"
        os.write(self._fd, line.encode("utf-8"))
        os.fsync(self._fd)
        self.done.add(answer_key(record["id"], record["sample"]))

    def close(self) -> None:
        os.close(self._fd)


def pending(jobs: Iterable[Job], done: set[tuple[str, int]]) -> list[tuple[Job, int]]:
    """(job, sample) pairs not in the answers file yet, in the file's order."""
    return [(job, s) for job in jobs for s in range(job.num_samples)
            if answer_key(job.id, s) not in done]  # fmt: skip
