"""`python -m utils.batch prompts.jsonl --out answers.jsonl`: `qwen3-batch`."""

from utils.cli import batch_main

raise SystemExit(batch_main())
