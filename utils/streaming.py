"""Stream greedy generation as text: the one loop behind the command line
(`qwen3-generate`, `qwen3-chat`) and the notebook generation panel.

`stream_generation` encodes nothing itself: it takes prompt ids, streams new
token ids from a `GreedyStreamer` (a way to generate from the one registry,
`generation_paths`: the book's generators, compiled or not, or a
`utils.fast` path), turns them into text with `Utf8StreamDecoder` and
hands each finished piece to a `write` callback. It times the run with the
monotonic `time.perf_counter`, waiting for an asynchronous device (CUDA, XPU,
MPS) to finish before reading the clock, and can print or return the book's
statistics (`utils.generation.generate_stats`).

Two things the loop survives instead of raising: Ctrl-C (the text so far is
kept and the result says it was interrupted), and a token id the tokenizer
does not know. The output head has 151,936 rows but the tokenizer only
151,669 ids, so a model (random stand-in weights above all) can pick an id
with no text; it is written visibly as ``<unk:151771>`` and generation goes on.
"""

from __future__ import annotations

import codecs
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from utils.errors import ctrl_c_held
from utils.token_view import TokenBytes, unknown_piece

if TYPE_CHECKING:
    from utils.chat_cache import ChatCache


class Utf8StreamDecoder:
    """Turn a stream of token ids into text without broken characters.

    Bytes of a character cut across tokens are held back until the rest
    arrives; bytes that can never form a character come out as ``\\xNN``
    escapes, and an id outside the vocabulary as ``<unk:ID>``. `flush`
    returns whatever is still held at the end.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._to_bytes = TokenBytes(tokenizer)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def feed(self, token_id: int) -> str:
        """Text that became complete with this token (may be empty)."""
        raw = self._to_bytes.get(token_id)
        if raw is None:  # no bytes: end any held-back character, show the id
            return self.flush() + unknown_piece(token_id)
        return self._decoder.decode(raw)

    def flush(self) -> str:
        """Any held-back bytes, escaped, and a fresh start."""
        rest = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return rest


def decode_bytes(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """Decode ids as `Utf8StreamDecoder` does, for the whole stream at once."""
    decoder = Utf8StreamDecoder(tokenizer)
    return "".join(decoder.feed(int(i)) for i in token_ids) + decoder.flush()


# --------------------------------------------------------------------------
# The one registry of ways to generate, and token ids from the chosen one
# --------------------------------------------------------------------------


def generation_paths() -> tuple[Any, ...]:
    """Every way to generate, in the benchmark's order: the book's
    (`utils.generation.BOOK_PATHS`: no cache or its KV cache, compiled or
    not), then the fast decoder's (`utils.fast.PATHS`, imported on this
    first ask). Each has a `name`, a `summary`, `needs` ("cache",
    "compile", "native", "cpu"), `family` ("book" or "fast"), `int8`,
    `in_default_run`, `unavailable(device)`, `build(book_model,
    adopt=False)` and `stream(model, token_ids, max_new_tokens,
    eos_token_id, picker=None)` (`picker`: sampling instead of argmax).
    The benchmark's modes, the commands' switches and the panel's streamer
    all come here: a new way is one entry in one of the two tables."""
    from utils import generation
    from utils.fast import PATHS

    return (*generation.BOOK_PATHS, *PATHS)


def get_generation_path(name: str) -> Any:
    """The way to generate called `name` (a book path without importing
    `utils.fast`); ValueError naming the choices otherwise."""
    from utils import generation

    for path in generation.BOOK_PATHS:
        if path.name == name:
            return path
    paths = {path.name: path for path in generation_paths()}
    if name not in paths:
        raise ValueError(f"no way to generate {name!r}; choose from {', '.join(paths)}")
    return paths[name]


def choose_path(
    device: torch.device | str,
    *,
    cache: bool = True,
    compile: bool = False,
    fast: bool = False,
    int8: bool = False,
    say: Callable[[str], Any] | None = None,
) -> Any:
    """The way to generate that the switches mean on `device` (the
    commands' --no-cache, --compile, --fast and --int8; the panel's
    checkboxes): with `fast`, the fast decoder's pick (`utils.fast.path_for`:
    ValueError for int8 off the CPU; `say` hears why a native step is off);
    else the book's path with those needs."""
    if fast:
        from utils.fast import path_for

        return path_for(device, int8=int8, compile=compile, say=say)
    from utils import generation

    needs = {"cache"} if cache else set()
    needs |= {"compile"} if compile else set()
    return next(p for p in generation.BOOK_PATHS if p.needs == needs)


