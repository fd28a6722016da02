"""Table 2.1 in one call: tokens/sec of every generation mode, side by side.

Run `uv run python -m utils.benchmark --help`, or from a notebook:

    rows = run_benchmark(modes=["kv_cache", "fast_compiled"], max_new_tokens=50)
    print(format_table(rows))

The modes (all greedy, same prompt, same number of new tokens, EOS ignored)
are the entries of `MODES`: the book's four (`regular`, `regular_compiled`,
`kv_cache`, `kv_cache_compiled`, compiled the book's way through
`utils.compile.book_compile`), the book package's `qwen3_optimized`, the fast
path of `utils.fast` (eager, compiled, block-compiled, int8, native) and
Hugging Face `transformers` with a static cache. On a CPU the uncached book
modes run only when asked for (minutes at 100 tokens).

Each mode runs once as warm-up (compiled modes into an empty compile cache,
then once more from that cache), then `repeats` timed runs whose medians are
reported. Decode speed counts the tokens after the first over the time after
the first, so the prompt is not mixed in (that is the time to first token).
Next to each mode the machine's memory read speed is probed (`torch.sum` over
~1 GiB, just before and after), so the GB/s a mode's weight reads reach can be
compared with what the memory gives. Two shares: against the best probe of the
run (strict, comparable across rows), and against `torch.sum` over the same
bytes timed right after each token of one more generation (the same moment:
a shared machine's memory can change speed within a second, so a median over
seconds is not comparable with a probe's best 30 ms). The row fields are
listed in `ROW_FIELDS`; the README explains them.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from utils.device import synchronize
from utils.errors import CommandParser, UsageError, run_command
from utils.fileio import atomic_write_text


@dataclass(frozen=True)
class Mode:
    """One row of the benchmark: how its model is built and run."""

    name: str
    note: str
    family: str  # "book", "optimized", "fast" or "hf"
    compiled: bool = False
    cache: bool = True  # the book's modes: with its KVCache
    scope: str = "step"  # fast_*: what compile_decode compiles
    int8: bool = False
    native: bool = False
    cpu_only: bool = False  # its kernels exist on CPUs only
    slow_on_cpu: bool = False  # minutes at 100 tokens: run only when asked


MODES = (
    Mode("regular", "book, no cache", "book", cache=False, slow_on_cpu=True),
    Mode("regular_compiled", "book, no cache, torch.compile", "book",
         compiled=True, cache=False, slow_on_cpu=True),
    Mode("kv_cache", "book KVCache", "book"),
    Mode("kv_cache_compiled", "book KVCache, torch.compile", "book",
         compiled=True),
    Mode("optimized", "book package's qwen3_optimized", "optimized"),
    Mode("optimized_compiled", "book package's qwen3_optimized, torch.compile",
         "optimized", compiled=True),
    Mode("fast", "static cache, eager", "fast"),
    Mode("fast_compiled", "static cache, compiled decode step", "fast",
         compiled=True),
    Mode("fast_block_compiled", "static cache, one compiled block for all layers",
         "fast", compiled=True, scope="block"),
    Mode("fast_int8", "static cache, int8 weights, compiled (approximate)",
         "fast", compiled=True, int8=True, cpu_only=True),
    Mode("fast_native", "static cache, whole step in one C call (CPU)", "fast",
         native=True, cpu_only=True),
    Mode("fast_native_int8", "one C call per step, int8 weights (approximate)",
         "fast", int8=True, native=True, cpu_only=True),
    Mode("hf_static", "transformers generate, static cache", "hf"),
)  # fmt: skip
MODE_BY_NAME = {m.name: m for m in MODES}
ALL_MODES = tuple(MODE_BY_NAME)
PAIRED_ROUNDS = 30  # decode steps each timed beside a torch.sum of its bytes
MODE_NOTES = {m.name: m.note for m in MODES}
BASELINE_MODE = "kv_cache"
SLOW_ON_CPU = tuple(m.name for m in MODES if m.slow_on_cpu)
CPU_ONLY = tuple(m.name for m in MODES if m.cpu_only)
INT8_MODES = tuple(m.name for m in MODES if m.int8)
BF16_FAST_MODES = tuple(m.name for m in MODES if m.family == "fast" and not m.int8)
DEFAULT_PROMPT = "Explain large language models in a single sentence."
DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
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
    "kernel_variant",
    "note",
)


def default_modes(device: torch.device) -> list[str]:
    """The modes run when none are named: int8 and native only on CPU, where
    their kernels exist; the uncached book modes everywhere but on a CPU."""
    if device.type == "cpu":
        return [m.name for m in MODES if not m.slow_on_cpu]
    return [m.name for m in MODES if not m.cpu_only]


def _log(text: str) -> None:
    """Progress and notes: stderr, so stdout holds only the results."""
    print(text, file=sys.stderr, flush=True)


class ModeSkipped(Exception):
    """A mode cannot run here (e.g. an optional package is missing)."""


# ---------------------------------------------------------------------------
# Memory sampling
# ---------------------------------------------------------------------------


class _PeakMemory:
    """Peak memory while a mode runs: device memory on CUDA/XPU/MPS, and on
    CPU the largest resident size sampled every few milliseconds (the
    process-wide peak would only ever grow from mode to mode). `growth` is
    the peak minus the memory in use when the mode started."""

    def __init__(self, device: torch.device, interval_s: float = 0.02) -> None:
        self.device = device
        self.interval_s = interval_s
        self.peak = 0
        self.start = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> _PeakMemory:
        from utils.device import reset_peak_memory

        reset_peak_memory(self.device)
        if self.device.type == "cpu":
            import psutil

            self.start = self.peak = psutil.Process().memory_info().rss
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        else:
            backend = getattr(torch, self.device.type, None)
            allocated = getattr(backend, "memory_allocated", None)
            self.start = int(allocated()) if allocated is not None else 0
        return self

    def __exit__(self, *exc: Any) -> None:
        from utils.device import peak_memory_bytes

        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.kind = "Peak process memory (RSS) during the mode"
        else:
            self.peak, self.kind = peak_memory_bytes(self.device)

    @property
    def growth(self) -> int:
        return max(self.peak - self.start, 0)


def shared_weight_bytes(model: torch.nn.Module, loaded: torch.nn.Module) -> int:
    """Bytes of the tensors of `loaded` (the book model every mode starts
    from) that `model` still uses: the weights a mode reads without copying."""

    mine, theirs = _storages(model), _storages(loaded)
    return sum(nbytes for ptr, nbytes in mine.items() if ptr in theirs)


def own_tensor_bytes(model: torch.nn.Module, loaded: torch.nn.Module) -> int:
    """Bytes of `model`'s tensors that are not `loaded`'s: the copies a mode
    made (int8 weights, static KV cache). A floor for its memory where the
    allocator reuses memory freed by an earlier mode, so RSS does not grow."""
    mine, theirs = _storages(model), _storages(loaded)
    return sum(nbytes for ptr, nbytes in mine.items() if ptr not in theirs)


def _storages(m: torch.nn.Module) -> dict[int, int]:
    """{storage address: bytes its tensors cover} of a module's parameters
    and buffers. Counts the bytes the tensors view, not the storage's size:
    the int8 weights are views of one block with some unused padding
    (utils.fast.quantize.int8_block)."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for t in [*m.parameters(), *m.buffers()]:
        if t is not None and t.device.type != "meta":
            start = t.data_ptr()
            end = start + t.numel() * t.element_size()
            spans.setdefault(t.untyped_storage().data_ptr(), []).append((start, end))
    return {ptr: _covered(parts) for ptr, parts in spans.items()}


