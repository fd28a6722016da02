"""Many prompts and samples: the prompts and answers files of `qwen3-batch`
(`jobs`) and the two ways a batch is decoded (`engines`: the fast engine's
continuous batches, the book's batched model). The command itself is
`utils.cli`'s (`python -m utils.batch` runs it). This is the door.
"""

from utils.batch.engines import BookEngine, FastEngine
from utils.batch.jobs import AnswerLog, Job, answer_key, pending, read_jobs

__all__ = [
    "AnswerLog",
    "BookEngine",
    "FastEngine",
    "Job",
    "answer_key",
    "pending",
    "read_jobs",
]
