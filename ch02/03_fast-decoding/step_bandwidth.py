"""How close one native decode step comes to the machine's read speed,
measured side by side: each round times one step (bf16, then int8) and one
`torch.sum` over a buffer of exactly the bytes that step reads, so both see
the same moment of a shared, drifting machine.

    QWEN3_STANDIN=1 uv run python ch02/03_fast-decoding/step_bandwidth.py [--rounds 30]

Prints per precision the kernel variant the step ran (chosen for this
machine by utils.fast.tuner, or forced with QWEN3_KERNEL_VARIANTS), the
median step time, the GB/s it reads and the median of step-speed /
sum-speed over the rounds (1.00 = at the memory limit).
The benchmark's share column instead compares a mode's median with the best
of several 1 GiB probes around it, a stricter figure on a noisy machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def side_by_side(
    models: dict[str, Any], rounds: int = 30, positions: int = 200
) -> list[dict[str, float | str]]:
    """One row per named FastQwen3 (native step in use): median step time,
    GB/s read, and the median ratio of step speed to `torch.sum` speed over
    the same bytes, timed alternately within each round."""
    from utils.benchmark import weight_bytes_per_token
    from utils.fast import prefill

    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    state = {}
    for name, model in models.items():
        nbytes = weight_bytes_per_token(model)
        model.setup_cache(1, prompt.shape[1] + positions)
        token, _ = prefill(model, prompt)
        buffer = torch.ones(max(nbytes // 4, 1))
        state[name] = (model, token, buffer, nbytes, [], [])
    for r in range(rounds + 1):  # round 0 warms up and is not counted
        pos = torch.tensor([prompt.shape[1] + r % positions])
        for model, token, buffer, _, steps, sums in state.values():
            start = time.perf_counter()
            model.decode_step(model, token, pos)
            mid = time.perf_counter()
            torch.sum(buffer)
            end = time.perf_counter()
            if r:
                steps.append(mid - start)
                sums.append(end - mid)
    rows = []
    for name, (model, _, _, nbytes, steps, sums) in state.items():
        step_s = statistics.median(steps)
        rows.append(
            {
                "mode": name,
                "variant": model.decode_step.choice.summary(),
                "gb_per_token": nbytes / 1e9,
                "step_ms": step_s * 1e3,
                "step_gbps": nbytes / step_s / 1e9,
                "sum_gbps": nbytes / statistics.median(sums) / 1e9,
                "ratio": statistics.median(
                    s / t for t, s in zip(steps, sums, strict=True)
                ),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    from utils.download import download_qwen3_small
    from utils.fast import FastQwen3, quantize_int8
    from utils.models import load_book_model_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out-dir", default="qwen3")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
