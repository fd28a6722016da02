"""The benchmark's output: the table (Table 2.1 with more columns), the
notes under it, and the rows as JSON, CSV or a chart (`utils.benchmark`).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from utils.outputs import plot_format, write_output

ROW_FIELDS = (
    "mode",
    "device",
    "dtype",
    "prompt_tokens",
    "new_tokens",
    "tokens_per_sec",
    "tokens_per_sec_spread",
    "e2e_tokens_per_sec",
    "ttft_s",
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
# Output: table, JSON, CSV, chart
# ---------------------------------------------------------------------------


def num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _spread(row: Mapping[str, Any]) -> str:
    """ " ±N%" over the timed runs; " ±–" with only one (no spread to tell)."""
    value = row.get("tokens_per_sec_spread")
    if value is None:
        return ""
    if len(row.get("tokens_per_sec_runs") or ()) < 2:
        return " ±–"
    return f" ±{value:.0%}"


def _share(row: Mapping[str, Any]) -> str:
    paired, best = row.get("bandwidth_share_paired"), row.get("bandwidth_share")
    if best is None:
        return "-"
    return f"{num(paired, '.0%')} ({best:.0%})"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of the rows: speed (± half the range over the timed
    runs), time to first token, warm-up cold and cached, time to the last
    token, weight-read GB/s and its share of `torch.sum`'s speed at the same
    moment (in brackets: of the run's best probe), peak memory, ratio to the
    book's KV-cache mode."""
    n = rows[0]["new_tokens"] if rows else "N"
    header = (
        "| Mode | Tokens/sec (decode, ± spread) | Tokens/sec (end to end) | TTFT (s) "
        "| Warm-up cold / cached (s) "
        f"| To token {n} cold / cached (s) "
        "| Weights read (GB/s) | Share of read speed: same moment (best probe) "
        "| Peak memory (GB) | vs kv_cache |"
    )
    lines = [header, "|" + "---|" * 10]
    for r in rows:
        ratio = r.get("ratio_vs_kv_cache")
        lines.append(
            f"| {r['mode']} | {r['tokens_per_sec']:.2f}{_spread(r)} "
            f"| {r['e2e_tokens_per_sec']:.2f} | {r['ttft_s']:.3f} "
            f"| {r['warmup_s']:.1f} / {num(r.get('warmup_cached_s'), '.1f')} "
            f"| {num(r.get('to_last_token_cold_s'), '.1f')} / "
            f"{num(r.get('to_last_token_cached_s'), '.1f')} "
            f"| {num(r.get('weight_read_gbps'), '.1f')} "
            f"| {_share(r)} "
            f"| {r['peak_mem_bytes'] / 1024**3:.2f} "
            f"| {num(ratio, '.2f')}{'' if ratio is None else 'x'} |"
        )
    return "\n".join(lines)


def describe_bandwidth(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line: the measured read speed and what it allows per token."""
    if not rows or rows[0].get("machine_read_gbps") is None:
        return ""
    speeds = [r["machine_read_gbps"] for r in rows]
    low, high = min(speeds), max(speeds)
    span = (
        f"{low:.1f} GB/s"
        if f"{low:.1f}" == f"{high:.1f}"
        else (f"{low:.1f}-{high:.1f} GB/s")
    )
    parts = [f"Memory read speed measured around each mode: {span}"]
    for r in rows:
        if r.get("weight_bytes_per_token"):
            per_token = r["weight_bytes_per_token"] / 1e9
            gbps = r["machine_read_gbps"]
            paired = r.get("paired_read_gbps")
            moment = (
                ""
                if paired is None
                else f"; its same-moment share with torch.sum at {paired:.1f} GB/s"
            )
            parts.append(
                f"{r['mode']} reads {per_token:.2f} GB/token "
                f"(limit {gbps / per_token:.0f} tok/s at {gbps:.1f} GB/s{moment})"
            )
    return "; ".join(parts[:1]) + ".\n" + "\n".join(parts[1:])


def write_json(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Write the rows as a JSON list (a regular file atomically, a device or
    FIFO such as /dev/stdout through; `utils.outputs.write_output`)."""
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
