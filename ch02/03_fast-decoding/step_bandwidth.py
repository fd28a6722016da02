"""How close one native decode step comes to the machine's read speed,
measured side by side: each round times one step (bf16, then int8) and one
`torch.sum` over a buffer of exactly the bytes that step reads (on 2 MB
pages where Linux gives them, as the step's weights are), so both see the
same moment of a shared, drifting machine.

    QWEN3_STANDIN=1 uv run python ch02/03_fast-decoding/step_bandwidth.py [--rounds 30]

Prints per precision the kernel variant the step ran (chosen for this
machine by utils.fast.tuner, or forced with QWEN3_KERNEL_VARIANTS), the
median step time, the GB/s it reads and the median of step-speed /
sum-speed over the rounds (1.00 = at the memory limit), then that median
in the slowest, middle and fastest third of the rounds by torch.sum's
speed (a shared machine's memory changes speed from second to second),
and beside it what one core alone reads (`torch.sum` on one thread, as a
share of two). Where one core reads about half of what two do, each core
streams at its own limit, and the time a core spends off the weights
(attention, norms, waits, Python) is lost to the step: no other core can
take up its share.
The benchmark's share column times whole generations the same way (a
torch.sum after each token) and, in brackets, compares a mode's median with
the best of several 1 GiB probes, a stricter figure on a noisy machine.

Last, where a step's time goes at positions 5, 100 and 200, by clocks
inside the C step (`--clock-steps` steps per position, each after a
`torch.sum`): the products, the threads waiting for each other, the
attention, the rest of the vector work, the call outside its threads,
and the Python around the call. On a fast memory the products can keep
up with `torch.sum` while the rest holds the step back.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def side_by_side(
    models: dict[str, Any], rounds: int = 30, positions: int = 200
) -> list[dict[str, Any]]:
    """One row per named FastQwen3 (native step in use): median step time,
    GB/s read, the median ratio of step speed to `torch.sum` speed over the
    same bytes (timed in turn within each round), and that ratio in the
    slowest, middle and fastest third of the rounds by `torch.sum` speed
    (its buffer on 2 MB pages where Linux gives them: `read_buffer`), with
    the share one core reads there (a one-thread sum after each pair)."""
    from utils.benchmark import read_buffer, time_beside_sum, weight_bytes_per_token
    from utils.fast import prefill

    cpu = torch.device("cpu")
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    state = {}
    for name, model in models.items():
        nbytes = weight_bytes_per_token(model)
        model.setup_cache(1, prompt.shape[1] + positions)
        token, _ = prefill(model, prompt)
        buffer = read_buffer(nbytes, cpu)
        state[name] = (model, token, buffer, nbytes, [])
    for r in range(rounds + 1):  # round 0 warms up and is not counted
        pos = torch.tensor([prompt.shape[1] + r % positions])
        for model, token, buffer, _, pairs in state.values():
            step = partial(model.decode_step, model, token, pos)
            pair = time_beside_sum(step, buffer, cpu)
            if r:
                pairs.append((*pair, one_core_sum(buffer)))
    return [_row(name, *state[name]) for name in state]


def one_core_sum(buffer: torch.Tensor) -> float:
    """Seconds of one `torch.sum(buffer)` on a single thread (the thread
    count is restored after it): what one core alone can read."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        torch.sum(buffer)
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)


def _row(name, model, _token, _buffer, nbytes, pairs) -> dict[str, Any]:
    """The figures of one model from its (step s, sum s, one-core sum s)
    rounds."""
    step_s = statistics.median(p[0] for p in pairs)
    return {
        "mode": name,
        "variant": model.decode_step.choice.summary(),
        "gb_per_token": nbytes / 1e9,
        "step_ms": step_s * 1e3,
        "step_gbps": nbytes / step_s / 1e9,
        "sum_gbps": nbytes / statistics.median(p[1] for p in pairs) / 1e9,
        "ratio": statistics.median(p[1] / p[0] for p in pairs),
        "thirds": by_memory_speed(pairs, nbytes),
    }


def by_memory_speed(
    rounds: list[tuple[float, float, float]], nbytes: int
) -> list[tuple[float, float, float, float]]:
    """The rounds (step s, sum s, one-core sum s) sorted by `torch.sum`'s
    speed and cut in three (slowest first): per third, its lowest and
    highest sum GB/s, the median step / sum ratio and the median share one
    core reads of what all read. A shared machine's memory changes speed
    from second to second, and a kernel may keep up in slow moments only."""
    ordered = sorted(rounds, key=lambda p: -p[1])  # longest sum first
    cut = [round(len(ordered) * k / 3) for k in range(4)]
    thirds = []
    for lo, hi in zip(cut, cut[1:], strict=False):
        part = ordered[lo:hi]
        if part:
            speeds = [nbytes / p[1] / 1e9 for p in part]
            ratio = statistics.median(p[1] / p[0] for p in part)
            one_core = statistics.median(p[1] / p[2] for p in part)
            thirds.append((min(speeds), max(speeds), ratio, one_core))
    return thirds


