"""What the benchmark says on stderr while it runs (`utils.benchmark`).

A run takes minutes, on a busy machine many more, and a compile, a slow
timed run or a long prefill makes no line of its own for minutes. So:

* before the first mode, `estimate_line`: the whole run's time on this
  machine now, from `Probe` (the book's KV cache: one short prompt's
  prefill and a few steps, timed; a longer prefill where an uncached mode
  runs) and what each mode does (`estimate_run_s`);
* while it runs, `Ticker`: every line of the run goes through it, and when
  none came for `HEARTBEAT_S` seconds it says what runs (the mode, its
  warm-up or timed run k of n), for how long, the tokens so far and their
  rate. A background thread looks every second; every token looks too.

The clock is `now()`, so a test can run a whole benchmark on a fake one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from utils.log import get_logger

LOG_NAME = "utils.benchmark"  # the benchmark's lines, under its name
HEARTBEAT_S = 30.0  # the longest silence while a run lasts
COMPILE_S = 180.0  # a compiled mode's two warm-ups: 1 to 5 minutes on a CPU
MODE_OVERHEAD_S = 5.0  # building a mode, two read-speed probes


def now() -> float:
    """The progress clock (seconds; monotonic)."""
    return time.monotonic()


class Ticker:
    """A run's progress lines: `say` writes one, `phase` names what runs
    now, `token` counts its tokens; while entered (`with`), a line at least
    every `every_s` seconds. Quiet: says nothing, starts no thread."""

    def __init__(self, quiet: bool = False, every_s: float | None = None) -> None:
        self.quiet = quiet
        self.every_s = HEARTBEAT_S if every_s is None else every_s
        self.what, self.count = "starting", 0
        self.since = self.last = now()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Ticker:
        if not self.quiet:
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.every_s)):
            self.beat()

    def say(self, text: str) -> None:
        """One line on stderr (nothing when quiet)."""
        if not self.quiet:
            get_logger(LOG_NAME).info(text)
        with self._lock:
            self.last = now()

    def phase(self, what: str) -> None:
        """From now on `what` runs (e.g. "kv_cache: timed run 2 of 3")."""
        with self._lock:
            self.what, self.count, self.since = what, 0, now()

    def end(self, finished: bool = True) -> None:
        """Say how the current phase ended: "done", or "stopped" (Ctrl-C, an
        error), with its tokens and time."""
        with self._lock:
            took, count, what = now() - self.since, self.count, self.what
        how = "done" if finished else "stopped"
        self.say(f"{what}: {how}, {count} tokens in {took:.1f} s")

    def token(self, *_: Any) -> None:
        """One more token of the current phase."""
        with self._lock:
            self.count += 1
        self.beat()

    def counted(self, stream: Callable[[], Iterable[Any]]) -> Callable[[], Any]:
        """`stream` (a factory) whose items each count as a token."""

        def counting() -> Iterable[Any]:
            for item in stream():
                self.token()
                yield item

        return counting

    def beat(self) -> None:
        """Say what runs if nothing was said for `every_s` seconds."""
        with self._lock:
            due = now() - self.last >= self.every_s
        if due:
            self.say(self.status())

    def status(self) -> str:
        """ "kv_cache: timed run 2 of 3, 41 s, 57 tokens so far (1.4 tok/s)"."""
        with self._lock:
            took, count = now() - self.since, self.count
            text = f"{self.what}, {took:.0f} s"
        if count:
            text += f", {count} tokens so far ({count / max(took, 1e-9):.1f} tok/s)"
        return text + ", still running"


@dataclass(frozen=True)
class Probe:
    """This machine now, with the book's KV cache: seconds to the first token
    of a `prompt_tokens`-token prompt, seconds per later token, and seconds
    per prompt token of an uncached forward (0 when not measured)."""

    first_s: float
    step_s: float
    prompt_tokens: int
    per_row_s: float = 0.0


def time_tokens(stream: Iterable[Any]) -> tuple[float, float, int]:
    """(seconds to the first item, seconds in all, items) of `stream` on the
    progress clock."""
    start = now()
    first, count = None, 0
    for _ in stream:
        count += 1
        first = now() if first is None else first
    end = now()
    return (end if first is None else first) - start, end - start, count


def probe(
    kv_stream: Callable[[int], Iterable[Any]],
    prompt_tokens: int,
    forward: Callable[[], Any] | None = None,
    forward_rows: int = 0,
) -> Probe:
    """Time `kv_stream(5)` (the book's KV cache making 5 tokens) and, given,
    `forward()` (one uncached forward of `forward_rows` rows)."""
    first_s, total_s, count = time_tokens(kv_stream(5))
    step_s = (total_s - first_s) / max(count - 1, 1)
    per_row_s = 0.0
    if forward is not None and forward_rows:
        start = now()
        forward()
        per_row_s = max(now() - start - step_s, 0.0) / forward_rows
    return Probe(first_s, step_s, prompt_tokens, per_row_s)


def generation_s(p: Probe, new_tokens: int, cache: bool) -> float:
    """One generation of `new_tokens` at the probe's speeds: with a cache, a
    prefill and a step per token; without one, every step a forward over
    the whole sequence so far (the weights once, plus the rows)."""
    if cache:
        return p.first_s + (new_tokens - 1) * p.step_s
    rows = sum(p.prompt_tokens + i for i in range(new_tokens))
    return new_tokens * p.step_s + rows * p.per_row_s


def estimate_run_s(
    p: Probe, modes: Sequence[Any], new_tokens: int, repeats: int
) -> float:
    """Seconds for `modes` (objects with `compiled`, `cache` and `family`):
    each runs a warm-up, `repeats` timed runs and, when its tokens come one
    by one (all but "hf"), one more beside `torch.sum`, which about doubles
    it; a compiled mode adds `COMPILE_S`. Every cached mode is taken at the
    book's KV-cache speed, the slowest of them on the CPUs measured: an
    estimate on the long side."""
    total = 0.0
    for mode in modes:
        runs = 1 + repeats + (2 if mode.family != "hf" else 0)
        total += runs * generation_s(p, new_tokens, mode.cache) + MODE_OVERHEAD_S
        total += COMPILE_S if mode.compiled else 0.0
    return total


def estimate_line(p: Probe, seconds: float, count: int) -> str:
    """The line said before the first mode."""
    rate = 1 / max(p.step_s, 1e-9)
    modes = f"{count} mode{'s' if count != 1 else ''}"
    return (
        f"{modes}: about {_duration(seconds)} on this machine now (a quick "
        f"probe: the book's KV cache at {rate:.1f} tok/s); --modes to choose fewer"
    )


def progress_line(done: int, total: int, name: str, elapsed_s: float) -> str:
    """ "mode 3 of 6: fast_int8", and once a mode has finished, the time left
    estimated from the modes so far (their mean time, times the modes left)."""
    text = f"mode {done + 1} of {total}: {name}"
    if done:
        left = elapsed_s / done * (total - done)
        text += (
            f" (about {_duration(left)} left, estimated from the "
            f"{done} mode{'s' if done > 1 else ''} so far)"
        )
    return text


def _duration(seconds_: float) -> str:
    if seconds_ < 90:
        return f"{max(seconds_, 1):.0f} s"
    return f"{seconds_ / 60:.0f} min"
