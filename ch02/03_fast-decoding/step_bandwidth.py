"""How close the native decode step comes to the machine's memory speed.

Each round times one native step (bf16, then int8) and, right after it, one
`torch.sum` over a buffer of exactly the bytes that step reads (on 2 MB
pages where Linux gives them, as the step's weights are), so both see the
same moment of a shared machine whose memory speed drifts:

    QWEN3_STANDIN=1 uv run python ch02/03_fast-decoding/step_bandwidth.py

Per step it prints the kernels it ran, the median step time, the GB/s it
reads and the median of step speed / sum speed (1.00: at the memory's
speed), then that median in the slowest, middle and fastest third of the
rounds by `torch.sum`'s speed, beside what one core alone reads (a
one-thread `torch.sum`, as a share of all threads'). Where one core reads
about half of what two do, each core streams at its own limit, and time a
core spends off the weights (attention, norms, waits, Python) is lost.

`--kernels A,B,...` times one step per kernel named instead (each forced as
QWEN3_KERNEL_VARIANTS would), side by side in the same rounds: how a reader
checks on their own machine whether a kernel the rules did not pick reads
faster there.
"""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any

import torch


def side_by_side(
    models: dict[str, Any], rounds: int = 30, positions: int = 200
) -> list[dict[str, Any]]:
    """One row per named FastQwen3 (native step in use): median step time,
    GB/s read, the median ratio of step speed to `torch.sum` speed over the
    same bytes (timed in turn within each round), and that ratio in thirds
    of the rounds by `torch.sum`'s speed, with the share one core reads."""
    from utils.benchmark import read_buffer, time_beside_sum, weight_bytes_per_token
    from utils.fast import prefill

    cpu = torch.device("cpu")
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    state = {}
    for name, model in models.items():
        nbytes = weight_bytes_per_token(model)
        model.setup_cache(1, prompt.shape[1] + positions)
        token, _ = prefill(model, prompt)
        state[name] = (model, token, read_buffer(nbytes, cpu), nbytes, [])
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
    from utils.fast import describe_step

    step_s = statistics.median(p[0] for p in pairs)
    return {
        "mode": name,
        "kernels": describe_step(model),
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
    core reads of what all read. A kernel may keep up in slow moments only."""
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


def native_models(book: Any, kernels: list[str]) -> dict[str, Any]:
    """{name: fast model with the native step} built through the fast
    decoder's registry: bf16 and int8, or one per kernel in `kernels` (its
    class's weights: int8 for int8 kernels, bf16 otherwise)."""
    from utils.fast import get_kernels, get_path, kernel_table

    if not kernels:
        return {f"native {kind}": get_path(path).build(book)
                for kind, path in (("bf16", "fast_native"),
                                   ("int8", "fast_native_int8"))}  # fmt: skip
    table = {k.name: k for k in kernel_table(get_kernels())}
    models = {}
    for name in kernels:
        if name not in table:
            raise ValueError(f"no kernel {name!r}; choose from {', '.join(table)}")
        path = "fast_native_int8" if table[name].cls == "int8" else "fast_native"
        model = get_path(path).build(book)
        model.use_native_step(kernels=name)
        models[name] = model
    return models


def print_rows(rows: list[dict[str, Any]]) -> None:
    """The rows as two markdown tables (overall, then by thirds)."""
    print("| step | kernels | GB read per token | ms per token | GB/s | "
          "torch.sum GB/s (same bytes) | step / sum (median) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['kernels']} | {r['gb_per_token']:.2f} | "
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


def _parser():
    from utils.errors import CommandParser

    parser = CommandParser(
        prog="step_bandwidth.py",
        description="How close the native decode step comes to the "
        "machine's memory speed, timed beside torch.sum over the same bytes.",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=30,
        help="rounds of one step per model, each beside a torch.sum",
    )
    parser.add_argument(
        "--kernels",
        default=None,
        help="comma-separated kernel names to time side by side (default: "
        "the rules' bf16 and int8 choice)",
    )
    parser.add_argument("--out-dir", default=None,
                        help="folder of the model files (default: the per-user "
                        "store; stand-ins with QWEN3_STANDIN=1)")  # fmt: skip
    return parser


def _run(args) -> int:
    from utils.download import download_qwen3_small
    from utils.errors import UsageError
    from utils.fast import get_path
    from utils.models import load_book_model_file

    if args.rounds < 3:
        raise UsageError("--rounds must be at least 3")
    reason = get_path("fast_native").unavailable("cpu")
    if reason is not None:
        raise UsageError(f"the native step cannot run here: {reason}")
    files = download_qwen3_small("base", out_dir=args.out_dir)  # or stand-ins
    book = load_book_model_file(files.model, "cpu", torch.bfloat16)
    names = [n.strip() for n in (args.kernels or "").split(",") if n.strip()]
    try:
        models = native_models(book, names)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print_rows(side_by_side(models, args.rounds))
    return 0


def main(argv: list[str] | None = None) -> int:
    from utils.errors import run_command

    args = _parser().parse_args(argv)
    return run_command("step_bandwidth.py", lambda: _run(args))


if __name__ == "__main__":
    raise SystemExit(main())
