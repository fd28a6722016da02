"""How many threads a CPU decode step runs on, on a machine that may be busy.

torch starts one thread per core. A step whose threads meet at barriers
(the native step, `utils.fast.native`) waits for any of them the OS has
descheduled in favour of another program, so on a busy machine fewer
threads can be many times faster (ch02/03_fast-decoding/README.md, "A busy
machine"). `ThreadChoice` picks the count from the steps' own times;
`pin_step_threads` fixes it, as the commands' `--threads` does.
"""

from __future__ import annotations

import torch

# The thread count every native step runs on (None: each step chooses,
# see ThreadChoice); set by pin_step_threads
_pinned: int | None = None


def pin_step_threads(threads: int | None) -> None:
    """torch's thread count and every native step's: exactly `threads`
    (what `--threads` asks for); None: native steps choose again from
    torch's count, which stays as it is (`ThreadChoice`)."""
    global _pinned
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    _pinned = threads


def pinned_threads() -> int | None:
    """The count `pin_step_threads` set (None: none)."""
    return _pinned


def thread_candidates(most: int) -> list[int]:
    """The thread counts a step tries, most first: all, one fewer (a core
    taken by another program), then halves down to 1."""
    counts, n = {most, max(most - 1, 1)}, most
    while n > 1:
        n //= 2
        counts.add(max(n, 1))
    return sorted(counts, reverse=True)


class ThreadChoice:
    """The thread count of a native step, chosen by the steps' own times.

    A step's threads meet at a barrier after every product; when another
    program keeps a core busy, the OS deschedules one of them now and then
    and the others wait for it, so fewer threads can be many times faster
    (ch02/03_fast-decoding/README.md, "A busy machine"). What the OS gives
    changes from minute to minute, so no count is right for good: each count
    of `thread_candidates(most)` is timed once, then the fastest so far runs
    (its time a moving average over the steps it runs), and every other
    count is tried again once after `retry` steps times how much slower it
    was (a count 10x slower costs under 1/16 of the time; one as fast is
    rechecked soon); a time older than `retry` steps is replaced, not
    averaged. The first step (cold caches) is not counted. `most` follows
    torch's thread count."""

    def __init__(self, retry: int = 16, weight: float = 0.3) -> None:
        self.retry, self.weight = retry, weight
        self.most = 0
        self.seconds: dict[int, float] = {}  # moving average per count
        self.due: dict[int, int] = {}  # the step at which to try it again
        self.last: dict[int, int] = {}  # the step it last ran
        self.steps = 0

    def _reset(self, most: int) -> None:
        self.most, self.seconds, self.last = most, {}, {}
        self.due = {n: 0 for n in thread_candidates(most)}
        self.steps = -1  # the next step is a warm-up

    def next(self, most: int) -> int:
        """The count for the next step, given torch's thread count."""
        if most != self.most:
            self._reset(most)
        untried = [n for n in self.due if n not in self.seconds]
        if untried:
            return untried[0]
        best = min(self.seconds, key=self.seconds.__getitem__)
        late = [n for n, step in self.due.items() if n != best and step <= self.steps]
        return late[0] if late else best

    def record(self, threads: int, seconds: float) -> None:
        """How long a step on `threads` threads took."""
        self.steps += 1
        if self.steps <= 0 or threads not in self.due:
            return  # the warm-up step, or a count from before a reset
        old, fresh = self.seconds.get(threads), self.steps - self.retry
        if old is None or self.last.get(threads, fresh) <= fresh:
            self.seconds[threads] = seconds  # none yet, or from another time
        else:
            self.seconds[threads] = old + self.weight * (seconds - old)
        self.last[threads] = self.steps
        fastest = min(self.seconds.values())
        slower = self.seconds[threads] / fastest if fastest > 0 else 1.0
        self.due[threads] = self.steps + round(self.retry * slower)
