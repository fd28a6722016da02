"""The benchmark speaks while it times: a line at least every 30 s of its
clock, and before the first mode an estimate of the whole run. Checked on a
fake clock with a fake timed mode (seconds of that clock per token), so no
test waits for minutes."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from tests.tiny import tiny_run
from utils.benchmark import modes as benchmark_modes
from utils.benchmark import progress


class FakeClock:
    """The progress clock, moved on by the fake mode's tokens only."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(progress, "now", fake)
    return fake


@pytest.fixture
def said(clock):
    """(clock time, line) of every line the benchmark says."""
    lines: list[tuple[float, str]] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append((clock.t, record.getMessage()))
    logger = logging.getLogger(progress.LOG_NAME)
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def seconds_per_token(clock: FakeClock, seconds: float):
    """A PREPARE entry: the tiny model, and a stream whose every token takes
    `seconds` of the fake clock (a slow machine, without the wait)."""

    def prepare(mode, book, token_ids, n):
        def stream():
            for i in range(n):
                clock.t += seconds
                yield torch.tensor([[i % 7]])

        return benchmark_modes.Prepared(stream, book)

    return prepare


def test_a_run_never_goes_30_s_without_a_line(clock, said, monkeypatch):
    """Two modes of 12 tokens at 7 s each, 3 timed runs: the gaps between
    lines stay within 30 s plus one token; the ticker names the mode, the
    run, the tokens so far and their rate; the estimate said before the
    first mode is near what the run took."""
    for family in ("book", "fast"):
        monkeypatch.setitem(
            benchmark_modes.PREPARE, family, seconds_per_token(clock, 7.0)
        )
    start = clock.t
    rows = tiny_run(["kv_cache", "fast"], quiet=False, max_new_tokens=12, repeats=3)
    took = clock.t - start
    assert [r["mode"] for r in rows] == ["kv_cache", "fast"]
    times = [t for t, _ in said]
    gaps = [b - a for a, b in zip([start, *times], [*times, clock.t], strict=True)]
    assert took > 800 and max(gaps) <= progress.HEARTBEAT_S + 7.0, gaps
    lines = [line for _, line in said]
    beats = [line for line in lines if line.endswith("still running")]
    assert any(
        re.fullmatch(r"kv_cache: timed run 2 of 3, \d+ s, \d+ tokens so far "
                     r"\(0\.1 tok/s\), still running", line)
        for line in beats
    ), beats  # fmt: skip
    (estimate,) = [line for line in lines if "on this machine now" in line]
    assert lines.index(estimate) < lines.index("mode 1 of 2: kv_cache")
    minutes = re.fullmatch(
        r"2 modes: about (\d+) min on this machine now \(a quick probe: the "
        r"book's KV cache at 0\.1 tok/s\); --modes to choose fewer",
        estimate,
    )
    assert minutes, estimate
    assert 0.7 <= int(minutes[1]) * 60 / took <= 1.5, (minutes[1], took)


def test_a_quiet_run_says_nothing_and_probes_nothing(clock, said, monkeypatch):
    probed = []
    monkeypatch.setattr(progress, "probe", lambda *a, **k: probed.append(a))
    monkeypatch.setitem(benchmark_modes.PREPARE, "book", seconds_per_token(clock, 40.0))
    tiny_run(["kv_cache"], max_new_tokens=3)
    assert said == [] and probed == []


class M:
    """A mode as the estimate reads it."""

    def __init__(self, family="book", cache=True, compiled=False):
        self.family, self.cache, self.compiled = family, cache, compiled


def test_the_estimate_counts_runs_compiles_and_the_uncached_sequence():
    p = progress.Probe(first_s=0.5, step_s=0.1, prompt_tokens=10, per_row_s=0.01)
    one = progress.generation_s(p, 100, cache=True)
    assert one == pytest.approx(0.5 + 99 * 0.1)
    kv = progress.estimate_run_s(p, [M()], 100, 3)
    assert kv == pytest.approx(6 * one + progress.MODE_OVERHEAD_S)
    compiled = progress.estimate_run_s(p, [M(compiled=True)], 100, 3)
    assert compiled == pytest.approx(kv + progress.COMPILE_S)
    hf = progress.estimate_run_s(p, [M(family="hf")], 100, 3)
    assert hf == pytest.approx(4 * one + progress.MODE_OVERHEAD_S)  # no paired run
    # without a cache each step reads the whole sequence: it grows faster
    regular = [progress.estimate_run_s(p, [M(cache=False)], n, 3) for n in (50, 100)]
    assert regular[1] > 2.5 * regular[0] and regular[0] > kv / 2
    line = progress.estimate_line(p, 5 * 60 + 20, 6)
    assert line == (
        "6 modes: about 5 min on this machine now (a quick probe: the book's KV "
        "cache at 10.0 tok/s); --modes to choose fewer"
    )
    assert "about 45 s" in progress.estimate_line(p, 45, 1)


def test_the_probe_times_five_tokens_and_an_uncached_forward(clock):
    def kv_stream(k):
        for _ in range(k):
            clock.t += 2.0
            yield 1

    def forward():
        clock.t += 2.0 + 100 * 0.5

    p = progress.probe(kv_stream, 11, forward, 100)
    assert (p.first_s, p.step_s, p.prompt_tokens) == (2.0, 2.0, 11)
    assert p.per_row_s == pytest.approx(0.5)
