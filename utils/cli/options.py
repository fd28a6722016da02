"""Options more than one command takes: how to pick tokens.

`--temperature 0` (the default) is the chapter's greedy argmax; above 0 the
commands sample as the book's later chapter does (`utils.sampling`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from utils.errors import UsageError

if TYPE_CHECKING:  # utils.sampling imports torch: only when a command runs
    from utils.sampling import Sampling


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """--temperature, --top-k, --top-p and --seed."""
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy (the chapter's argmax); above 0: sample, "
                   "e.g. 0.7")  # fmt: skip
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="sample from the k most likely tokens only (default: all)",
    )
    p.add_argument("--top-p", type=float, default=None,
                   help="then from the smallest set of those whose probability "
                   "reaches p, e.g. 0.9 (default: all)")  # fmt: skip
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the draws: the same seed, prompt and sample "
                   "give the same text on the same path and machine, whatever "
                   "ran beside it (default: a fresh one each run)")  # fmt: skip


def sampling_from(args: argparse.Namespace) -> Sampling:
    """The options as a `Sampling`; one UsageError line for bad values."""
    from utils.sampling import Sampling, sampling_problem

    problem = sampling_problem(args.temperature, args.top_k, args.top_p)
    if problem:
        raise UsageError(problem.replace("top-k", "--top-k").replace("top-p", "--top-p")
                         .replace("temperature", "--temperature", 1))  # fmt: skip
    return Sampling(args.temperature, args.top_k, args.top_p, args.seed)
