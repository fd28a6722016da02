"""How the benchmark builds, runs and measures each mode (`utils.benchmark`).

Each mode becomes "a function that streams new tokens" (`Prepared`): a way
to generate of the one registry (`utils.streaming.generation_paths`: the
book's generators, compiled or not, and the fast decoder's paths), the book
package's optimized model or Hugging Face `transformers`; the
timers read the clock per token, and the memory a mode uses is sampled
while it runs (peak RSS on a CPU) and counted by the tensors it holds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from utils.device import synchronize


class ModeSkipped(Exception):
    """A mode cannot run here (e.g. an optional package is missing)."""


# ---------------------------------------------------------------------------
# The modes: the registry's ways to generate and the benchmark's own
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """One row of the benchmark: how its model is built and run (`all_modes`:
    the registry's entries and the benchmark's own comparisons)."""

    name: str
    note: str
    family: str  # "book", "optimized", "fast" or "hf"
    compiled: bool = False
    cache: bool = True  # the book's modes: with its KVCache
    int8: bool = False
    cpu_only: bool = False  # its kernels exist on CPUs only
    slow_on_cpu: bool = False  # minutes at 100 tokens: run only when named
    by_default: bool = True  # run when no modes are named


def _registry_mode(path: Any) -> Mode:
    """The row of a registry entry, read off its `needs`."""
    needs = path.needs
    return Mode(path.name, path.summary, path.family,
                compiled="compile" in needs, cache="cache" in needs,
                int8=path.int8, cpu_only="cpu" in needs,
                slow_on_cpu="cache" not in needs,
                by_default=path.in_default_run)  # fmt: skip


_OPTIMIZED = (
    Mode("optimized", "book package's qwen3_optimized", "optimized"),
    Mode("optimized_compiled", "book package's qwen3_optimized, torch.compile",
         "optimized", compiled=True),
)  # fmt: skip
_HF = Mode("hf_static", "transformers generate, static cache", "hf")


def all_modes() -> tuple[Mode, ...]:
    """Every mode in the table's order, asked on each use: the registry's
    book paths, the book package's optimized model, its fast paths, HF."""
    from utils.streaming import generation_paths

    rows = [_registry_mode(p) for p in generation_paths()]
    book = [m for m in rows if m.family == "book"]
    return (*book, *_OPTIMIZED, *[m for m in rows if m.family == "fast"], _HF)


def mode_names() -> list[str]:
    """The names of `all_modes`, in order."""
    return [m.name for m in all_modes()]


def get_mode(name: str) -> Mode:
    """The mode called `name` (a name `_check_modes` accepted)."""
    return next(m for m in all_modes() if m.name == name)


def default_modes(device: torch.device) -> list[str]:
    """The modes run when none are named: int8 and native only on CPU, where
    their kernels exist; the uncached and the compiled modes everywhere but
    on a CPU, where each takes minutes (running or compiling), so the
    default set finishes in a few minutes on a 2-core laptop."""
    modes = all_modes()
    if device.type == "cpu":
        return [m.name for m in modes if m.by_default and not opt_in_on_cpu(m)]
    return [m.name for m in modes if m.by_default and not m.cpu_only]


def opt_in_on_cpu(mode: Mode) -> bool:
    """Whether a CPU runs `mode` only when it is named: minutes to run at
    100 tokens (no cache) or minutes to compile."""
    return mode.slow_on_cpu or mode.compiled


# ---------------------------------------------------------------------------
# Memory sampling
# ---------------------------------------------------------------------------


class PeakMemory:
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

    def __enter__(self) -> PeakMemory:
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

    mine, theirs = storages(model), storages(loaded)
    return sum(nbytes for ptr, nbytes in mine.items() if ptr in theirs)


def own_tensor_bytes(model: torch.nn.Module, loaded: torch.nn.Module) -> int:
    """Bytes of `model`'s tensors that are not `loaded`'s: the copies a mode
    made (int8 weights, static KV cache). A floor for its memory where the
    allocator reuses memory freed by an earlier mode, so RSS does not grow."""
    mine, theirs = storages(model), storages(loaded)
    return sum(nbytes for ptr, nbytes in mine.items() if ptr not in theirs)