def _covered(spans: list[tuple[int, int]]) -> int:
    """Bytes covered by the union of [start, end) spans."""
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is not None and start < reach:
            start = reach
        if end > start:
            total += end - start
            reach = end
    return total


# ---------------------------------------------------------------------------
# Runners: each mode becomes "a function that streams new tokens"
# ---------------------------------------------------------------------------


class _Progress:
    """Counts tokens for one phase of a mode: a tqdm bar on a terminal; when
    stderr goes to a file or a pipe, one line at the start and one at the
    end (with the time) instead of hundreds of bar updates."""

    def __init__(self, desc: str, total: int | None) -> None:
        self.desc, self.count, self.start = desc, 0, time.perf_counter()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="tok", leave=False)
        else:
            _log(f"{desc} ...")

    def update(self) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            took = time.perf_counter() - self.start
            _log(f"{self.desc}: done, {self.count} tokens in {took:.1f} s")


def _time_stream(
    stream: Callable[[], Iterable[Any]],
    device: torch.device,
    progress: str | None = None,
    total: int | None = None,
) -> dict[str, float]:
    """Time one generation: time to first token, total, number of tokens.
    With `progress`, the tokens are counted on stderr under that name."""
    bar = None if progress is None else _Progress(progress, total)
    synchronize(device)
    start = time.perf_counter()
    first = None
    n = 0
    try:
        for tok in stream():
            if first is None:
                if hasattr(tok, "device"):
                    synchronize(device)
                first = time.perf_counter()
            n += 1
            if bar is not None:
                bar.update()
        synchronize(device)
    finally:
        if bar is not None:
            bar.close()
    end = time.perf_counter()
    first = end if first is None else first
    return {"ttft_s": first - start, "total_s": end - start, "tokens": n}


