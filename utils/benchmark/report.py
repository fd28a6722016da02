"""The benchmark's output: the short table a reader reads at a glance, the
wide one and the notes of `--verbose`, and the rows as JSON, CSV or a chart
(`utils.benchmark`).

The short table has six columns and fits an 80-column terminal: mode,
decode tokens/sec, time to the first token (with the prefill's tokens/sec
when the prompt is a synthetic one of `--prompt-tokens` tokens), the mode's
peak memory, the ratio to the book's KV cache, and the spread of the timed
runs (flagged "noisy" above `NOISY`). Everything else is in the wide table
(`format_details`), the notes and the rows' fields (`ROW_FIELDS`).
"""

from __future__ import annotations

import csv
import json
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from utils.benchmark.outputs import plot_format, write_output

NOISY = 0.20  # a spread (± half the range of the timed runs) above this is flagged
WIDTH = 80  # the short table and its caption fit a terminal this wide

ROW_FIELDS = (
    "mode",
    "device",
    "dtype",
    "standin",
    "prompt_tokens",
    "synthetic_prompt",
    "new_tokens",
    "tokens_per_sec",
    "tokens_per_sec_spread",
    "noisy",
    "e2e_tokens_per_sec",
    "ttft_s",
    "prefill_tokens_per_sec",
    "warmup_s",
    "warmup_cached_s",
    "to_last_token_cold_s",
    "to_last_token_cached_s",
    "weight_bytes_per_token",
    "weight_read_gbps",
    "machine_read_gbps",
    "best_read_gbps",
    "run_read_gbps",
    "bandwidth_share",
    "bandwidth_share_paired",
    "paired_read_gbps",
    "peak_mem_bytes",
    "process_peak_mem_bytes",
    "shared_weight_bytes",
    "own_tensor_bytes",
    "memory_kind",
    "ratio_vs_kv_cache",
    "compiled",
    "kernels",
    "note",
)


