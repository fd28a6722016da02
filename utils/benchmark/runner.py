"""Table 2.1 in one call: tokens/sec of every generation mode, side by side.

Run `uv run python -m utils.benchmark --help`, or from a notebook:

    rows = run_benchmark(modes=["kv_cache", "fast_compiled"], max_new_tokens=50)
    print(format_table(rows))

The modes (all greedy, same prompt, same number of new tokens, EOS ignored)
are `all_modes()`: the one registry's ways to generate (`generation_paths` in
`utils.streaming`: the book's four, `regular`, `regular_compiled`, `kv_cache`,
`kv_cache_compiled`, compiled through `utils.compile.book_compile`, and the
fast paths of `utils.fast`), the book package's `qwen3_optimized` and Hugging
Face `transformers` with a static cache. On a CPU the uncached book
modes (minutes at 100 tokens) and the compiled ones (minutes of compiling
each) run only when named: the default set then takes a few minutes.

Each mode runs once as warm-up (compiled modes into an empty compile cache,
then once more from that cache), then `repeats` timed runs whose medians are
reported. Decode speed counts the tokens after the first over the time after
the first, so the prompt is not mixed in (that is the time to first token;
`prompt_tokens=N` makes a synthetic prompt of N tokens, and the prefill's
tokens/sec is N over that time).
Next to each mode the machine's memory read speed is probed (`torch.sum` over
~1 GiB, just before and after), so the GB/s a mode's weight reads reach can be
compared with what the memory gives. Two shares: against the best probe of the
run (strict, comparable across rows), and against `torch.sum` over the same
bytes timed right after each token of one more generation (the same moment:
a shared machine's memory can change speed within a second, so a median over
seconds is not comparable with a probe's best 30 ms). The row fields are
listed in `utils.benchmark.report.ROW_FIELDS`; the README explains them.

Progress goes to stderr (`utils.benchmark.progress`): before the first mode
an estimate of the whole run from a quick probe of this machine, "mode 3 of
6" with the time left, and a line at least every 30 s. Ctrl-C ends the run
with `BenchmarkInterrupted`, which carries the rows of the modes that
finished (the command prints and saves them, exit 130).
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from utils.benchmark import PROG
from utils.benchmark.batches import (
    BATCH_MODES,
    batch_modes,
    batch_rows,
    format_batch_table,
    parse_sizes,
)
from utils.benchmark.modes import (
    PREPARE,
    Mode,
    ModeSkipped,
    PeakMemory,
    Prepared,
    all_modes,
    default_modes,
    forget_compiled_code,
    fresh_compile_cache,
    get_mode,
    make_resident,
    mode_names,
    no_cuda_probe_line,
    own_tensor_bytes,
    shared_weight_bytes,
    time_stream,
)
from utils.benchmark.outputs import check_output_path, plot_format
from utils.benchmark.progress import (
    LOG_NAME,
    Ticker,
    estimate_line,
    estimate_run_s,
    probe,
    progress_line,
)
from utils.benchmark.report import (
    NOISY,
    describe_bandwidth,
    describe_choice,
    describe_kernels,
    describe_noise,
    finished_line,
    format_details,
    format_table,
    plot_results,
    write_csv,
    write_json,
)
from utils.errors import (
    CommandParser,
    UsageError,
    require_streams,
    run_command,
    utf8_text,
)
from utils.log import get_logger
from utils.stdio import utf8_streams

BASELINE_MODE = "kv_cache"
DEFAULT_PROMPT = "Explain large language models in a single sentence."
DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


class BenchmarkInterrupted(KeyboardInterrupt):
    """Ctrl-C during a benchmark run: `rows` holds the modes that finished
    (with their ratios), `total` the number of modes asked for."""

    def __init__(self, rows: list[dict[str, Any]], total: int) -> None:
        super().__init__(f"interrupted after {len(rows)} of {total} modes")
        self.rows, self.total = rows, total


# ---------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------


def _weights(
    model_path: str | os.PathLike | None,
    out_dir: str | os.PathLike | None,
    tokenizer_path: str | os.PathLike | None = None,
) -> tuple[Mapping[str, torch.Tensor], Path | None, bool]:
    """(state dict, tokenizer path or None, stand-in?) from `model_path` or
    the download (stand-ins offline; `out_dir` None: the model store's own
    files); `tokenizer_path`, else the book's tokenizer beside `model_path`.
    Raises ValueError with one line for a missing or unusable file."""
    from utils.download import download_qwen3_small, local_files
    from utils.models import CheckpointError, read_checkpoint

    with contextlib.redirect_stdout(sys.stderr):  # banners are not results
        if model_path is None:
            files = download_qwen3_small("base", out_dir=out_dir)
            model_path, tokenizer, standin = files.model, files.tokenizer, files.standin
            tokenizer = Path(tokenizer_path) if tokenizer_path else tokenizer
        else:
            guess = Path(model_path).with_name("tokenizer-base.json")
            tok = tokenizer_path or (guess if guess.is_file() else None)
            try:
                model_path, tokenizer, standin = local_files(model_path, tok)
            except FileNotFoundError as exc:
                raise ValueError(
                    f"{exc}; pass the book's qwen3-0.6B-*.pth file (--model-path) "
                    "and tokenizer-*.json (--tokenizer-path), or leave them out "
                    "to download them."
                ) from None
    try:
        return read_checkpoint(model_path), tokenizer, standin
    except CheckpointError as exc:
        raise ValueError(f"cannot use --model-path: {exc}") from None


def prompt_token_ids(
    tokenizer_path: Path | None, prompt: str, device: torch.device
) -> torch.Tensor:
    """Encode `prompt` with the book's tokenizer: shape (1, num_tokens)."""
    from reasoning_from_scratch.qwen3 import Qwen3Tokenizer

    if tokenizer_path is None:
        raise ValueError(
            "No tokenizer file next to the weights; pass token_ids= or put "
            "tokenizer-base.json beside the .pth file."
        )
    tok = Qwen3Tokenizer(tokenizer_path)
    return torch.tensor(tok.encode(prompt), device=device).unsqueeze(0)