def _book_stream(model, generator, token_ids, n):
    return lambda: generator(model, token_ids, n)


def _optimized_model(book_model: torch.nn.Module) -> torch.nn.Module:
    """The book package's `qwen3_optimized.Qwen3Model` sharing the book
    model's weights (same parameter names; no copy)."""
    try:
        from reasoning_from_scratch import qwen3_optimized as opt
    except ImportError as exc:
        raise ModeSkipped(
            "this reasoning_from_scratch has no qwen3_optimized module "
            "(update it: pip install -U reasoning-from-scratch)"
        ) from exc
    cfg = dict(book_model.cfg)
    device = book_model.tok_emb.weight.device
    with torch.device("meta"):
        model = opt.Qwen3Model(cfg)
    model.load_state_dict(book_model.state_dict(), assign=True)
    head_dim = cfg["head_dim"] or cfg["emb_dim"] // cfg["n_heads"]
    cos, sin = opt.compute_rope_params(
        head_dim, theta_base=cfg["rope_base"], context_length=cfg["context_length"]
    )
    model.cos, model.sin = cos.to(device), sin.to(device)
    return model.eval()


def _optimized_stream(model, token_ids, n):
    """The loop of `qwen3_optimized.generate_text_basic_cache`, yielding each
    token as it is made. The cache holds prompt + n tokens; the package's
    function sizes it for the whole 40,960-token context instead."""
    from reasoning_from_scratch.qwen3_optimized import KVCache

    cfg = model.cfg

    @torch.inference_mode()
    def stream():
        cache = KVCache(
            n_layers=cfg["n_layers"],
            max_len=token_ids.shape[1] + n,
            num_kv_groups=cfg["n_kv_groups"],
            head_dim=cfg["head_dim"] or cfg["emb_dim"] // cfg["n_heads"],
            device=token_ids.device,
            dtype=cfg["dtype"],
        )
        model.reset_kv_cache()
        out = model(token_ids, cache=cache)[:, -1]
        for _ in range(n):
            next_token = torch.argmax(out, dim=-1, keepdim=True)
            yield next_token
            out = model(next_token, cache=cache)[:, -1]

    return stream