def describe_kernels(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """One line naming the kernels each native mode ran (None without
    native rows)."""
    ran = [f"{r['mode']}: {r['kernels']}" for r in rows if r.get("kernels")]
    if not ran:
        return None
    return "Kernels the native modes ran: " + "; ".join(ran) + "."


def describe_choice(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """One line naming the fast path to use on this machine (None without
    fast rows): the fastest per token and the soonest to the last token."""
    best = next((r for r in rows if r.get("best_bf16_fast")), None)
    soonest = next((r for r in rows if r.get("soonest_bf16_fast")), None)
    if best is None or soonest is None:
        return None
    text = (
        f"Fastest bf16 fast path here: {best['mode']} "
        f"({best['tokens_per_sec']:.1f} tok/s)"
    )
    if soonest is not best:
        text += (
            f"; soonest to the last token from a cold start: {soonest['mode']} "
            f"({soonest['to_last_token_cold_s']:.1f} s for "
            f"{soonest['new_tokens']} tokens)"
        )
    return text + "."


# ---------------------------------------------------------------------------
# The short table (stdout by default)
# ---------------------------------------------------------------------------


def num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def rate(value: float) -> str:
    """Tokens/sec: two decimals below 1, one below 100, none from there."""
    if value < 1:
        return f"{value:.2f}"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def seconds(value: float) -> str:
    """A time: milliseconds below a second, then 3 significant digits."""
    if value < 1:
        return f"{value * 1000:.1f} ms" if value < 0.01 else f"{value * 1000:.0f} ms"
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f} s"


def _per_second(value: float) -> str:
    """A prefill's tokens/sec, short: no separator, "k" from 100,000."""
    return f"{value:.0f} tok/s" if value < 1e5 else f"{value / 1000:.0f}k tok/s"


def spread_text(row: Mapping[str, Any]) -> str:
    """The spread of the timed runs of a row, "±N%" (half their range over
    their median); "1 run" where there is none to tell."""
    value = row.get("tokens_per_sec_spread")
    if value is None:
        return "-"
    if len(row.get("tokens_per_sec_runs") or ()) < 2:
        return "1 run"
    return f"±{value:.0%}"


def _ratio(row: Mapping[str, Any]) -> str:
    """The ratio to the book's KV cache, flagged "noisy" when its spread is
    over `NOISY` (the x's stay aligned)."""
    ratio = row.get("ratio_vs_kv_cache")
    text = "-" if ratio is None else f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"
    return f"{text:>6}" + (" noisy" if row.get("noisy") else "")


def _first_token(row: Mapping[str, Any]) -> str:
    text = seconds(row["ttft_s"])
    if row.get("synthetic_prompt") and row.get("prefill_tokens_per_sec"):
        text += f" ({_per_second(row['prefill_tokens_per_sec'])})"
    return text


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """(header line 1, header line 2, cells) of the short table's columns."""
    prefill = any(r.get("synthetic_prompt") for r in rows)
    head = (
        ("time to first", "token (prefill)") if prefill else ("time to", "first token")
    )
    return [
        ("", "mode", [r["mode"] for r in rows]),
        ("decode", "tok/s", [rate(r["tokens_per_sec"]) for r in rows]),
        (*head, [_first_token(r) for r in rows]),
        ("peak", "memory", [_gigabytes(r["peak_mem_bytes"]) for r in rows]),
        ("vs book's", "KV cache", [_ratio(r) for r in rows]),
        ("spread", "of runs", [spread_text(r) for r in rows]),
    ]


def _gigabytes(nbytes: int) -> str:
    value = nbytes / 1024**3
    return (
        f"{value:.2f} GB"
        if value < 10
        else f"{value:.1f} GB"
        if value < 100
        else f"{value:.0f} GB"
    )


def caption(rows: Sequence[Mapping[str, Any]]) -> str:
    """What the rows measured, in a line or two: device, dtype, prompt and
    new tokens, timed runs, and "STAND-IN weights" when they were."""
    if not rows:
        return "No mode finished."
    r = rows[0]
    runs = len(r.get("tokens_per_sec_runs") or ()) or "?"
    prompt = "synthetic " if r.get("synthetic_prompt") else ""
    text = (
        f"Qwen3 0.6B on {r['device']}, {r['dtype']}: {r['new_tokens']} new "
        f"tokens after a {prompt}prompt of {r['prompt_tokens']:,} tokens, "
        f"median of {runs} timed run{'s' if runs != 1 else ''}"
    )
    if r.get("standin"):
        text += "; STAND-IN weights (random, real shape: speed and memory are real)"
    return textwrap.fill(text + ".", WIDTH)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The short table: a caption, then six aligned columns (mode, decode
    tokens/sec, time to first token, peak memory, ratio to the book's KV
    cache, spread of the timed runs), under 80 characters a line."""
    cols = _columns(rows)
    widths = [max(len(h1), len(h2), *(len(c) for c in cells)) for h1, h2, cells in cols]
    left = {0, 2, 4, 5}  # text columns; numbers align right

    def line(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    lines = [caption(rows), ""]
    lines.append(line([h1 for h1, _, _ in cols]))
    lines.append(line([h2 for _, h2, _ in cols]))
    lines += [line([cells[i] for _, _, cells in cols]) for i in range(len(rows))]
    return "\n".join(lines)


def describe_noise(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """One line under the table when a row is noisy (None otherwise)."""
    noisy = [r["mode"] for r in rows if r.get("noisy")]
    if not noisy:
        return None
    return textwrap.fill(
        f"noisy: the mode's timed runs differ by more than ±{NOISY:.0%} of "
        f"their median (here: {', '.join(noisy)}), so its ratio is rough; a "
        "busy machine does this: rerun with more --repeats when it is quieter.",
        WIDTH,
    )


# ---------------------------------------------------------------------------
# Progress lines (stderr)
# ---------------------------------------------------------------------------


def finished_line(row: Mapping[str, Any]) -> str:
    """The progress line for a mode that finished: its speed and spread,
    first token, weights' read speed and warm-up."""
    return (
        f"{row['mode']}: {row['tokens_per_sec']:.2f} tok/s ({spread_text(row)}), "
        f"first token after {row['ttft_s']:.2f} s, weights read at "
        f"{row['weight_read_gbps']:.1f} GB/s (memory read speed around it "
        f"{row['machine_read_gbps']:.1f} GB/s), warm-up {row['warmup_s']:.1f} s"
    )


# ---------------------------------------------------------------------------
# The wide table and notes (--verbose)
# ---------------------------------------------------------------------------


def _warmup(row: Mapping[str, Any]) -> str:
    cold = f"{row['warmup_s']:.1f}"
    if not row.get("compiled"):
        return f"{cold} (nothing to compile)"
    return f"{cold} / {num(row.get('warmup_cached_s'), '.1f')}"


def _to_last(row: Mapping[str, Any]) -> str:
    cold = num(row.get("to_last_token_cold_s"), ".1f")
    if not row.get("compiled"):
        return cold
    return f"{cold} / {num(row.get('to_last_token_cached_s'), '.1f')}"


def format_details(rows: Sequence[Mapping[str, Any]]) -> str:
    """The wide markdown table of `--verbose`: end-to-end tokens/sec, warm-up
    cold and from the compile cache, time to the last token, the weights'
    read speed and its share of `torch.sum`'s speed (at the same moment, and
    of the run's best probe)."""
    n = rows[0]["new_tokens"] if rows else "N"
    lines = [
        "| Mode | Tokens/sec end to end (prompt included) "
        "| Warm-up (s): cold / from the compile cache "
        f"| To token {n} (s, warm-up included): cold / cached "
        "| Weights read (GB/s) | Share of torch.sum's read speed, same moment "
        "| Share of the run's best read speed |",
        "|" + "---|" * 7,
    ]
    for r in rows:
        share = r.get("bandwidth_share")
        lines.append(
            f"| {r['mode']} | {rate(r['e2e_tokens_per_sec'])} | {_warmup(r)} "
            f"| {_to_last(r)} | {num(r.get('weight_read_gbps'), '.1f')} "
            f"| {num(r.get('bandwidth_share_paired'), '.0%')} "
            f"| {num(share, '.0%')} |"
        )
    return "\n".join(lines)


def describe_bandwidth(rows: Sequence[Mapping[str, Any]]) -> str:
    """The measured read speed, and per mode the bytes it reads per token,
    the speed they allow, and how its step compared with `torch.sum` over
    the same bytes at the same moment."""
    if not rows or rows[0].get("machine_read_gbps") is None:
        return ""
    speeds = [r["machine_read_gbps"] for r in rows]
    low, high = min(speeds), max(speeds)
    span = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"
    lines = [f"Memory read speed measured around each mode: {span} GB/s."]
    for r in rows:
        if not r.get("weight_bytes_per_token"):
            continue
        per_token = r["weight_bytes_per_token"] / 1e9
        gbps = r["machine_read_gbps"]
        text = (
            f"{r['mode']} reads {per_token:.2f} GB per token: at most "
            f"{gbps / per_token:.0f} tok/s at the {gbps:.1f} GB/s measured "
            "around it"
        )
        paired, moment = r.get("bandwidth_share_paired"), r.get("paired_read_gbps")
        if paired is not None and moment is not None:
            text += (
                f"; its steps ran at {paired:.0%} of the speed of a torch.sum "
                f"over the same bytes timed right after each (which read at "
                f"{moment:.1f} GB/s)"
            )
        lines.append(textwrap.fill(text + ".", WIDTH, subsequent_indent="  "))
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Files: JSON, CSV, chart
# ---------------------------------------------------------------------------


def write_json(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Write the rows as a JSON list (a regular file atomically, a device or
    FIFO such as /dev/stdout through; `utils.benchmark.outputs.write_output`)."""
    text = json.dumps(list(rows), indent=2) + "\n"
    return write_output(path, text.encode("utf-8"), "--json")


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Write the rows as CSV with a header line (as `write_json` does)."""
    import io

    fields = list(ROW_FIELDS) + sorted({k for r in rows for k in r} - set(ROW_FIELDS))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return write_output(path, buf.getvalue().encode("utf-8"), "--csv")


def plot_results(
    rows: Sequence[Mapping[str, Any]], path: str | os.PathLike | None = None
):
    """Bar chart of decode tokens/sec per mode; saved to `path` if given, in
    the format its suffix names (as `write_json` writes). Returns the
    matplotlib Figure."""
    import matplotlib

    if path is not None and "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [r["mode"] for r in rows]
    speeds = [r["tokens_per_sec"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows)), 3.5))
    bars = ax.bar(modes, speeds, color="#4c72b0")
    ax.bar_label(bars, fmt="%.1f")
    ax.set_ylabel("decode tokens/sec")
    if rows:
        ax.set_title(f"Qwen3 0.6B, {rows[0]['device']}, {rows[0]['dtype']}")
    ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    if path is not None:
        import io

        image = io.BytesIO()
        fig.savefig(image, format=plot_format(path), dpi=120)
        write_output(path, image.getvalue(), "--plot")
    return fig