def _check_modes(modes: Sequence[str]) -> list[str]:
    names = mode_names()
    modes = list(names) if list(modes) == ["all"] else list(modes)
    bad = [m for m in modes if m not in names]
    if bad or not modes:
        raise ValueError(
            f"unknown mode(s) {', '.join(bad) or '(none given)'}; "
            f"choose from {', '.join(names)} (or all)"
        )
    return list(dict.fromkeys(modes))


def _check_arguments(dtype, max_new_tokens, repeats, prompt_tokens) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        dtype = DTYPES[dtype]
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValueError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if max_new_tokens < 2:
        raise ValueError("max_new_tokens must be >= 2 to measure a decode rate")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if prompt_tokens is not None and (
        isinstance(prompt_tokens, bool)
        or not isinstance(prompt_tokens, int)
        or prompt_tokens < 1
    ):
        raise ValueError(
            f"prompt_tokens must be a positive integer, got {prompt_tokens!r}"
        )
    return dtype


def run_benchmark(
    modes: Sequence[str] | None = None,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "bfloat16",
    max_new_tokens: int = 100,
    repeats: int = 3,
    model_path: str | os.PathLike | None = None,
    prompt: str = DEFAULT_PROMPT,
    out_dir: str | os.PathLike = "qwen3",
    *,
    prompt_tokens: int | None = None,
    cfg: Mapping[str, Any] | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    token_ids: torch.Tensor | None = None,
    cold_compile: bool = True,
    quiet: bool = False,
    bandwidth_bytes: int = 1 << 30,
    tokenizer_path: str | os.PathLike | None = None,
    batch_sizes: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Time each mode on one model (same weights, prompt and token count) and
    return one dict per mode (fields: benchmark_report.ROW_FIELDS); with
    `batch_sizes`, the decode of batches instead (`batches.batch_rows`).
    Weights come from `download_qwen3_small` (stand-ins offline), `model_path`,
    or `cfg` + `state_dict` (tests); the tokenizer from `tokenizer_path`, else
    beside `model_path`, else the download; `token_ids` overrides the prompt,
    and `prompt_tokens=N` repeats the prompt's tokens to a synthetic prompt of
    N (for the prefill's speed at that length). `cold_compile=False` keeps
    your usual compile cache (warm-ups may be shorter); `bandwidth_bytes` is
    the buffer size for the read-speed probe. Progress goes to stderr
    (nothing with `quiet`). Ctrl-C raises `BenchmarkInterrupted` with the
    rows of the modes that finished."""
    from utils.device import resolve_device
    from utils.models import load_book_model

    dev = resolve_device(device) if isinstance(device, str) else torch.device(device)
    dtype = _check_arguments(dtype, max_new_tokens, repeats, prompt_tokens)
    modes = _modes_for(dev, modes, quiet, bool(batch_sizes))
    standin = False  # unless the files say so
    if state_dict is None:
        state_dict, tokenizer_path, standin = _weights(model_path, out_dir,
                                                       tokenizer_path)  # fmt: skip
    book = load_book_model(state_dict, dev, dtype, cfg)
    if prompt_tokens is not None:
        check_context(book.cfg["context_length"], prompt_tokens, max_new_tokens)
    make_resident(book)
    if token_ids is None:
        token_ids = prompt_token_ids(tokenizer_path or _tokenizer_file(out_dir),
                                     prompt, dev)  # fmt: skip
    token_ids = _checked_prompt(book, token_ids, prompt_tokens, max_new_tokens)
    if batch_sizes:
        say = None if quiet else get_logger(LOG_NAME).info
        return batch_rows(book, modes, batch_sizes, token_ids.to(dev), max_new_tokens,
                          say, standin)  # fmt: skip
    _check_memory(book.cfg, token_ids.shape[1], max_new_tokens, modes, dev)
    labels = {"standin": standin, "dtype": str(dtype).removeprefix("torch."),
              "synthetic_prompt": prompt_tokens is not None}  # fmt: skip
    run = _Run(book, token_ids.to(dev), max_new_tokens, repeats, dev, quiet, labels)
    with run.ticker, no_cuda_probe_line():
        return run.all(modes, cold_compile, bandwidth_bytes)


def synthetic_prompt(token_ids: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """A prompt of exactly `num_tokens` tokens, (1, num_tokens): the ids of
    `token_ids` (a tokenized text) repeated and cut. The same every run, made
    of the tokenizer's ids; what it says does not change a forward's speed."""
    if token_ids.shape[1] == 0:
        raise ValueError("the prompt has no tokens to repeat; pass a --prompt")
    times = -(-num_tokens // token_ids.shape[1])
    return token_ids.repeat(1, times)[:, :num_tokens]


def check_context(context_length: int, prompt_tokens: int, new_tokens: int) -> None:
    """ValueError in one line when the prompt and the new tokens do not fit
    the model's context length."""
    if prompt_tokens + new_tokens > context_length:
        raise ValueError(
            f"a prompt of {prompt_tokens:,} tokens and {new_tokens:,} new "
            f"tokens do not fit the model's context length of "
            f"{context_length:,} tokens; use at most "
            f"{max(context_length - new_tokens, 0):,} prompt tokens"
        )


def _check_memory(cfg, prompt_len: int, n: int, modes: list[str], dev) -> None:
    """Refuse, before any mode runs, a prompt whose attention would not fit
    (the uncached modes run prompt + n tokens at once in their last step)."""
    from utils.models import check_prefill_fits

    uncached = any(not get_mode(m).cache for m in modes)
    check_prefill_fits(cfg, prompt_len + (n if uncached else 0), dev)


def _modes_for(dev: torch.device, modes: Sequence[str] | None, quiet: bool,
               batches: bool = False):  # fmt: skip
    if batches:  # --batch-size's modes
        return batch_modes(modes, dev)
    if modes is not None:
        return _check_modes(modes)
    chosen = default_modes(dev)
    left_out = [m.name for m in all_modes() if m.by_default and m.name not in chosen]
    if dev.type == "cpu" and left_out and not quiet:
        get_logger(LOG_NAME).info(
            f"on a CPU, {', '.join(left_out)} run only when named (minutes "
            "each, compiling or without a cache): e.g. --modes "
            "kv_cache,kv_cache_compiled, or --modes all"
        )
    return _check_modes(chosen)


def _tokenizer_file(out_dir: str | os.PathLike) -> Path:
    """The base tokenizer (or its stand-in): small, fetched if missing."""
    from utils.download import download_qwen3_small

    with contextlib.redirect_stdout(sys.stderr):
        return download_qwen3_small(
            "base", tokenizer_only=True, out_dir=out_dir
        ).tokenizer


@dataclass
class _Run:
    """One benchmark run: the loaded model, the prompt and the settings
    every mode shares; `all` times the modes one after another. `labels`
    go into every row (dtype, stand-in or not, synthetic prompt or not)."""

    book: torch.nn.Module
    token_ids: torch.Tensor
    n: int
    repeats: int
    dev: torch.device
    quiet: bool
    labels: dict[str, Any]
    ticker: Ticker = field(init=False)  # every line of the run goes through it

    def __post_init__(self) -> None:
        self.ticker = Ticker(self.quiet)

    def all(
        self, modes: list[str], cold_compile: bool, probe_bytes: int
    ) -> list[dict[str, Any]]:
        """The rows of `modes`, with their shares and ratios; Ctrl-C raises
        `BenchmarkInterrupted` with the rows of the modes that finished."""
        from utils.benchmark.bandwidth import measure_read_bandwidth

        start = time.perf_counter()
        self.ticker.phase("measuring the memory read speed")
        first = before = measure_read_bandwidth(self.dev, probe_bytes)
        self.log(
            f"memory read speed ({self.dev.type}, torch.sum over "
            f"{probe_bytes / 1024**3:.2f} GiB): {first / 1e9:.1f} GB/s"
        )
        rows: list[dict[str, Any]] = []
        try:
            self.estimate(modes)
            for i, name in enumerate(modes):
                self.log(
                    progress_line(i, len(modes), name, time.perf_counter() - start)
                )
                # each mode compiles into its own empty cache folder (cold_compile)
                with fresh_compile_cache(cold_compile):
                    row = self.mode(get_mode(name))
                if row is None:
                    continue
                self.ticker.phase(f"{name}: measuring the memory read speed")
                after = measure_read_bandwidth(self.dev, probe_bytes)
                row.update(self.labels, run_read_gbps=first / 1e9)
                row["machine_read_gbps"] = max(before, after) / 1e9
                before = after
                rows.append(row)
                self.log(finished_line(row))
        except KeyboardInterrupt:
            _add_shares(rows)
            _add_ratios(rows)
            raise BenchmarkInterrupted(rows, len(modes)) from None
        _add_shares(rows)
        _add_ratios(rows)
        return rows

    def log(self, text: str) -> None:
        self.ticker.say(text)

    def estimate(self, modes: list[str]) -> None:
        """Before the first mode: the whole run's time on this machine now,
        from the book's KV cache making 5 tokens (and, where an uncached mode
        runs, one forward over the longest sequence it meets)."""
        if self.quiet:
            return
        self.ticker.phase("a quick probe of this machine")
        kv, ids = get_mode(BASELINE_MODE), self.token_ids
        chosen = [get_mode(m) for m in modes]
        rows = ids.shape[1] + self.n
        longest = synthetic_prompt(ids, rows)

        def forward() -> None:
            with torch.inference_mode():
                self.book(longest).cpu()  # .cpu(): the work is done

        def kv_stream(k: int):
            return (t.cpu() for t in PREPARE[kv.family](kv, self.book, ids, k).stream())

        uncached = not all(m.cache for m in chosen)
        try:
            p = probe(kv_stream, ids.shape[1], forward if uncached else None, rows)
        except ModeSkipped as exc:  # no estimate, the run goes on
            self.log(f"no estimate of the run's time: {exc}")
            return
        seconds = estimate_run_s(p, chosen, self.n, self.repeats)
        self.log(estimate_line(p, seconds, len(chosen)))

    def mode(self, mode: Mode) -> dict[str, Any] | None:
        """One row for `mode`, or None (after one line) if it is skipped."""
        from utils.benchmark.bandwidth import paired_share
        from utils.fast import describe_step

        if mode.compiled:
            forget_compiled_code()  # every compiled mode starts from scratch
        with PeakMemory(self.dev) as mem:
            t0 = time.perf_counter()
            self.ticker.phase(f"{mode.name}: preparing")
            try:
                prep = PREPARE[mode.family](mode, self.book, self.token_ids, self.n)
            except ModeSkipped as exc:
                get_logger(LOG_NAME).info(f"{mode.name}: skipped, {exc}")
                return None
            prepare_s = time.perf_counter() - t0
            warm, cached, runs = self.timed(mode, prep)
        row = _summarise(
            mode.name, runs, warm["total_s"], mem, self.dev, self.token_ids
        )
        row["compiled"] = mode.compiled
        row["warmup_cached_s"] = None if cached is None else cached["total_s"]
        row["to_last_token_cold_s"] = prepare_s + warm["total_s"]
        row["to_last_token_cached_s"] = (
            None if cached is None else prepare_s + cached["total_s"]
        )
        _add_memory(row, prep.model, self.book, mem)
        row["kernels"] = describe_step(prep.model)
        paired = None
        if prep.timer is time_stream:  # tokens come one by one
            self.ticker.phase(f"{mode.name}: one more run, each token beside torch.sum")
            stream = self.ticker.counted(prep.stream)
            paired = paired_share(stream, row["weight_bytes_per_token"], self.dev)
        row["bandwidth_share_paired"], row["paired_read_gbps"] = paired or (None, None)
        if warm["tokens"] != self.n:
            row["note"] += f"; produced {warm['tokens']} tokens"
        # Free this mode's copies (compiled graphs, int8 weights) so the
        # next mode's memory figure is its own
        del prep
        if mode.compiled:
            forget_compiled_code()
        gc.collect()
        return row

    def timed(self, mode: Mode, prep: Prepared):
        """(warm-up, warm-up from the compile cache or None, timed runs)."""
        compiling = "warm-up, compiling (minutes on a CPU)"
        warm = self.once(mode, prep, compiling if mode.compiled else "warm-up")
        cached = None
        if mode.compiled:
            forget_compiled_code()
            cached = self.once(mode, prep, "warm-up again, from the compile cache")
        runs = [
            self.once(mode, prep, f"timed run {k} of {self.repeats}")
            for k in range(1, self.repeats + 1)
        ]
        return warm, cached, runs

    def once(self, mode: Mode, prep: Prepared, what: str) -> dict[str, float]:
        """One generation of `mode`, its tokens counted under `what`; a
        warm-up says when it starts and how it ended ("done" or "stopped")."""
        self.ticker.phase(f"{mode.name}: {what}")
        warm_up = what.startswith("warm-up")
        if warm_up:
            self.log(f"{mode.name}: {what} ...")
        finished = False
        try:
            got = prep.timer(prep.stream, self.dev, tick=self.ticker.token)
            finished = True
        finally:
            if warm_up or not finished:
                self.ticker.end(finished)
        return got


def _add_memory(row: dict[str, Any], model, book, mem: PeakMemory) -> None:
    """The mode's own memory: the loaded weights it reads in place, plus
    what the process grew by while it ran (its copies, caches, compiling);
    the loaded model is shared by every mode, so it is not counted for
    modes that do not use it (fast_int8 reads only its int8 copy). At least
    its own tensors: RSS need not grow when the allocator hands out memory
    an earlier mode freed."""
    row["shared_weight_bytes"] = shared_weight_bytes(model, book)
    row["own_tensor_bytes"] = own_tensor_bytes(model, book)
    row["peak_mem_bytes"] = row["shared_weight_bytes"] + max(
        mem.growth, row["own_tensor_bytes"]
    )
    row["memory_kind"] = (
        "Memory the mode uses: loaded weights it reads in place + peak "
        f"growth ({mem.kind}), at least its own tensors"
    )
    from utils.benchmark.bandwidth import weight_bytes_per_token

    row["weight_bytes_per_token"] = weight_bytes_per_token(model)
    row["weight_read_gbps"] = (
        row["weight_bytes_per_token"] * row["tokens_per_sec"] / 1e9
    )


def _add_shares(rows: list[dict[str, Any]]) -> None:
    """Each mode's weight-read speed as a share of the best read speed of
    the run (strict; comparable across rows)."""
    best = max((r["machine_read_gbps"] for r in rows), default=0.0)
    best = max(best, max((r["run_read_gbps"] for r in rows), default=0.0))
    for row in rows:
        row["best_read_gbps"] = best
        row["bandwidth_share"] = row["weight_read_gbps"] / best


def _summarise(mode, runs, warmup_s, mem, dev, token_ids) -> dict[str, Any]:
    decode_rates = [
        (r["tokens"] - 1) / max(r["total_s"] - r["ttft_s"], 1e-9) for r in runs
    ]
    rate = statistics.median(decode_rates)
    # half the range of the timed runs, relative to their median (±)
    spread = (max(decode_rates) - min(decode_rates)) / 2 / max(rate, 1e-9)
    ttft = statistics.median(r["ttft_s"] for r in runs)
    prompt_tokens = int(token_ids.shape[1])
    return {
        "mode": mode,
        "device": str(dev),
        "tokens_per_sec_runs": decode_rates,
        "tokens_per_sec_spread": spread,
        "noisy": spread > NOISY,
        "dtype": None,
        "standin": False,
        "prompt_tokens": prompt_tokens,
        "synthetic_prompt": False,
        "new_tokens": int(runs[0]["tokens"]),
        "tokens_per_sec": rate,
        "e2e_tokens_per_sec": statistics.median(
            r["tokens"] / r["total_s"] for r in runs
        ),
        "ttft_s": ttft,
        # the prompt's tokens over the time to the first token (its prefill)
        "prefill_tokens_per_sec": prompt_tokens / max(ttft, 1e-9),
        "warmup_s": warmup_s,
        "peak_mem_bytes": int(mem.peak),
        "process_peak_mem_bytes": int(mem.peak),
        "memory_kind": mem.kind,
        "ratio_vs_kv_cache": None,
        "compiled": False,
        "note": get_mode(mode).note,
    }


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    base = next((r for r in rows if r["mode"] == BASELINE_MODE), None)
    for row in rows:
        if base is not None and base["tokens_per_sec"] > 0:
            row["ratio_vs_kv_cache"] = row["tokens_per_sec"] / base["tokens_per_sec"]
    # Which fast path this machine should use: the fastest per token, and
    # the soonest to a whole answer
    modes = all_modes()
    int8 = {m.name for m in modes if m.int8}
    bf16_fast = {m.name for m in modes if m.family == "fast" and not m.int8}
    fast = [r for r in rows if r["mode"] in bf16_fast]
    if not fast:
        return
    best = max(fast, key=lambda r: r["tokens_per_sec"])
    soonest = min(fast, key=lambda r: r["to_last_token_cold_s"])
    for row in rows:
        row["best_bf16_fast"] = row is best
        row["soonest_bf16_fast"] = row is soonest
        if row["mode"] in int8:
            row["speed_vs_best_bf16_fast"] = (
                row["tokens_per_sec"] / best["tokens_per_sec"]
            )
            compiled = next((r for r in rows if r["mode"] == "fast_compiled"), None)
            if compiled is not None and compiled["peak_mem_bytes"] > 0:
                row["memory_vs_fast_compiled"] = (
                    row["peak_mem_bytes"] / compiled["peak_mem_bytes"]
                )


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _checked_prompt(book, token_ids, prompt_tokens, max_new_tokens) -> torch.Tensor:
    """The prompt (made `prompt_tokens` long if asked), checked to fit."""
    if prompt_tokens is not None:
        token_ids = synthetic_prompt(token_ids, prompt_tokens)
    check_context(book.cfg["context_length"], token_ids.shape[1], max_new_tokens)
    return token_ids


def build_parser() -> CommandParser:
    p = CommandParser(
        prog=PROG,
        description="Compare Qwen3 0.6B generation modes (the book's Table 2.1, "
        "plus a static-cache fast path and Hugging Face) in one run. The table "
        "goes to stdout, progress to stderr.",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps, xpu or auto")
    p.add_argument(
        "--dtype", default="bfloat16", choices=list(DTYPES), help="weights and "
        "activations (the book's model is bfloat16)"
    )  # fmt: skip
    p.add_argument(
        "--max-new-tokens", type=int, default=100, help="tokens each run makes"
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs per mode")
    p.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated subset of: {', '.join(mode_names())}; or all "
        "(default on a CPU: the modes without torch.compile, minus regular; "
        "elsewhere: all but the CPU-only ones)",
    )
    p.add_argument(
        "--prompt", default=DEFAULT_PROMPT, type=utf8_text, help="the text to continue"
    )
    p.add_argument(
        "--prompt-tokens", type=int, default=None, metavar="N",
        help="a synthetic prompt of exactly N tokens (the --prompt's tokens "
        "repeated): the table then shows the prefill's tokens/sec",
    )  # fmt: skip
    p.add_argument(
        "--batch-size", default=None, metavar="SIZES", help="e.g. 1,4,8,16: decode "
        "speed and memory per mode and batch size instead (modes: "
        f"{', '.join(BATCH_MODES)})",
    )  # fmt: skip
    p.add_argument(
        "--verbose", action="store_true", help="also print the wide table (warm-up "
        "cold and cached, read speed and its shares) and the notes",
    )  # fmt: skip
    _add_file_arguments(p)
    return p


def _add_file_arguments(p: CommandParser) -> None:
    """The files read and written, and the machine's settings."""
    p.add_argument("--model-path", default=None, help="a book .pth file")
    p.add_argument(
        "--tokenizer-path", default=None, help="a book tokenizer .json file "
        "(default: tokenizer-base.json beside --model-path, else downloaded)",
    )  # fmt: skip
    p.add_argument(
        "--out-dir", default=None, help="folder to put the model files in (hard "
        "links to the per-user model store); default: the store itself",
    )  # fmt: skip
    p.add_argument(
        "--json", metavar="PATH", help="write the rows (a file, or /dev/stdout)"
    )
    p.add_argument("--csv", metavar="PATH", help="write the rows as CSV")
    p.add_argument(
        "--plot", metavar="PATH", help="bar chart, in the format the name ends "
        "in (.png, .svg, .pdf, ...; PNG without one)"
    )  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=None, help="CPU threads for torch (default: "
        "torch's choice); 1 avoids thread thrashing on a machine busy with other work",
    )  # fmt: skip
    p.add_argument(
        "--warm-cache", action="store_true", help="use torch.compile's usual "
        "on-disk cache instead of a fresh one (the cold warm-up may then be shorter)",
    )  # fmt: skip


def _check_cli(args) -> list[str] | None:
    """The modes asked for; every argument checked before any work."""
    modes = None
    if args.batch_size is not None:
        args.batch_size = parse_sizes(args.batch_size)
        if args.plot or args.verbose:
            raise ValueError("--plot and --verbose are Table 2.1's; drop them")
    if args.modes is not None:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        modes = modes if args.batch_size else _check_modes(modes)
    if args.max_new_tokens < 2:
        raise ValueError("--max-new-tokens must be at least 2")
    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be at least 1")
    if args.prompt_tokens is not None:
        if args.prompt_tokens < 1:
            raise ValueError("--prompt-tokens must be at least 1")
        from utils.models import book_config

        limit = book_config()["context_length"]
        check_context(limit, args.prompt_tokens, args.max_new_tokens)
    if args.plot:
        plot_format(args.plot)
    for flag in ("json", "csv", "plot"):
        if getattr(args, flag):
            check_output_path(getattr(args, flag), f"--{flag}")
    return modes


def _main(argv: Sequence[str] | None) -> int:
    from utils.download import DownloadError

    require_streams("stdout")
    args = build_parser().parse_args(argv)
    interrupted = None
    try:
        modes = _check_cli(args)
        if args.threads is not None:  # torch's and the native step's
            from utils.fast import pin_step_threads

            pin_step_threads(args.threads)
        rows = run_benchmark(
            modes=modes,
            device=args.device,
            dtype=args.dtype,
            max_new_tokens=args.max_new_tokens,
            repeats=args.repeats,
            model_path=args.model_path,
            tokenizer_path=args.tokenizer_path,
            prompt=args.prompt,
            out_dir=args.out_dir,
            prompt_tokens=args.prompt_tokens,
            cold_compile=not args.warm_cache,
            batch_sizes=args.batch_size,
        )
    except (ValueError, FileNotFoundError, DownloadError) as exc:
        raise UsageError(str(exc)) from None
    except BenchmarkInterrupted as exc:
        rows, interrupted = exc.rows, exc
    if rows:
        _report(rows, args)
    if interrupted is None:
        return 0
    print(
        f"\n{PROG}: interrupted after {len(rows)} of {interrupted.total} modes"
        + ("; the table above has the ones that finished" if rows else ""),
        file=sys.stderr,
    )
    return 130


def _report(rows: list[dict[str, Any]], args) -> None:
    """The table and its notes on stdout (the wide table and the read-speed
    notes with --verbose); files written; banner on stderr."""
    print()
    print(format_batch_table(rows) if "batch_size" in rows[0]
          else format_table(rows))  # fmt: skip
    for note in (describe_noise(rows), describe_choice(rows)):
        if note:
            print(note)
    if args.verbose:
        print()
        print(format_details(rows))
        for note in (describe_bandwidth(rows), describe_kernels(rows)):
            if note:
                print(note)
    elif "batch_size" not in rows[0]:
        print("More columns and notes: --verbose; every field: --json PATH.")
    log = get_logger(LOG_NAME)
    for path, writer in ((args.json, write_json), (args.csv, write_csv)):
        if path:
            log.info(f"wrote {writer(rows, path)}")
    if args.plot:
        plot_results(rows, args.plot)
        log.info(f"wrote {args.plot}")
    if rows[0].get("standin"):
        from utils.download import print_standin_banner

        with contextlib.redirect_stdout(sys.stderr):
            print_standin_banner()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (2 after one line for
    bad arguments or unusable files, never a traceback)."""
    utf8_streams()  # output in UTF-8 to files and pipes (utils.stdio)
    return run_command(PROG, lambda: _main(argv))
