"""`qwen3-batch prompts.jsonl --out answers.jsonl`: many prompts, many samples.

Every line of the prompts file is checked first (`utils.batch.read_jobs`); then
the (prompt, sample) pairs not yet in the answers file are decoded
`--batch-size` at a time and each finished answer is appended as one whole
line, so Ctrl-C or a crash loses at most the answers in flight and the same
command goes on where it stopped.

With `--fast` (a CPU with the C kernels) the fast engine's batches run
(`utils.fast.BatchDecoder`): a finished row's slot goes to the next prompt
at once, and every row's tokens are those it gets decoded alone, whatever
the batch size. Without it, the book's padding-aware batched model runs
fixed groups of prompts (`utils.models.batched_book_model`), on any device;
its rows can differ with the batch in bf16 (left padding changes the sums).
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from utils.cli.commands import STANDIN_TOKENS, _import_torch, load, model_options
from utils.cli.options import add_sampling_options, sampling_from
from utils.errors import CommandParser, UsageError, require_streams, run_command
from utils.log import get_logger

if TYPE_CHECKING:  # utils.batch imports torch: a command imports it in its body
    from utils.batch import AnswerLog, Job

PROG = "qwen3-batch"
SIZES = (1, 2, 4, 8, 16)  # batch sizes measured for the default
ANSWER_TOKENS = 512  # new tokens an answer may take, where nothing says
_log = get_logger("utils.batch")


def batch_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog=PROG,
        description="Answer every prompt of a JSON-lines file with Qwen3 0.6B, "
        "several at once, appending one JSON line per finished answer to --out "
        "(id, sample, text, tokens, stop, seconds); run it again to finish "
        "what a stopped run left.",
    )
    p.add_argument("prompts", type=Path,
                   help='one JSON object a line: {"id": ..., "prompt": "..."}, '
                   "optionally max_new_tokens, num_samples, temperature, top_k, "
                   "top_p, seed (other keys are ignored)")  # fmt: skip
    p.add_argument("--out", type=Path, required=True,
                   help="the answers file: appended to, never rewritten; the "
                   "(id, sample) pairs already in it are skipped")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=None,
                   help="sequences decoded together (default: the size that "
                   "measures fastest on this machine, printed)")  # fmt: skip
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"most tokens per answer, where a line does not say (default: "
        f"{ANSWER_TOKENS}; {STANDIN_TOKENS} with stand-in weights, whose "
        "answers never end by themselves)",
    )
    p.add_argument(
        "--num-samples",
        type=int,
        default=1,
        help="answers per prompt, where a line does not say",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="the reasoning model, each prompt in its chat template",
    )
    p.add_argument(
        "--thinking",
        action="store_true",
        help="with --chat: let the model think (no empty <think> block)",
    )
    add_sampling_options(p)
    model_options(p)
    p.set_defaults(cache=True, compile=False)
    return p


def _check_args(args: argparse.Namespace) -> None:
    for name in ("batch_size", "max_new_tokens", "num_samples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.thinking and not args.chat:
        raise UsageError("--thinking only applies with --chat.")
    if args.out.resolve() == args.prompts.resolve():
        raise UsageError("--out must be another file than the prompts.")
    if not args.out.parent.is_dir():
        raise UsageError(f"the folder of --out, {args.out.parent}, does not exist.")


def _jobs(args: argparse.Namespace) -> list[Job]:
    from utils.batch import read_jobs
    from utils.download import standin_enabled

    sampling = sampling_from(args)
    # stand-in weights never end an answer: a short one unless asked
    args.short_answers = args.max_new_tokens is None and standin_enabled()
    if args.max_new_tokens is None:
        args.max_new_tokens = STANDIN_TOKENS if args.short_answers else ANSWER_TOKENS
    seed = secrets.randbits(31) if args.seed is None else args.seed
    defaults = {"max_new_tokens": args.max_new_tokens, "num_samples": args.num_samples,
                "temperature": sampling.temperature, "top_k": sampling.top_k,
                "top_p": sampling.top_p, "seed": seed}  # fmt: skip
    jobs = read_jobs(args.prompts, defaults)
    if args.seed is None and any(not job.sampling.greedy for job in jobs):
        _log.info("sampling with seed %d (pass --seed %d to draw the same again)",
                  seed, seed)  # fmt: skip
    return jobs


def _encoded(run: Any, todo: list[tuple[Job, int]]) -> dict[int, list[int]]:
    """Each job's prompt ids (by line), checked against the context."""
    context = run.model.cfg["context_length"]
    ids: dict[int, list[int]] = {}
    for job, _ in todo:
        if job.line not in ids:
            ids[job.line] = run.tokenizer.encode(job.prompt)
            if len(ids[job.line]) + job.max_new_tokens > context:
                raise UsageError(
                    f"{job.id!r} (line {job.line}): its {len(ids[job.line])} "
                    f"prompt tokens + max_new_tokens {job.max_new_tokens} are "
                    f"more than the model's {context}; ask for fewer new tokens."
                )
    return ids


