"""How fast a long prompt goes through the model: prefill beside `torch.mm`.

A prompt's rows meet every weight matrix together, so its prefill is bound
by arithmetic, not by reading the weights. Each round times one prefill of
a prompt of `--prompt-tokens` tokens per mode (the benchmark's prompt
repeated, as its `--prompt-tokens` makes it) and, right after
it, one `torch.mm` of the prompt's rows by one weight matrix of the model
(1024 x 3072 for the 0.6B model, bf16), so both see the same moment of a
shared machine:

    QWEN3_STANDIN=1 uv run python ch02/03_fast-decoding/prefill_rate.py

Per mode it prints the median prefill time and tokens/sec, the multiply-
adds per second the linear layers need for the prompt (every layer's
products for every row, the output layer's for the last row only: what a
prefill must compute to give the next token), the same rate of the
`torch.mm` beside it, their ratio (1.00: the whole prefill multiplies as
fast as one plain product of bf16 matrices; attention, norms and the rest
come on top) and the speed as a ratio to the first mode's.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

MODES = ("fast", "fast_native", "fast_native_int8")


def needed_multiply_adds(cfg: dict[str, Any], num_tokens: int) -> int:
    """The linear layers' multiply-adds a prefill of `num_tokens` needs:
    every transformer layer's products for every row, the output layer's
    for the last row."""
    emb, heads, groups = cfg["emb_dim"], cfg["n_heads"], cfg["n_kv_groups"]
    head_dim = cfg["head_dim"] or emb // heads
    attention = emb * head_dim * (2 * heads + 2 * groups)  # q, out; k, v
    feed_forward = 3 * emb * cfg["hidden_dim"]
    per_row = cfg["n_layers"] * (attention + feed_forward)
    return num_tokens * per_row + emb * cfg["vocab_size"]


def time_prefill(model: Any, ids: torch.Tensor) -> float:
    """Seconds of one prefill of `ids` from position 0 (a fresh cache)."""
    from utils.fast import prefill

    model.setup_cache(1, ids.shape[1] + 1)
    start = time.perf_counter()
    prefill(model, ids)
    return time.perf_counter() - start


def time_mm(a: torch.Tensor, b: torch.Tensor) -> float:
    """Seconds of one `a @ b`."""
    start = time.perf_counter()
    torch.mm(a, b)
    return time.perf_counter() - start


def side_by_side(
    models: dict[str, Any], cfg: dict[str, Any], ids: torch.Tensor, rounds: int
) -> list[dict[str, Any]]:
    """One row per mode, prefilling the prompt `ids` (1, n): median prefill
    seconds, tok/s, G multiply-adds/s (`needed_multiply_adds`), the
    `torch.mm` rate beside it, their median ratio per round, and tok/s as a
    share of the first mode's."""
    num_tokens = ids.shape[1]
    a = torch.randn(num_tokens, cfg["emb_dim"]).to(torch.bfloat16)
    b = torch.randn(cfg["emb_dim"], cfg["hidden_dim"]).to(torch.bfloat16)
    mm_macs = num_tokens * cfg["emb_dim"] * cfg["hidden_dim"]
    pairs: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    with torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms up and is not counted
            for name, model in models.items():
                pair = (time_prefill(model, ids), time_mm(a, b))
                if r:
                    pairs[name].append(pair)
    macs = needed_multiply_adds(cfg, num_tokens)
    rows = []
    for name, got in pairs.items():
        seconds = statistics.median(p[0] for p in got)
        rows.append({
            "mode": name,
            "seconds": seconds,
            "tok_s": num_tokens / seconds,
            "gmacs": macs / seconds / 1e9,
            "mm_gmacs": mm_macs / statistics.median(p[1] for p in got) / 1e9,
            "share": statistics.median((macs / p[0]) / (mm_macs / p[1]) for p in got),
        })  # fmt: skip
    for row in rows:
        row["vs_first"] = row["tok_s"] / rows[0]["tok_s"]
    return rows


def print_rows(rows: list[dict[str, Any]], num_tokens: int) -> None:
    """The rows as one markdown table."""
    print(f"| mode | prefill of {num_tokens} tokens (s) | tok/s | G multiply-adds/s "
          "| torch.mm beside it | prefill / torch.mm | tok/s vs first |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| `{r['mode']}` | {r['seconds']:.3f} | {r['tok_s']:.0f} | "
            f"{r['gmacs']:.0f} | {r['mm_gmacs']:.0f} | {r['share']:.2f} | "
            f"{r['vs_first']:.2f}x |"
        )


def _parser():
    from utils.errors import CommandParser

    p = CommandParser(
        prog="prefill_rate.py",
        description="A long prompt's prefill per mode, timed beside torch.mm.",
    )
    p.add_argument("--prompt-tokens", type=int, default=512, help="prompt length")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    p.add_argument("--out-dir", default=None,
                   help="folder of the model files (default: the per-user "
                   "store; stand-ins with QWEN3_STANDIN=1)")  # fmt: skip
    return p


def _run(args) -> int:
    from utils.benchmark import DEFAULT_PROMPT, prompt_token_ids, synthetic_prompt
    from utils.download import download_qwen3_small
    from utils.errors import UsageError
    from utils.fast import get_path
    from utils.models import load_book_model_file

    if not 1 <= args.prompt_tokens <= 8192 or args.rounds < 1:
        raise UsageError("--prompt-tokens must be 1 to 8192 and --rounds at least 1")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    try:
        paths = [get_path(m) for m in modes]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for path in paths:
        if (reason := path.unavailable("cpu")) is not None:
            raise UsageError(f"{path.name} cannot run here: {reason}")
    files = download_qwen3_small("base", out_dir=args.out_dir)  # or stand-ins
    book = load_book_model_file(files.model, "cpu", torch.bfloat16)
    models = {path.name: path.build(book) for path in paths}
    text = prompt_token_ids(files.tokenizer, DEFAULT_PROMPT, torch.device("cpu"))
    ids = synthetic_prompt(text, args.prompt_tokens)
    rows = side_by_side(models, book.cfg, ids, args.rounds)
    print_rows(rows, args.prompt_tokens)
    return 0


def main(argv: list[str] | None = None) -> int:
    from utils.errors import run_command

    args = _parser().parse_args(argv)
    return run_command("prefill_rate.py", lambda: _run(args))


if __name__ == "__main__":
    raise SystemExit(main())