def where_time_goes(
    models: dict[str, Any], steps: int = 10, positions: tuple[int, ...] = (5, 100, 200)
) -> list[dict[str, Any]]:
    """Per named FastQwen3 (native step; its cache set up afresh for the
    positions) and position: the median ms of a step as the rounds above
    time it (each after a `torch.sum` over its bytes, so the caches are as
    cold as in generation), and the median ms of its parts by the clocks
    (`NativeStep.read_clocks`): products, waits, attention, the rest of a
    thread's part, the call outside the threads, and the Python around it."""
    from utils.benchmark import read_buffer, time_beside_sum, weight_bytes_per_token

    cpu, rows = torch.device("cpu"), []
    for name, model in models.items():
        model.setup_cache(1, max(positions) + 1)
        step, token = model.decode_step, torch.tensor([[1]])
        buffer = read_buffer(weight_bytes_per_token(model), cpu)
        for position in positions:
            pos = torch.tensor([position])
            run = partial(step, model, token, pos)
            step.read_clocks(True)
            timed = []
            for _ in range(steps):
                wall = time_beside_sum(run, buffer, cpu)[0]
                timed.append((wall, step.read_clocks(True)))
            step.read_clocks(False)
            rows.append({"mode": name, "position": position, **_medians(timed)})
    return rows


def _medians(timed: list[tuple[float, Any]]) -> dict[str, float]:
    """Median ms per step of the wall time, of each part by the clocks
    (StepClocks of one step each) and of the Python around the C call."""
    ms = {k: statistics.median(getattr(c, k) for _, c in timed) * 1e3 for k in _PARTS}
    ms["step_ms"] = statistics.median(wall for wall, _ in timed) * 1e3
    ms["python"] = statistics.median(wall - c.call for wall, c in timed) * 1e3
    return ms


# The parts of a step in where_time_goes' rows (StepClocks' names)
_PARTS = ("products", "waits", "attention", "rest", "outside")


def print_where_time_goes(rows: list[dict[str, Any]], steps: int) -> None:
    """where_time_goes' rows as a table, ms per step."""
    print(f"\nWhere a step's time goes (ms per step; the step's clocks, "
          f"{steps} steps per position, each after a torch.sum)")  # fmt: skip
    print("| step | position | ms per token | products | waiting | attention "
          "| rest | outside the threads | Python |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = " | ".join(f"{r[k]:.2f}" for k in (*_PARTS, "python"))
        print(f"| {r['mode']} | {r['position']} | {r['step_ms']:.2f} | {cells} |")


def main(argv: list[str] | None = None) -> int:
    from utils.download import download_qwen3_small
    from utils.fast import FastQwen3, quantize_int8
    from utils.models import load_book_model_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out-dir", default="qwen3")
    parser.add_argument(
        "--clock-steps", type=int, default=10,
        help="steps per position timed by the step's clocks (0: none)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    files = download_qwen3_small("base", out_dir=args.out_dir)  # or stand-ins
    book = load_book_model_file(files.model, "cpu", torch.bfloat16)
    bf16 = FastQwen3.from_book_model(book)
    int8 = quantize_int8(FastQwen3.from_book_model(book))
    for model in (bf16, int8):
        if not model.use_native_step():
            print("the native step cannot run here (see the line above)")
            return 1
    rows = side_by_side({"native bf16": bf16, "native int8": int8}, args.rounds)
    print("| step | kernel variant | GB read per token | ms per token | GB/s | "
          "torch.sum GB/s (same bytes) | step / sum (median) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['variant']} | {r['gb_per_token']:.2f} | "
            f"{r['step_ms']:.1f} | {r['step_gbps']:.1f} | {r['sum_gbps']:.1f} | "
            f"{r['ratio']:.2f} |"
        )
    print("\nThe rounds in thirds by torch.sum's speed (GB/s): step / sum "
          "(in brackets: one core's torch.sum / all cores')")  # fmt: skip
    print("| step | slowest third | middle third | fastest third |")
    print("|---|---|---|---|")
    for r in rows:
        cells = [f"{lo:.0f}-{hi:.0f}: {ratio:.2f} ({one:.2f})"
                 for lo, hi, ratio, one in r["thirds"]]  # fmt: skip
        print(f"| {r['mode']} | " + " | ".join(cells) + " |")
    if args.clock_steps > 0:
        models = {"native bf16": bf16, "native int8": int8}
        parts = where_time_goes(models, args.clock_steps)
        print_where_time_goes(parts, args.clock_steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