class GreedyStreamer:
    """Streams greedy token ids from one model on the chosen way to generate.

    The switches of `stream` (and `int8` here: the fast path with
    weight-only int8 layers) pick an entry of the one registry
    (`choose_path`), or `path` names one. What an entry builds is built on
    first use and kept, per builder: the book's two compiled paths share one
    `utils.compile.book_compile` (minutes once on a CPU), each fast path has
    its own fast model. `adopt=True` hands the book model's weights to the
    first model built (the command line's `--fast`: int8 can then free each
    bf16 matrix as it quantizes); `model` then names that model. Ctrl-C
    during that build is held until the new model is whole and kept, then
    stops the answer: the next one has a model to run.
    """

    def __init__(
        self, model: torch.nn.Module, int8: bool = False, adopt: bool = False
    ) -> None:
        self.model = model
        self.int8 = int8  # the fast path with weight-only int8 (approximate)
        self.adopt = adopt
        self._built: dict[Any, Any] = {}  # an entry's builder -> what it built

    def _model_for(self, path: Any) -> Any:
        if path.build not in self._built:
            adopt = self.adopt and not self._built
            # An adopting build empties the book model as it goes: Ctrl-C
            # waits until the new model is whole and kept (a second or two),
            # so the next answer has a model to run
            with ctrl_c_held() if adopt else contextlib.nullcontext():
                built = path.build(self.model, adopt=adopt)
                self._built[path.build] = built
                if adopt:
                    self.model = built
        return self._built[path.build]

    def built_for(self, name: str) -> Any:
        """What the way to generate `name` has built so far (None: nothing)."""
        return self._built.get(get_generation_path(name).build)

    def stream(
        self,
        token_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_id: int | None = None,
        cache: bool = True,
        compile: bool = False,
        fast: bool = False,
        kept: ChatCache | None = None,
        path: str | None = None,
        picker: Any = None,
    ) -> Iterator[int]:
        """Yield new token ids one at a time (batch of one), stopping at
        `eos_token_id` without yielding it. `kept`: a conversation's cache,
        continued (on a path with a cache: the book's or the fast one;
        without one, every step runs the whole sequence anyway and `kept` is
        cleared). `path`: a registry entry's name, instead of the switches.
        `picker`: picks each token instead of argmax (`utils.sampling`)."""
        if path is None:
            chosen = choose_path(
                token_ids.device, cache=cache, compile=compile, fast=fast,
                int8=self.int8,
            )  # fmt: skip
        else:
            chosen = get_generation_path(path)
        model = self._model_for(chosen)
        args = (token_ids, max_new_tokens, eos_token_id)
        if kept is not None and "cache" in chosen.needs:
            gen = kept.stream(model, *args, chosen.family == "fast", picker)
        else:
            if kept is not None:
                kept.clear()
            more = {} if picker is None else {"picker": picker}
            gen = chosen.stream(model, *args, **more)
        return _as_ints(gen)


def _as_ints(gen: Iterator[torch.Tensor]) -> Iterator[int]:
    try:
        for token in gen:
            yield int(token[0, 0])
    finally:
        gen.close()  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------