def _hf_static_runner(book_model, token_ids, n):
    """Qwen3ForCausalLM holding the book model's weights, greedy generate with
    a static cache; tokens come out through a streamer as they are made."""
    try:
        import transformers
    except ImportError as exc:
        raise ModeSkipped(
            "transformers is not installed (pip install transformers)"
        ) from exc

    from utils.hf_interop import book_to_hf_state_dict, hf_config_from_book

    dtype = book_model.tok_emb.weight.dtype
    device = book_model.tok_emb.weight.device
    config = transformers.Qwen3Config(
        **hf_config_from_book(book_model.cfg, tie_word_embeddings=False, dtype=dtype)
    )
    with torch.device(device):
        hf = transformers.Qwen3ForCausalLM(config).to(dtype)
    sd = book_to_hf_state_dict(book_model.state_dict())
    hf.load_state_dict(sd, strict=True)
    hf.eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0

    def stream() -> list[float]:
        """Run generate once; the time at which each new token appeared."""
        stamps: list[float] = []

        class Streamer:  # transformers calls put() with the prompt, then tokens
            prompt_seen = False

            def put(self, value):
                if self.prompt_seen:
                    stamps.append(time.perf_counter())
                self.prompt_seen = True

            def end(self):
                pass

        with torch.inference_mode():
            hf.generate(
                token_ids,
                attention_mask=torch.ones_like(token_ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                cache_implementation="static",
                streamer=Streamer(),
            )
        return stamps

    return stream, hf


def _hf_time_stream(stream, device) -> dict[str, float]:
    synchronize(device)
    start = time.perf_counter()
    stamps = list(stream())
    synchronize(device)
    end = time.perf_counter()
    first = stamps[0] if stamps else end
    return {"ttft_s": first - start, "total_s": end - start, "tokens": len(stamps)}


@contextlib.contextmanager
def _fresh_compile_cache(enabled: bool) -> Iterator[None]:
    """An empty temporary inductor cache folder (deleted afterwards), so the
    first compile is what a fresh machine pays and a later one can reuse it."""
    import torch._inductor.utils as inductor_utils

    fresh = getattr(inductor_utils, "fresh_cache", None) or getattr(
        inductor_utils, "fresh_inductor_cache", None
    )
    if not enabled or fresh is None:
        yield
        return
    with fresh():
        yield


def _forget_compiled_code() -> None:
    """Drop what this process compiled (dynamo's graphs, inductor's loaded
    kernels) but not the on-disk cache: the next call compiles like a second
    process would."""
    import torch._inductor.utils as inductor_utils

    torch._dynamo.reset()
    clear = getattr(inductor_utils, "clear_caches", None) or getattr(
        inductor_utils, "clear_inductor_caches", None
    )
    if clear is not None:
        clear()


_NOT_WEIGHTS = ("cache", "cos", "sin", "positions", "mask", "inv_freq")


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter and weight
    buffer once (shared tensors once), of an embedding table only one row
    unless the same tensor is also the output layer."""

    def is_embedding(module: torch.nn.Module) -> bool:
        return isinstance(module, torch.nn.Embedding) or getattr(
            module, "is_embedding", False
        )

    embedding_ptrs = set()
    for module in model.modules():
        if is_embedding(module):
            for t in [
                *module.parameters(recurse=False),
                *module.buffers(recurse=False),
            ]:
                if t is not None and t.dim() == 2:
                    embedding_ptrs.add(t.data_ptr())
    seen, total, row_bytes = set(), 0, 0
    for module in model.modules():
        tensors = list(module.named_parameters(recurse=False))
        tensors += list(module.named_buffers(recurse=False))
        for name, t in tensors:
            if t is None or any(word in name for word in _NOT_WEIGHTS):
                continue
            if is_embedding(module):
                if t.dim() == 2:
                    row_bytes = max(row_bytes, t[0].numel() * t.element_size())
                continue
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    tied = bool(embedding_ptrs & seen)
    return total + (0 if tied else row_bytes)


def read_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """A float32 buffer of ones, `nbytes` long (at least one value), for
    `torch.sum` to read as the memory's speed of the moment. On a CPU it
    lies on 2 MB pages where Linux gives them, as the native step's weights
    do: a buffer on 4 KB pages understates the memory (on a 2-core Zen 4
    VM `torch.sum` read 1.2-1.3x faster from 2 MB pages), and a step could
    then read "faster than memory"."""
    count = max(nbytes // 4, 1)
    if device.type == "cpu":
        from utils.fast.hugepages import huge_page_empty, huge_pages_enabled

        if huge_pages_enabled():
            return huge_page_empty(count * 4).view(torch.float32).fill_(1.0)
    return torch.ones(count, device=device)


def time_beside_sum(
    step: Callable[[], Any], buffer: torch.Tensor, device: torch.device
) -> tuple[float, float]:
    """(seconds of one `step()`, seconds of one `torch.sum(buffer)` right
    after it): one round of a step timed beside a pure read of its bytes."""
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    mid = time.perf_counter()
    torch.sum(buffer)
    synchronize(device)
    return mid - start, time.perf_counter() - mid


def paired_share(
    stream: Callable[[], Iterable[Any]],
    nbytes: int,
    device: torch.device,
    rounds: int = PAIRED_ROUNDS,
) -> tuple[float, float] | None:
    """(share, GB/s): over up to `rounds` decode steps of one generation,
    the median of (step's read speed) / (`torch.sum`'s speed over a buffer
    of the `nbytes` the step reads, timed right after it), 1.0 being the
    memory's speed of the moment, and the median speed of those sums (the
    moment it was measured in). None with fewer than 3 steps."""
    tokens = iter(stream())
    if next(tokens, None) is None:  # the first token is the prompt's
        return None
    buffer = read_buffer(nbytes, device)
    torch.sum(buffer)  # start the threads
    end = object()
    last: list[Any] = [None]

    def step() -> None:
        last[0] = next(tokens, end)

    ratios, sums = [], []
    for _ in range(rounds):
        step_s, sum_s = time_beside_sum(step, buffer, device)
        if last[0] is end:
            break
        ratios.append(sum_s / max(step_s, 1e-12))
        sums.append(sum_s)
    if hasattr(tokens, "close"):  # a generator: stop it here
        tokens.close()
    if len(ratios) < 3:
        return None
    return statistics.median(ratios), nbytes / statistics.median(sums) / 1e9


def measure_read_bandwidth(
    device: torch.device, size_bytes: int = 1 << 30, repeats: int = 5
) -> float:
    """The memory read speed in bytes/s: best of `repeats` `torch.sum` over
    a float32 buffer of `size_bytes` on `device` (`read_buffer`)."""
    buf = read_buffer(size_bytes, device)
    torch.sum(buf)  # warm-up: start the threads
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        torch.sum(buf)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    del buf
    return size_bytes / best


# ---------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------


def _weights(
    model_path: str | os.PathLike | None, out_dir: str | os.PathLike | None
) -> tuple[Mapping[str, torch.Tensor], Path | None, bool]:
    """(state dict, tokenizer path or None, stand-in?) from `model_path` or
    the download (stand-ins offline; `out_dir` None: the model store's own
    files). Raises ValueError with one line for a missing or unusable file."""
    from utils.download import download_qwen3_small, local_files
    from utils.models import CheckpointError, read_checkpoint

    with contextlib.redirect_stdout(sys.stderr):  # banners are not results
        if model_path is None:
            files = download_qwen3_small("base", out_dir=out_dir)
            model_path, tokenizer, standin = files.model, files.tokenizer, files.standin
        else:
            guess = Path(model_path).with_name("tokenizer-base.json")
            try:
                model_path, tokenizer, standin = local_files(
                    model_path, guess if guess.is_file() else None
                )
            except FileNotFoundError:
                raise ValueError(
                    f"--model-path {model_path} does not exist; pass the book's "
                    "qwen3-0.6B-*.pth file or leave it out to download."
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


@dataclass
class _Prepared:
    """A mode ready to run: a stream factory, its timer and the model."""

    stream: Callable[[], Iterable[Any]]
    model: torch.nn.Module
    timer: Callable[..., dict[str, float]] = _time_stream


def _prepare_book(mode: Mode, book, token_ids, n) -> _Prepared:
    from utils.compile import book_compile
    from utils.generation import (
        generate_text_basic_stream,
        generate_text_basic_stream_cache,
    )

    model = book_compile(book) if mode.compiled else book
    gen = generate_text_basic_stream_cache if mode.cache else generate_text_basic_stream
    return _Prepared(_book_stream(model, gen, token_ids, n), book)


def _prepare_optimized(mode: Mode, book, token_ids, n) -> _Prepared:
    from utils.compile import book_compile

    opt = _optimized_model(book)
    model = book_compile(opt) if mode.compiled else opt
    return _Prepared(_optimized_stream(model, token_ids, n), opt)


def _prepare_fast(mode: Mode, book, token_ids, n) -> _Prepared:
    from utils.fast import FastQwen3, generate, quantize_int8

    fast = FastQwen3.from_book_model(book)
    if mode.int8:
        fast = quantize_int8(fast)
    if mode.compiled:
        fast.compile_decode(scope=mode.scope)
    if mode.native:
        reason = fast.native_unsupported_reason()
        if reason is not None:
            raise ModeSkipped(reason)
        fast.use_native_step()
    return _Prepared(lambda: generate(fast, token_ids, n), fast)


def _prepare_hf(mode: Mode, book, token_ids, n) -> _Prepared:
    stream, hf = _hf_static_runner(book, token_ids, n)
    return _Prepared(stream, hf, _hf_time_stream)


_PREPARE = {
    "book": _prepare_book,
    "optimized": _prepare_optimized,
    "fast": _prepare_fast,
    "hf": _prepare_hf,
}


def _check_modes(modes: Sequence[str]) -> list[str]:
    modes = list(ALL_MODES) if list(modes) == ["all"] else list(modes)
    bad = [m for m in modes if m not in MODE_BY_NAME]
    if bad or not modes:
        raise ValueError(
            f"unknown mode(s) {', '.join(bad) or '(none given)'}; "
            f"choose from {', '.join(ALL_MODES)} (or all)"
        )
    return list(dict.fromkeys(modes))


def _check_arguments(dtype, max_new_tokens, repeats) -> torch.dtype:
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
    cfg: Mapping[str, Any] | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    token_ids: torch.Tensor | None = None,
    cold_compile: bool = True,
    quiet: bool = False,
    bandwidth_bytes: int = 1 << 30,
) -> list[dict[str, Any]]:
    """Time each mode on one model (same weights, prompt and token count) and
    return one dict per mode (fields: ROW_FIELDS).

    Weights come from `download_qwen3_small` (stand-ins offline), `model_path`,
    or `cfg` + `state_dict` (tests); `token_ids` overrides the prompt.
    `cold_compile=False` keeps your usual compile cache (warm-ups may be
    shorter); `bandwidth_bytes` is the buffer size for the read-speed probe.
    Progress goes to stderr (nothing with `quiet`).
    """
    from utils.device import resolve_device
    from utils.models import load_book_model

    dev = resolve_device(device) if isinstance(device, str) else torch.device(device)
    dtype = _check_arguments(dtype, max_new_tokens, repeats)
    modes = _check_modes(_modes_for(dev, modes, quiet))
    tokenizer_path, standin = None, False
    if state_dict is None:
        state_dict, tokenizer_path, standin = _weights(model_path, out_dir)
    book = load_book_model(state_dict, dev, dtype, cfg)
    make_resident(book)
    if token_ids is None:
        token_ids = prompt_token_ids(
            tokenizer_path or _tokenizer_file(out_dir), prompt, dev
        )
    _check_memory(book.cfg, token_ids.shape[1], max_new_tokens, modes, dev)
    run = _Run(book, token_ids.to(dev), max_new_tokens, repeats, dev, quiet)
    rows = run.all(modes, cold_compile, bandwidth_bytes)
    for row in rows:
        row["standin"] = standin
        row["dtype"] = str(dtype).removeprefix("torch.")
    return rows


def make_resident(model: torch.nn.Module) -> None:
    """Read every CPU weight of `model` once. The pages of a memory-mapped
    checkpoint then are resident before the first mode, instead of showing
    up as its growth on top of the weights it reads in place (which counted
    them twice: kv_cache, the first mode, showed 2.57 GB instead of 1.4)."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.device.type == "cpu" and t.numel():
                t.sum()


