"""Many prompts and samples: the prompts and answers files of `qwen3-batch`
(`jobs`) and the two ways a batch is decoded (`engines`: the fast engine's
continuous batches, the book's batched model). The command itself is
`utils.cli`'s (`python -m utils.batch` runs it). This is the door; each
name is imported on first use (`utils.lazy`), so the command imports torch
in its body.
"""

from utils.lazy import lazy_attributes

__all__ = [
    "AnswerLog",
    "BookEngine",
    "FastEngine",
    "Job",
    "answer_key",
    "pending",
    "read_jobs",
]

_HOMES = {
    "engines": ("BookEngine", "FastEngine"),
    "jobs": ("AnswerLog", "Job", "answer_key", "pending", "read_jobs"),
}
__getattr__ = lazy_attributes(__name__, _HOMES)
