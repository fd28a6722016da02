"""`qwen3-batch` (`python -m utils.batch`): a file of prompts answered several
at once, one JSON line per finished answer, resumable (`command`); the
prompts and answers files (`jobs`); the two ways a batch is decoded
(`engines`). This is its door.
"""

from utils.batch.command import batch_parser, main
from utils.batch.jobs import AnswerLog, Job, read_jobs

__all__ = ["AnswerLog", "Job", "batch_parser", "main", "read_jobs"]