def _check_memory(cfg, prompt_len: int, n: int, modes: list[str], dev) -> None:
    """Refuse, before any mode runs, a prompt whose attention would not fit
    (the uncached modes run prompt + n tokens at once in their last step)."""
    from utils.models import check_prefill_fits

    uncached = any(not MODE_BY_NAME[m].cache for m in modes)
    check_prefill_fits(cfg, prompt_len + (n if uncached else 0), dev)


def _modes_for(dev: torch.device, modes: Sequence[str] | None, quiet: bool):
    if modes is not None:
        return modes
    left_out = [m for m in SLOW_ON_CPU if m not in default_modes(dev)]
    if left_out and not quiet:
        _log(
            f"[benchmark] not running {', '.join(left_out)} on {dev.type}: "
            "each takes many minutes at 100 tokens (ask with --modes all)"
        )
    return default_modes(dev)


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
    every mode shares; `all` times the modes one after another."""

    book: torch.nn.Module
    token_ids: torch.Tensor
    n: int
    repeats: int
    dev: torch.device
    quiet: bool

    def all(
        self, modes: list[str], cold_compile: bool, probe_bytes: int
    ) -> list[dict[str, Any]]:
        first = before = measure_read_bandwidth(self.dev, probe_bytes)
        self.log(
            f"[benchmark] memory read speed ({self.dev.type}, torch.sum over "
            f"{probe_bytes / 1024**3:.2f} GiB): {first / 1e9:.1f} GB/s"
        )
        rows = []
        for name in modes:
            # each mode compiles into its own empty cache folder (cold_compile)
            with _fresh_compile_cache(cold_compile):
                row = self.mode(MODE_BY_NAME[name])
            if row is None:
                continue
            after = measure_read_bandwidth(self.dev, probe_bytes)
            row["run_read_gbps"] = first / 1e9
            row["machine_read_gbps"] = max(before, after) / 1e9
            before = after
            rows.append(row)
            self.log(
                f"[benchmark] {name}: {row['tokens_per_sec']:.2f} tok/s, "
                f"weights read at {row['weight_read_gbps']:.1f} GB/s (read "
                f"speed around it {row['machine_read_gbps']:.1f} GB/s; "
                f"{_num(row['bandwidth_share_paired'], '.0%')} of torch.sum "
                f"at the same moment, when it read at "
                f"{_num(row['paired_read_gbps'], '.1f')} GB/s), "
                f"warm-up {row['warmup_s']:.1f} s"
            )
        _add_shares(rows)
        _add_ratios(rows)
        return rows

    def log(self, text: str) -> None:
        if not self.quiet:
            _log(text)

    def progress(self, mode: Mode, what: str) -> str | None:
        return None if self.quiet else f"[benchmark] {mode.name}: {what}"

    def mode(self, mode: Mode) -> dict[str, Any] | None:
        """One row for `mode`, or None (after one line) if it is skipped."""
        if mode.compiled:
            _forget_compiled_code()  # every compiled mode starts from scratch
        with _PeakMemory(self.dev) as mem:
            t0 = time.perf_counter()
            try:
                prep = _PREPARE[mode.family](mode, self.book, self.token_ids, self.n)
            except ModeSkipped as exc:
                _log(f"[benchmark] {mode.name}: skipped, {exc}")
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
        row["kernel_variant"] = kernel_variant(prep.model)
        paired = None
        if prep.timer is _time_stream:  # tokens come one by one
            paired = paired_share(prep.stream, row["weight_bytes_per_token"], self.dev)
        row["bandwidth_share_paired"], row["paired_read_gbps"] = paired or (None, None)
        if warm["tokens"] != self.n:
            row["note"] += f"; produced {warm['tokens']} tokens"
        # Free this mode's copies (compiled graphs, int8 weights) so the
        # next mode's memory figure is its own
        del prep
        if mode.compiled:
            _forget_compiled_code()
        gc.collect()
        return row

    def timed(self, mode: Mode, prep: _Prepared):
        """(warm-up, warm-up from the compile cache or None, timed runs)."""
        bars = prep.timer is _time_stream
        what = "warm-up, compiling (minutes on a CPU)" if mode.compiled else "warm-up"
        kwargs = (
            {"progress": self.progress(mode, what), "total": self.n} if bars else {}
        )
        warm = prep.timer(prep.stream, self.dev, **kwargs)
        cached = None
        if mode.compiled:
            _forget_compiled_code()
            if bars:
                kwargs["progress"] = self.progress(
                    mode, "warm-up again, from the compile cache"
                )
            cached = prep.timer(prep.stream, self.dev, **kwargs)
        runs = [prep.timer(prep.stream, self.dev) for _ in range(self.repeats)]
        return warm, cached, runs


def _add_memory(row: dict[str, Any], model, book, mem: _PeakMemory) -> None:
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
    return {
        "mode": mode,
        "device": str(dev),
        "tokens_per_sec_runs": decode_rates,
        # half the range of the timed runs, relative to their median (±)
        "tokens_per_sec_spread": (max(decode_rates) - min(decode_rates))
        / 2
        / max(rate, 1e-9),
        "dtype": None,
        "prompt_tokens": int(token_ids.shape[1]),
        "new_tokens": int(runs[0]["tokens"]),
        "tokens_per_sec": statistics.median(decode_rates),
        "e2e_tokens_per_sec": statistics.median(
            r["tokens"] / r["total_s"] for r in runs
        ),
        "ttft_s": statistics.median(r["ttft_s"] for r in runs),
        "warmup_s": warmup_s,
        "peak_mem_bytes": int(mem.peak),
        "process_peak_mem_bytes": int(mem.peak),
        "memory_kind": mem.kind,
        "ratio_vs_kv_cache": None,
        "compiled": False,
        "note": MODE_NOTES[mode],
    }


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    base = next((r for r in rows if r["mode"] == BASELINE_MODE), None)
    for row in rows:
        if base is not None and base["tokens_per_sec"] > 0:
            row["ratio_vs_kv_cache"] = row["tokens_per_sec"] / base["tokens_per_sec"]
    # Which fast path this machine should use (what pick_faster decides per
    # run): the fastest per token, and the soonest to a whole answer
    fast = [r for r in rows if r["mode"] in BF16_FAST_MODES]
    if not fast:
        return
    best = max(fast, key=lambda r: r["tokens_per_sec"])
    soonest = min(fast, key=lambda r: r["to_last_token_cold_s"])
    for row in rows:
        row["best_bf16_fast"] = row is best
        row["soonest_bf16_fast"] = row is soonest
        if row["mode"] in INT8_MODES:
            row["speed_vs_best_bf16_fast"] = (
                row["tokens_per_sec"] / best["tokens_per_sec"]
            )
            compiled = next((r for r in rows if r["mode"] == "fast_compiled"), None)
            if compiled is not None and compiled["peak_mem_bytes"] > 0:
                row["memory_vs_fast_compiled"] = (
                    row["peak_mem_bytes"] / compiled["peak_mem_bytes"]
                )


def kernel_variant(model: Any) -> str | None:
    """Which kernel variants a native mode's step ran and how they were
    chosen (e.g. "bf16_exact_avx512 (tuned)"); None for other modes."""
    step = getattr(model, "decode_step", None)
    if getattr(step, "kind", "") != "native":
        return None
    return step.choice.summary()


def describe_variants(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """One line naming the kernel variant each native mode ran (None
    without native rows)."""
    key = "kernel_variant"
    ran = [f"{r['mode']}: {r[key]}" for r in rows if r.get(key)]
    if not ran:
        return None
    return "Kernel variants the native modes ran: " + "; ".join(ran) + "."


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


def _num(value: float | None, fmt: str) -> str:
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
    return f"{_num(paired, '.0%')} ({best:.0%})"


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
            f"| {r['warmup_s']:.1f} / {_num(r.get('warmup_cached_s'), '.1f')} "
            f"| {_num(r.get('to_last_token_cold_s'), '.1f')} / "
            f"{_num(r.get('to_last_token_cached_s'), '.1f')} "
            f"| {_num(r.get('weight_read_gbps'), '.1f')} "
            f"| {_share(r)} "
            f"| {r['peak_mem_bytes'] / 1024**3:.2f} "
            f"| {_num(ratio, '.2f')}{'' if ratio is None else 'x'} |"
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
    """Write the rows as a JSON list (atomically)."""
    return atomic_write_text(path, json.dumps(list(rows), indent=2) + "\n")


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Write the rows as CSV with a header line (atomically)."""
    import io

    fields = list(ROW_FIELDS) + sorted({k for r in rows for k in r} - set(ROW_FIELDS))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write_text(path, buf.getvalue())


