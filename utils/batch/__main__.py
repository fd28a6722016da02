"""`python -m utils.batch prompts.jsonl --out answers.jsonl`."""

from utils.batch import main

raise SystemExit(main())