def _requests(todo, ids, started) -> Iterator[Any]:
    """The decoder's requests, each stamped with when the decoder took it."""
    from utils.fast import Request

    for job, sample in todo:
        started[job.line, sample] = time.perf_counter()
        picker = None if job.sampling.greedy else job.sampling.picker(job.id, sample)
        yield Request((job.line, sample), ids[job.line], job.max_new_tokens, picker)


def _batch_size(args, run, engine, count: int) -> int:
    """--batch-size, or the size of SIZES (at most `count`) that measures
    fastest here now (a smaller one within 5% of it), said on stderr."""
    if args.batch_size is not None:
        return args.batch_size
    sizes = [s for s in SIZES if s <= count] or [1]
    rates = engine.rates(sizes)
    best = max(rates.values())
    size = min(s for s, r in rates.items() if r >= 0.95 * best)
    measured = ", ".join(f"{s}: {r:.0f}" for s, r in rates.items())
    _log.info("batch size %d: the fastest here now (tok/s per batch size: %s); "
              "--batch-size to choose", size, measured)  # fmt: skip
    return size


def _run(argv: Sequence[str] | None) -> int:
    require_streams("stderr")
    args = batch_parser().parse_args(argv)
    _check_args(args)
    _import_torch()
    from utils.batch import AnswerLog, pending

    jobs = _jobs(args)
    log = AnswerLog(args.out)
    try:
        todo = pending(jobs, log.done)
        if not todo:
            _log.info("every answer is already in %s", args.out)
            return 0
        if args.short_answers:
            _log.warning(
                "stand-in weights never end an answer: each stops after "
                "%d tokens where its line does not say",
                STANDIN_TOKENS,
            )
        _set_threads(args.threads)
        run = load(args, "reasoning" if args.chat else "base", **_chat_kwargs(args))
        ids = _encoded(run, todo)
        engine = _engine(args, run)
        size = _batch_size(args, run, engine, len(todo))
        _decode(args, run, engine, size, todo, ids, log)
    finally:
        log.close()
    return 0


def _chat_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    if not args.chat:
        return {}
    return dict(apply_chat_template=True, add_generation_prompt=True,
                add_thinking=args.thinking)  # fmt: skip


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        from utils.fast import pin_step_threads

        pin_step_threads(threads)


def _engine(args: argparse.Namespace, run: Any) -> Any:
    from utils.batch import BookEngine, FastEngine

    if args.fast:
        return FastEngine.for_run(run, args.int8)
    _log.info("the book's batched model: a row's tokens can change with the "
              "batch size (bf16 padding); --fast keeps every row's tokens")  # fmt: skip
    return BookEngine(run)


def _decode(args, run, engine, size, todo, ids, log: AnswerLog) -> None:
    """Decode `todo`, appending each answer as it finishes, with progress."""
    from tqdm.auto import tqdm

    from utils.streaming import decode_bytes

    started: dict[tuple[int, int], float] = {}
    jobs = {job.line: job for job, _ in todo}
    tokens: dict[tuple[int, int], list[int]] = {}
    bar = tqdm(total=len(todo), unit="answer", file=sys.stderr, disable=None)
    made, finished, start = 0, 0, time.perf_counter()
    try:
        events = engine.events(_requests(todo, ids, started), size,
                               run.tokenizer.eos_token_id)  # fmt: skip
        for event in events:
            got = tokens.setdefault(event.key, [])
            if event.token is not None:
                got.append(event.token)
                made += 1
                continue
            line, sample = event.key
            seconds = round(time.perf_counter() - started[event.key], 3)
            log.write({"id": jobs[line].id, "sample": sample,
                       "text": decode_bytes(run.tokenizer, got), "tokens": len(got),
                       "stop": event.reason, "seconds": seconds})  # fmt: skip
            del tokens[event.key]
            finished += 1
            bar.set_postfix_str(f"{made / (time.perf_counter() - start):.1f} tok/s")
            bar.update()
    except KeyboardInterrupt:
        _log.warning("stopped: %d of %d answers are in %s; run the same command "
                     "again for the rest", finished, len(todo), args.out)  # fmt: skip
        raise
    finally:
        bar.close()
    _say_done(args, log, todo)


def _say_done(args, log: AnswerLog, todo) -> None:
    from utils.batch import answer_key

    missing = [k for k in (answer_key(j.id, s) for j, s in todo) if k not in log.done]
    assert not missing, missing
    _log.info("%d answers in %s", len(todo), args.out)


def batch_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `qwen3-batch` (`python -m utils.batch`)."""
    from utils.stdio import utf8_streams

    utf8_streams()
    with contextlib.suppress(AttributeError):
        sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    return run_command(PROG, lambda: _run(argv))