@dataclass
class StreamResult:
    """What one streamed generation produced and how long it took."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    elapsed_s: float = 0.0
    interrupted: bool = False  # Ctrl-C ended it
    stopped: bool = False  # `should_stop` ended it
    # seconds to the first token (the prefill); to the end if none came
    first_token_s: float | None = None
    stats: dict[str, Any] | None = None  # generate_stats, when asked for

    @property
    def tokens_per_sec(self) -> float:
        """Generated tokens per second; 0.0 when no time was measured."""
        if self.elapsed_s <= 0:
            return 0.0
        return len(self.token_ids) / self.elapsed_s


def stream_generation(
    streamer: Any,
    tokenizer: Any,
    prompt_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    write: Callable[[str], Any] | None = None,
    *,
    cache: bool = True,
    compile: bool = False,
    fast: bool = False,
    device: torch.device | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_token: Callable[[int], Any] | None = None,
    stats: str | None = None,
    kept: ChatCache | None = None,
    picker: Any = None,
) -> StreamResult:
    """Generate greedily from `prompt_ids`, writing text pieces as they become
    whole characters; return the ids, text, time and (`stats="print"` or
    `"quiet"`) the book's statistics. The time starts once the stream is
    made: building the fast path the first time is not counted.

    `on_token` sees each id before its text; `should_stop` is asked after each
    token; `kept` continues a conversation's cache (`GreedyStreamer.stream`);
    `picker` samples instead of taking the argmax (`utils.sampling`).
    Invalid inputs, and a prompt whose attention would not fit in memory,
    raise ValueError before anything is generated.
    """
    from utils.device import model_device, reset_peak_memory, synchronize

    if stats not in (None, "print", "quiet"):
        raise ValueError(f"stats must be None, 'print' or 'quiet', got {stats!r}")
    if device is None:
        device = model_device(getattr(streamer, "model", None))
    ids = _checked_prompt(streamer, prompt_ids, max_new_tokens, device, cache or fast)
    result = StreamResult()
    reset_peak_memory(device)
    # Making the stream builds the fast path the first time (and with
    # compile, compiles and picks, reported on stderr): set-up, not part
    # of the generation's time
    more = {} if kept is None else {"kept": kept}
    if picker is not None:
        more["picker"] = picker
    stream = streamer.stream(
        ids, max_new_tokens, eos_token_id, cache=cache, compile=compile, fast=fast,
        **more,
    )  # fmt: skip
    start = time.perf_counter()
    decoder = Utf8StreamDecoder(tokenizer)
    tail = _consume(stream, result, decoder, write, should_stop, on_token, start)
    synchronize(device)
    result.elapsed_s = time.perf_counter() - start
    if result.first_token_s is None:
        result.first_token_s = result.elapsed_s
    tail()
    if stats is not None:
        _add_stats(result, tokenizer, device, quiet=stats == "quiet")
    return result


def _checked_prompt(
    streamer: Any,
    prompt_ids: Sequence[int] | torch.Tensor,
    max_new_tokens: int,
    device: torch.device,
    cached: bool,
) -> torch.Tensor:
    """The prompt as a (1, n) tensor on `device`, after the checks that
    must fail before any work: inputs, and memory for the attention."""
    from utils.generation import check_generation_inputs
    from utils.models import check_prefill_fits

    if isinstance(prompt_ids, torch.Tensor):
        ids = prompt_ids.to(device)
    else:
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    model = getattr(streamer, "model", None)
    check_generation_inputs(model, ids, max_new_tokens)
    cfg = getattr(model, "cfg", None)
    if isinstance(cfg, dict) and "n_heads" in cfg:
        # without a cache every step runs the whole sequence again
        longest = ids.shape[1] + (0 if cached else max_new_tokens)
        check_prefill_fits(cfg, longest, device)
    return ids


def _consume(
    stream: Iterator[int],
    result: StreamResult,
    decoder: Utf8StreamDecoder,
    write: Callable[[str], Any] | None,
    should_stop: Callable[[], bool] | None,
    on_token: Callable[[int], Any] | None,
    start: float,
) -> Callable[[], None]:
    """Read the stream into `result`, writing text as it completes and
    noting when the first token came (`start`: the clock's reading at the
    beginning); Ctrl-C ends it early. Returns the call that writes what
    the decoder holds."""

    def emit(piece: str) -> None:
        if piece:
            result.text += piece
            if write is not None:
                write(piece)

    try:
        for token_id in stream:
            if not result.token_ids:
                result.first_token_s = time.perf_counter() - start
            result.token_ids.append(token_id)
            if on_token is not None:
                on_token(token_id)
            emit(decoder.feed(token_id))
            if should_stop is not None and should_stop():
                result.stopped = True
                break
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    return lambda: emit(decoder.flush())


def _add_stats(
    result: StreamResult, tokenizer: Any, device: torch.device, quiet: bool
) -> None:
    from utils.generation import generate_stats

    if result.token_ids:
        out = torch.tensor(result.token_ids, device=device)
        result.stats = generate_stats(
            out, tokenizer, 0.0, result.elapsed_s, quiet=quiet
        )
    elif not quiet:
        print("\n\nNo tokens generated (the model ended the text at once).")