def storages(m: torch.nn.Module) -> dict[int, int]:
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


def time_stream(
    stream: Callable[[], Iterable[Any]],
    device: torch.device,
    tick: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Time one generation: time to first token, total, number of tokens.
    `tick` is called after each token (the run's progress counts them)."""
    synchronize(device)
    start = time.perf_counter()
    first = None
    n = 0
    for tok in stream():
        if first is None:
            if hasattr(tok, "device"):
                synchronize(device)
            first = time.perf_counter()
        n += 1
        if tick is not None:
            tick()
    synchronize(device)
    end = time.perf_counter()
    first = end if first is None else first
    return {"ttft_s": first - start, "total_s": end - start, "tokens": n}


def optimized_model(book_model: torch.nn.Module) -> torch.nn.Module:
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


def optimized_stream(model, token_ids, n):
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


def _hf_time_stream(stream, device, tick=None) -> dict[str, float]:
    """As `time_stream`; the tokens' times come at the end (no ticks)."""
    synchronize(device)
    start = time.perf_counter()
    stamps = list(stream())
    synchronize(device)
    end = time.perf_counter()
    first = stamps[0] if stamps else end
    return {"ttft_s": first - start, "total_s": end - start, "tokens": len(stamps)}


@contextlib.contextmanager
def fresh_compile_cache(enabled: bool) -> Iterator[None]:
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


def forget_compiled_code() -> None:
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


class _DropCudaProbeLine(logging.Filter):
    """Drops torch's "No CUDA runtime is found" line, and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


@contextlib.contextmanager
def no_cuda_probe_line() -> Iterator[None]:
    """Silence one line: inductor's first CPU compile imports
    `torch.utils.cpp_extension`, which on a machine with a CUDA toolkit
    (an `nvcc` on PATH, CUDA_HOME) but no CUDA runtime warns "No CUDA
    runtime is found" on import: about CUDA, on a run that asked for none.
    Every other line of that logger still shows."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    drop = _DropCudaProbeLine()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


@dataclass
class Prepared:
    """A mode ready to run: a stream factory, its timer and the model."""

    stream: Callable[[], Iterable[Any]]
    model: torch.nn.Module
    timer: Callable[..., dict[str, float]] = time_stream


def _prepare_path(mode: Any, book, token_ids, n) -> Prepared:
    """A mode that is a way to generate of the one registry: built for the
    book's model by its entry, skipped where it cannot run here (a native
    path whose step cannot run for this model too: not timed eagerly in its
    name)."""
    from utils.streaming import get_generation_path

    path = get_generation_path(mode.name)
    reason = path.unavailable(token_ids.device)
    if reason is not None:
        raise ModeSkipped(reason)
    model = path.build(book)
    if "native" in path.needs and model.native_unsupported_reason() is not None:
        raise ModeSkipped(model.native_unsupported_reason())
    return Prepared(lambda: path.stream(model, token_ids, n), model)


def _prepare_optimized(mode: Any, book, token_ids, n) -> Prepared:
    from utils.compile import book_compile

    opt = optimized_model(book)
    model = book_compile(opt) if mode.compiled else opt
    return Prepared(optimized_stream(model, token_ids, n), opt)


def _prepare_hf(mode: Any, book, token_ids, n) -> Prepared:
    stream, hf = _hf_static_runner(book, token_ids, n)
    return Prepared(stream, hf, _hf_time_stream)


PREPARE = {
    "book": _prepare_path,
    "optimized": _prepare_optimized,
    "fast": _prepare_path,
    "hf": _prepare_hf,
}


def make_resident(model: torch.nn.Module) -> None:
    """Read every CPU weight of `model` once. The pages of a memory-mapped
    checkpoint then are resident before the first mode, instead of showing
    up as its growth on top of the weights it reads in place (which counted
    them twice: kv_cache, the first mode, showed 2.57 GB instead of 1.4)."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.device.type == "cpu" and t.numel():
                t.sum()
