"""utils.benchmark.bandwidth: the bytes a decode step reads, torch.sum's buffer
on the step's page size, and a step timed beside a sum over its bytes (the
benchmark's same-moment share)."""

from __future__ import annotations

import pytest
import torch

import utils.benchmark.bandwidth as bandwidth
import utils.fast
from tests.tiny import tiny_config
from utils.download.standin import standin_state_dict
from utils.models import load_book_model

TINY = tiny_config(vocab_size=500)
SD = standin_state_dict(TINY, 0)


def _weight_bytes_by_hand() -> int:
    """float32 bytes of every tensor but the embedding table (the stand-in's
    output head is its own tensor), plus the one embedding row read."""
    total = sum(v.numel() for k, v in SD.items() if k != "tok_emb.weight")
    return 4 * (total + TINY["emb_dim"])


def test_int8_reads_fewer_weight_bytes():
    from utils.fast import FastQwen3, quantize_int8

    book = load_book_model(SD, "cpu", torch.bfloat16, TINY)
    fast = FastQwen3.from_book_model(book)
    bf16 = bandwidth.weight_bytes_per_token(fast)
    assert bf16 == _weight_bytes_by_hand() // 2
    int8 = bandwidth.weight_bytes_per_token(quantize_int8(fast))
    # int8 weights plus their scales: a bit over half of bf16
    assert 0.45 * bf16 < int8 < 0.6 * bf16


def test_read_bandwidth_probe_is_plausible():
    bps = bandwidth.measure_read_bandwidth(torch.device("cpu"), 1 << 24, repeats=3)
    assert 1e8 < bps < 1e13  # between 0.1 GB/s and 10 TB/s


def test_the_sums_buffer_lies_on_2_mb_pages_where_linux_gives_them(monkeypatch):
    """torch.sum's buffer (the memory-speed yardstick) on the same page size
    as the native step's weights: 2 MB pages where huge pages are on, else
    plain memory; ones either way, the size asked for (at least one)."""
    import utils.fast.hugepages as hugepages

    cpu = torch.device("cpu")
    monkeypatch.setattr(utils.fast, "huge_pages_enabled", lambda: True)
    buf = bandwidth.read_buffer(3 << 20, cpu)
    assert buf.dtype == torch.float32 and buf.numel() == (3 << 20) // 4
    assert buf.data_ptr() % hugepages.HUGE_PAGE == 0
    assert bool((buf == 1).all())
    monkeypatch.setattr(utils.fast, "huge_pages_enabled", lambda: False)
    plain = bandwidth.read_buffer(3 << 20, cpu)
    assert plain.numel() == buf.numel() and bool((plain == 1).all())
    assert bandwidth.read_buffer(0, cpu).numel() == 1


def _fake_pairs(monkeypatch, pairs):
    """time_beside_sum replaced: it still runs the step, then returns the
    next (step seconds, sum seconds) of `pairs`; the buffer sizes seen."""
    times, sizes = iter(pairs), []

    def fake(step, buffer, device):
        step()
        sizes.append(buffer.numel())
        return next(times)

    monkeypatch.setattr(bandwidth, "time_beside_sum", fake)
    return sizes


def test_paired_share_is_the_median_of_sum_over_step_per_decode_step(monkeypatch):
    sizes = _fake_pairs(monkeypatch, [(2.0, 1.0), (1.0, 1.0), (4.0, 1.0), (9, 9)])
    share, gbps = bandwidth.paired_share(
        lambda: iter(range(4)), 400, torch.device("cpu")
    )
    # token 0 is the prompt's and is not timed; tokens 1-3 give 0.5, 1, 0.25;
    # the fourth round finds the stream's end and does not count
    assert share == pytest.approx(0.5)
    assert gbps == pytest.approx(400 / 1.0 / 1e9)  # the sums' median: 1 s
    assert sizes == [100] * 4  # float32 over the step's 400 bytes


def test_paired_share_stops_after_its_rounds_and_closes_the_stream(monkeypatch):
    _fake_pairs(monkeypatch, [(1.0, 0.8)] * 5)
    made, closed = [], []

    def stream():
        try:
            for i in range(100):
                made.append(i)
                yield i
        finally:
            closed.append(True)

    share, _ = bandwidth.paired_share(stream, 8, torch.device("cpu"), rounds=5)
    assert share == pytest.approx(0.8)
    assert made == list(range(6)) and closed == [True]


def test_paired_share_needs_three_steps(monkeypatch):
    _fake_pairs(monkeypatch, [(1.0, 1.0)] * 3)
    assert (
        bandwidth.paired_share(lambda: iter(range(3)), 8, torch.device("cpu")) is None
    )


def test_time_beside_sum_times_the_step_then_the_sum(monkeypatch):
    """The step is timed alone, then the sum over the buffer alone: in that
    order, on that buffer, each at least its own sleep and the step's time
    without the sum's (no fixed upper bound: a busy machine makes any time
    longer)."""
    import time

    calls = []
    real_sum = torch.sum

    def slow_sum(t, *args, **kwargs):
        calls.append(("sum", t.numel()))
        time.sleep(0.3)
        return real_sum(t, *args, **kwargs)

    def step():
        calls.append(("step", None))
        time.sleep(0.05)

    monkeypatch.setattr(torch, "sum", slow_sum)
    step_s, sum_s = bandwidth.time_beside_sum(
        step, torch.ones(1 << 20), torch.device("cpu")
    )
    assert calls == [("step", None), ("sum", 1 << 20)]
    assert step_s >= 0.05 and sum_s >= 0.3
    assert step_s < sum_s  # the sum is not counted in the step
