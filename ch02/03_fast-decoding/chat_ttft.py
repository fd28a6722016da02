"""The chat's time to the first token, turn by turn.

Five messages of one length (by default), each answered with 150 new tokens
through `utils.cli.ChatSession`, the class behind `qwen3-chat`; prints each
turn's prompt length and the time from the start of the answer to its first
token (the prefill). A chat that keeps its KV cache prefills only the new
turn, so the time stays flat; one that encodes the whole conversation again
waits longer every turn. The first token is timed around the streamer, so
the script measures older versions of the chat too. `--rounds N` holds
the conversation N times (a new session each time) and prints each turn's
median, with the spread (half the range) of the wall times.

    QWEN3_STANDIN=1 uv run python ch02/03_fast-decoding/chat_ttft.py --fast
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

MESSAGE = "Tell me one more thing about topic {}, please."


class FirstTokenClock:
    """Wraps a streamer: the seconds from each `stream` call (the path is
    already built: see the warm-up) to its first token, on the wall clock
    and in the process's CPU time (all its threads: on a machine busy with
    other work the wall time swings, the work does not)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.times: list[tuple[float, float]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[int]:
        gen = self.inner.stream(*args, **kwargs)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            for i, token in enumerate(gen):
                if i == 0:
                    wall = time.perf_counter() - wall
                    self.times.append((wall, time.process_time() - cpu))
                yield token
        finally:
            gen.close()  # type: ignore[attr-defined]


def _parser():
    from utils.errors import CommandParser

    p = CommandParser(prog="chat_ttft.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=5,
                   help="messages per conversation, one length each")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=150,
                   help="tokens of each answer")  # fmt: skip
    p.add_argument("--fast", action="store_true",
                   help="the fast path, as qwen3-chat --fast")  # fmt: skip
    p.add_argument("--threads", type=int, default=None,
                   help="torch's CPU threads (default: torch's choice)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=1,
                   help="conversations held (each turn's median)")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    from reasoning_from_scratch.qwen3 import Qwen3Tokenizer

    from utils import cli, models
    from utils.download import download_qwen3_small
    from utils.streaming import GreedyStreamer

    if args.threads:
        torch.set_num_threads(args.threads)
    files = download_qwen3_small("reasoning", out_dir=None)  # the model store
    tokenizer = Qwen3Tokenizer(str(files.tokenizer))
    model = models.load_book_model_file(files.model, "cpu")
    clock = FirstTokenClock(GreedyStreamer(model, adopt=args.fast))
    # warm-up: build the path (and the kernels) before any clock runs
    list(clock.stream(torch.tensor([[1, 2, 3]]), 2, fast=args.fast))
    turns: list[list[tuple[int, float, float]]] = [[] for _ in range(args.turns)]
    for _ in range(args.rounds):
        session = cli.ChatSession(
            tokenizer, clock, torch.device("cpu"), 40960, args.max_new_tokens,
            fast=args.fast,
        )  # fmt: skip
        for turn in turns:
            info = session.reply(MESSAGE.format(len(turn) + 1), lambda text: None)
            turn.append((info["prompt_tokens"], *clock.times[-1]))
        session.clear()
    print_turns(turns)


def print_turns(turns: list[list[tuple[int, float, float]]]) -> None:
    """One row per turn: its prompt length and the medians over the rounds
    of (first-token wall s, its CPU s), and turn / turn 1 for each."""
    print("| Turn | Prompt (tokens) | First token (s) | CPU time to it (s) "
          "| Wall / turn 1 | CPU / turn 1 |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    first = None
    for i, rounds in enumerate(turns, 1):
        walls = [r[1] for r in rounds]
        wall, cpu = statistics.median(walls), statistics.median(r[2] for r in rounds)
        first = first or (wall, cpu)
        spread = (
            f" ±{(max(walls) - min(walls)) / 2 / wall:.0%}" if len(walls) > 1 else ""
        )
        print(f"| {i} | {rounds[0][0]} | {wall:.2f}{spread} | {cpu:.2f} "
              f"| {wall / first[0]:.2f} | {cpu / first[1]:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