def plot_results(
    rows: Sequence[Mapping[str, Any]], path: str | os.PathLike | None = None
):
    """Bar chart of decode tokens/sec per mode; saved to `path` if given.
    Returns the matplotlib Figure."""
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
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


PROG = "python -m utils.benchmark"


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
        help=f"comma-separated subset of: {', '.join(ALL_MODES)}; or all "
        "(default: all but regular and regular_compiled on a CPU)",
    )
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the text to continue")
    p.add_argument("--model-path", default=None, help="a book .pth file")
    p.add_argument(
        "--out-dir",
        default=None,
        # "%(default).0s" prints nothing: no "(default: None)" in --help
        help="folder to put the model files in (hard links to the per-user "
        "model store); default: the store itself%(default).0s",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="write the rows")
    p.add_argument("--csv", default=None, metavar="PATH", help="write the rows")
    p.add_argument("--plot", default=None, metavar="PATH", help="bar chart (PNG)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default: torch's choice); 1 avoids "
        "thread thrashing on a machine busy with other work",
    )
    p.add_argument(
        "--warm-cache",
        action="store_true",
        help="use torch.compile's usual on-disk cache instead of a fresh one "
        "(the cold warm-up may then be shorter)",
    )
    return p


def check_output_path(path: str | os.PathLike, flag: str) -> Path:
    """Raise ValueError unless `path` can be written (checked before minutes
    of work): not a folder, under no regular file, in a writable folder."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file name")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: cannot write into {parent}")
    return path


def _check_cli(args) -> list[str] | None:
    """The modes asked for; every argument checked before any work."""
    modes = None
    if args.modes is not None:
        modes = _check_modes([m.strip() for m in args.modes.split(",") if m.strip()])
    if args.max_new_tokens < 2:
        raise ValueError("--max-new-tokens must be at least 2")
    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be at least 1")
    for flag in ("json", "csv", "plot"):
        if getattr(args, flag):
            check_output_path(getattr(args, flag), f"--{flag}")
    return modes


def _main(argv: Sequence[str] | None) -> int:
    from utils.download import DownloadError

    args = build_parser().parse_args(argv)
    try:
        modes = _check_cli(args)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        rows = run_benchmark(
            modes=modes,
            device=args.device,
            dtype=args.dtype,
            max_new_tokens=args.max_new_tokens,
            repeats=args.repeats,
            model_path=args.model_path,
            prompt=args.prompt,
            out_dir=args.out_dir,
            cold_compile=not args.warm_cache,
        )
    except (ValueError, FileNotFoundError, DownloadError) as exc:
        raise UsageError(str(exc)) from None
    _report(rows, args)
    return 0


def _report(rows: list[dict[str, Any]], args) -> None:
    """The table and its notes on stdout; files written; banner on stderr."""
    print()
    print(format_table(rows))
    print(describe_bandwidth(rows))
    choice = describe_choice(rows)
    if choice:
        print(choice)
    variants = describe_variants(rows)
    if variants:
        print(variants)
    for path, writer in ((args.json, write_json), (args.csv, write_csv)):
        if path:
            _log(f"wrote {writer(rows, path)}")
    if args.plot:
        plot_results(rows, args.plot)
        _log(f"wrote {args.plot}")
    if rows and rows[0].get("standin"):
        from utils.standin import print_standin_banner

        with contextlib.redirect_stdout(sys.stderr):
            print_standin_banner()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (2 after one line for
    bad arguments or unusable files, never a traceback)."""
    return run_command(PROG, lambda: _main(argv))


if __name__ == "__main__":
    raise SystemExit(main())
