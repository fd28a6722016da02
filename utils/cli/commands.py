"""Command line: `qwen3-generate` (one prompt) and `qwen3-chat` (a REPL).

Both load the book's Qwen3 0.6B files through `utils.download` (stand-ins with
QWEN3_STANDIN=1) and stream text with `utils.streaming.stream_generation`, so
a character split across tokens is printed only once it is complete and an id
the tokenizer does not know shows as `<unk:ID>`. Generated text goes to
stdout, so `qwen3-generate ... > answer.txt` keeps only the answer; progress,
the stand-in banner and statistics go to stderr. Errors follow
`utils.errors`: one `<prog>: error: ...` line on stderr (a failed download
adds its list of sources and what to try), exit status 2 for what the user
can fix, never a traceback; a closed stdin or stdout is named up front, and
a reader that stops early (`| head`) ends the command quietly. Progress and
diagnostics go through the `utils` logger (stderr); the statistics and the
chat's own lines are the command's output on stderr. Output to a file or a
pipe is UTF-8 whatever the locale's code page (`utils.stdio`). In the
chat, a typed line that cannot be read or encoded is reported and skipped;
the conversation goes on. Input from a file or a pipe is read as UTF-8,
or as UTF-16 or UTF-32 where it starts with their byte-order mark
(Notepad's "Unicode"); input that is not text ends the chat with one line
naming the byte and the fix.

    python -m utils.cli generate --prompt "Explain large language models."
    python -m utils.cli chat --think
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from utils.cli.options import add_sampling_options, sampling_from
from utils.errors import (
    CommandParser,
    OutputError,
    UsageError,
    ctrl_c_held,
    first_line,
    require_streams,
    run_command,
    utf8_text,
    write_stdout,
)
from utils.log import get_logger
from utils.qwen3_tokenizer import IM_END_ID
from utils.stdio import InputEncodingError, InputLines, utf8_streams

LOG_NAME = "utils.cli"  # not __name__, which is "__main__" under python -m
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"
STANDIN_TOKENS = 30  # an answer's default length with stand-in weights


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def model_options(p: argparse.ArgumentParser) -> None:
    """The options that say which model files to load, where and how to run
    them: what every command takes (`load` reads them)."""
    p.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA, then MPS, XPU, CPU), cpu, cuda, cuda:N, mps, xpu",
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help="use the static-KV-cache fast path in utils.fast (on x86-64 and AArch64 "
        "CPUs each token is one native C call: no compile, close to but not "
        "bit-equal with the book's numbers)",
    )
    p.add_argument(
        "--int8",
        action="store_true",
        help="with --fast: weight-only int8 linear layers (about twice as "
        "fast on a CPU, about half the memory; approximate: tokens can "
        "differ from bf16's)",
    )
    p.add_argument(
        "--out-dir",
        default=None,
        help="folder to put the model files in (hard links to the verified "
        "copies in the per-user model store, downloaded once); default: the "
        "store itself, ~/.cache/qwen3-ch02/models or QWEN3_MODEL_STORE",
    )
    p.add_argument("--model-file", type=Path, help="use this .pth file directly")
    p.add_argument("--tokenizer-file", type=Path, help="use this tokenizer .json")
    p.add_argument(
        "--threads",
        type=_positive_int,
        help="CPU threads for torch and the native decode step (default: "
        "torch's choice, one per core, of which the native step runs on as "
        "many as prove fastest); fewer, even 1, can be faster on a machine "
        "busy with other work",
    )


def _add_common(p: argparse.ArgumentParser, default_tokens: int) -> None:
    model_options(p)
    p.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        default=None,
        help=f"most tokens to generate per answer (default: {default_tokens}; "
        f"{STANDIN_TOKENS} with stand-in weights, whose answers never end by "
        "themselves)",
    )
    p.set_defaults(answer_tokens=default_tokens)
    p.add_argument(
        "--cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="use the KV cache",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model first, the book's way (warm-up takes "
        "minutes on a CPU); with --fast: the fastest kind that runs here "
        "(the native step where it runs, else the compiled transformer block)",
    )


def _answer_length(args: argparse.Namespace, standin: bool) -> int:
    """--max-new-tokens, else the command's default; with stand-in weights
    (random: they never write the end-of-sequence token, so every answer
    runs to the limit, an hour of 1,024 tokens on a slow machine) a short
    one, said beside the stand-in banner."""
    if args.max_new_tokens is not None:
        return args.max_new_tokens
    if not standin:
        return args.answer_tokens
    get_logger(LOG_NAME).warning(
        f"stand-in weights never end an answer: each stops after "
        f"{STANDIN_TOKENS} tokens (--max-new-tokens N for longer ones)"
    )
    return STANDIN_TOKENS


def _say(text: str) -> None:
    """The command's own lines on stderr (statistics, the chat's replies to
    its commands): output for the reader, not diagnostics."""
    print(text, file=sys.stderr, flush=True)


def _import_torch() -> None:
    """Import torch (seconds) with Ctrl-C held until it is done: its C++
    half may abort the process or swallow an interrupt raised inside it
    (`utils.errors.ctrl_c_held`); after it, Ctrl-C ends the command with
    one line, exit status 130."""
    with ctrl_c_held():
        import torch  # noqa: F401


def _set_threads(threads: int | None) -> None:
    """torch's CPU thread count, and the native decode step's: exactly
    `threads` (None: torch's choice, and the native step picks how many of
    those it runs on step by step, `utils.fast.native.ThreadChoice`)."""
    if threads is not None:
        from utils.fast import pin_step_threads

        pin_step_threads(threads)


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------


@dataclass
class Loaded:
    """What both commands work with: tokenizer, model, device, streamer
    (`model` is the fast model with --fast, the book's model otherwise)."""

    tokenizer: Any
    model: Any
    device: Any
    streamer: Any
    standin: bool


def _resolve_device(name: str) -> Any:
    from utils.device import resolve_device

    try:
        with contextlib.redirect_stdout(sys.stderr):
            return resolve_device(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _check_fast(fast: bool, cache: bool, int8: bool) -> None:
    if int8 and not fast:
        raise UsageError("--int8 works on the fast path only; add --fast.")
    if fast and not cache:
        raise UsageError("--fast always uses its static KV cache; drop --no-cache.")


def _files(args: argparse.Namespace, kind: str) -> tuple[Path, Path, bool]:
    """Paths of tokenizer and weights: given explicitly, or via download."""
    from utils.download import DownloadError, download_qwen3_small, local_files

    if (args.model_file is None) != (args.tokenizer_file is None):
        raise UsageError("give both --model-file and --tokenizer-file, or neither.")
    if args.model_file is not None:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                model, tokenizer, standin = local_files(
                    args.model_file, args.tokenizer_file
                )
        except FileNotFoundError as exc:
            raise UsageError(str(exc)) from None
        assert tokenizer is not None
        return tokenizer, model, standin
    where = _files_where(args, kind)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            files = download_qwen3_small(kind, out_dir=args.out_dir)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except DownloadError as exc:  # its sources and hints are the useful part
        raise UsageError(f"{where}:\n{exc}") from None
    except Exception as exc:  # network, disk: say what failed in one line
        raise UsageError(f"{where}: {first_line(exc)}") from None
    assert files.model is not None
    return files.tokenizer, files.model, files.standin


def _files_where(args: argparse.Namespace, kind: str) -> str:
    """What failed, naming the folder the files were to go to: the stand-in
    folder in stand-in mode, else the store or --out-dir."""
    from utils.download import standin_enabled, standin_files_dir, store_dir

    if standin_enabled():
        folder = standin_files_dir()
        return f"could not make the {kind} stand-in files in {folder}/"
    folder = store_dir() if args.out_dir is None else args.out_dir
    store = "the store " if args.out_dir is None else ""
    return f"could not get the {kind} model files into {store}{folder}/"


def _bad_file_fix(args: argparse.Namespace, option: str) -> str:
    """What to do about a file that does not load: one the reader named is
    theirs to replace; a downloaded one is fetched again once deleted."""
    if getattr(args, option.removeprefix("--").replace("-", "_"), None) is not None:
        return f"pass the book's file with {option}"
    return "delete it and run again to download it again"


def _load_model(args: argparse.Namespace, path: Path, device: Any) -> Any:
    """The book's model (`utils.models.load_book_model`: the checkpoint's
    tensors memory-mapped, not copied); one UsageError line for a bad file
    or for --fast options that cannot run on this device."""
    from utils import models
    from utils.streaming import choose_path

    try:  # switches that cannot work here fail before loading
        choose_path(
            device, cache=args.cache, compile=args.compile, fast=args.fast,
            int8=args.int8, say=lambda _: None,
        )  # fmt: skip
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        state_dict = models.read_checkpoint(path)
        return models.load_book_model(state_dict, device)
    except models.CheckpointError as exc:
        raise UsageError(
            f"could not load the model weights from {path} ({exc}); the file is "
            "damaged or not a Qwen3 0.6B checkpoint: "
            f"{_bad_file_fix(args, '--model-file')}."
        ) from None


def load(args: argparse.Namespace, kind: str, **tokenizer_kwargs: Any) -> Loaded:
    """Resolve the device, get the files and load tokenizer and model, turning
    every failure into a one-line `UsageError`."""
    from reasoning_from_scratch.qwen3 import Qwen3Tokenizer

    from utils.streaming import GreedyStreamer

    device = _resolve_device(args.device)
    _check_fast(args.fast, args.cache, args.int8)
    tok_path, model_path, standin = _files(args, kind)
    try:
        tokenizer = Qwen3Tokenizer(str(tok_path), **tokenizer_kwargs)
    except Exception as exc:
        raise UsageError(
            f"could not read the tokenizer file {tok_path} ({first_line(exc)}); "
            f"{_bad_file_fix(args, '--tokenizer-file')}."
        ) from None
    get_logger(LOG_NAME).info(f"loading {model_path} ...")
    model = _load_model(args, model_path, device)
    # with --fast the fast model takes the weights over (int8 frees bf16's)
    streamer = GreedyStreamer(model, int8=args.int8, adopt=args.fast)
    return Loaded(tokenizer, model, device, streamer, standin)


# --------------------------------------------------------------------------
# qwen3-generate
# --------------------------------------------------------------------------


def generate_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="qwen3-generate",
        description="Generate text with Qwen3 0.6B (greedy, or sampled with "
        "--temperature), streaming it as it comes, then print time, tokens/sec "
        "and peak memory.",
    )
    p.add_argument(
        "--prompt", required=True, type=utf8_text, help="the text to continue"
    )
    _add_common(p, default_tokens=100)
    p.add_argument(
        "--reasoning",
        action="store_true",
        help="use the reasoning model and its chat template",
    )
    p.add_argument(
        "--thinking",
        action="store_true",
        help="with --reasoning: let the model think (no empty <think> block)",
    )
    p.add_argument(
        "--print-ids",
        action="store_true",
        help="after the stats, print the generated token ids on one line",
    )
    add_sampling_options(p)
    p.add_argument(
        "--num-samples",
        type=_positive_int,
        default=1,
        help="answers to the prompt, decoded together as one batch and "
        "printed as each ends (with --fast: each the text it gets alone)",
    )
    return p


def _generate(argv: Sequence[str] | None) -> int:
    require_streams("stdout")
    args = generate_parser().parse_args(argv)
    if not args.prompt.strip():
        raise UsageError("the prompt is empty; pass some text with --prompt.")
    if args.thinking and not args.reasoning:
        raise UsageError("--thinking only applies with --reasoning.")
    kind = "reasoning" if args.reasoning else "base"
    _import_torch()
    tok_kwargs = {}
    if args.reasoning:
        tok_kwargs = dict(
            apply_chat_template=True,
            add_generation_prompt=True,
            add_thinking=args.thinking,
        )
    sampling = sampling_from(args)
    _set_threads(args.threads)
    run = load(args, kind, **tok_kwargs)
    args.max_new_tokens = _answer_length(args, run.standin)
    try:
        prompt_ids = run.tokenizer.encode(args.prompt)
    except Exception as exc:  # the tokenizer's own limits
        raise UsageError(f"could not encode the prompt ({first_line(exc)}).") from None
    if args.num_samples > 1:
        return _print_samples(args, run, prompt_ids, sampling)
    picker = None if sampling.greedy else sampling.picker()
    result = _stream_answer(args, run, prompt_ids, picker)
    write_stdout("\n")
    if result.interrupted:
        get_logger(LOG_NAME).info("stopped (Ctrl-C): the answer is cut short")
    if result.stats:
        from utils.generation import stats_lines

        _say("\n" + "\n".join(stats_lines(result.stats, decimal_below=10)))
    else:
        _say("\nNo tokens generated (the model ended the text at once).")
    if args.print_ids:
        print("Token ids:", " ".join(map(str, result.token_ids)), flush=True)
    return 0


def _stream_answer(
    args: argparse.Namespace, run: Loaded, prompt_ids: list, picker: Any = None
) -> Any:
    """Stream the answer to stdout; the statistics come back, unprinted."""
    from utils.streaming import stream_generation

    if args.compile:
        get_logger(LOG_NAME).info("compiling: the first tokens take a while ...")
    try:
        return stream_generation(
            run.streamer,
            run.tokenizer,
            prompt_ids,
            args.max_new_tokens,
            run.tokenizer.eos_token_id,
            write_stdout,
            cache=args.cache,
            compile=args.compile,
            fast=args.fast,
            device=run.device,
            stats="quiet",
            picker=picker,
        )
    except ValueError as exc:  # does not fit: checked before any work
        raise UsageError(str(exc)) from None


def _print_samples(args, run: Loaded, prompt_ids: list, sampling: Any) -> int:
    """--num-samples: the samples decoded as one batch (`utils.batch`'s
    engines), each printed whole as it ends, then the total speed."""
    import time

    from utils.batch import BookEngine, FastEngine
    from utils.fast import Request
    from utils.streaming import decode_bytes

    if sampling.greedy:
        get_logger(LOG_NAME).warning("--temperature 0: every sample is the same")
    if len(prompt_ids) + args.max_new_tokens > run.model.cfg["context_length"]:
        raise UsageError("the prompt and --max-new-tokens do not fit the context.")
    engine = FastEngine.for_run(run, args.int8) if args.fast else BookEngine(run)
    requests = [Request(k, prompt_ids, args.max_new_tokens, sampling.picker(0, k))
                for k in range(args.num_samples)]  # fmt: skip
    got: dict[int, list[int]] = {k: [] for k in range(args.num_samples)}
    start = time.perf_counter()
    eos = run.tokenizer.eos_token_id
    for event in engine.events(requests, args.num_samples, eos):
        if event.token is not None:
            got[event.key].append(event.token)
            continue
        text = decode_bytes(run.tokenizer, got[event.key])
        write_stdout(f"--- sample {event.key + 1} ({event.reason}) ---\n{text}\n")
    made, seconds = sum(map(len, got.values())), time.perf_counter() - start
    _say(f"\n{args.num_samples} samples, {made} tokens in {seconds:.2f} sec: "
         f"{made / seconds:.1f} tokens/sec in total")  # fmt: skip
    return 0


def generate_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `qwen3-generate` (output in UTF-8: `utils.stdio`)."""
    utf8_streams()
    return run_command("qwen3-generate", lambda: _generate(argv))


# --------------------------------------------------------------------------
# qwen3-chat
# --------------------------------------------------------------------------


@dataclass
class ChatSession:
    """A multi-turn conversation in the Qwen3 chat format.

    `messages` holds (role, text) pairs for /history; `ids` the conversation
    as token ids, each turn `<|im_start|>role\\n...<|im_end|>\\n`. An answer
    keeps the ids it was generated as (its text is never encoded again),
    after the opening it was given: with thinking, only the ids after its
    `</think>`, as Qwen3's own template keeps them; without, its empty think
    block too (the tokens the model saw: where the template drops it, every
    turn would prefill the last answer again). `kept` holds the KV cache of
    `ids` between turns, so a turn prefills only its own tokens, and only
    from the earlier answer on where thinking was dropped
    (`utils.chat_cache`).
    """

    tokenizer: Any
    streamer: Any
    device: Any
    context_length: int
    max_new_tokens: int
    thinking: bool = False
    cache: bool = True
    compile: bool = False
    fast: bool = False
    messages: list[tuple[str, str]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    kept: Any = None  # a utils.chat_cache.ChatCache, made with the session
    picker: Any = None  # samples the answers (utils.sampling); None: greedy

    def __post_init__(self) -> None:
        if self.kept is None:
            from utils.chat_cache import ChatCache

            self.kept = ChatCache()

    def turn_ids(self, user_text: str) -> list[int]:
        """The ids a new user turn adds: the message and the opening of the
        assistant's answer."""
        text = f"{IM_START}user\n{user_text}{IM_END}\n{IM_START}assistant\n"
        return self.encode(text if self.thinking else text + EMPTY_THINK)

    def render(self, user_text: str | None = None) -> str:
        """The conversation as chat-format text, optionally with a new user
        turn and the opening of the assistant's answer."""
        ids = self.ids if user_text is None else self.ids + self.turn_ids(user_text)
        return self.tokenizer.decode(ids)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, chat_wrapped=False))

    def history_tokens(self) -> int:
        return len(self.ids)

    def clear(self) -> None:
        """Forget the conversation and free its KV cache."""
        self.messages.clear()
        self.ids.clear()
        self.kept.clear()

    def _kept_answer(self, answer: list[int]) -> list[int]:
        """The ids of an answer as the conversation keeps them: after its
        last `</think>` and the newlines that follow, if it has one."""
        end = self.encode("</think>")
        starts = [i for i in range(len(answer)) if answer[i : i + len(end)] == end]
        if not starts:
            return list(answer)
        rest = answer[starts[-1] + len(end) :]
        while rest and not self.tokenizer.decode(rest[:1]).strip("\n"):
            rest = rest[1:]
        return rest

    def reply(self, user_text: str, write: Callable[[str], Any]) -> dict[str, Any]:
        """Generate the answer to `user_text`, passing text pieces to `write`;
        returns counts and the time to the first token. The answer stops
        where it and the tokens closing its turn fill the context length;
        Ctrl-C ends it early and keeps what was said. Raises UsageError
        (conversation unchanged) when it cannot fit."""
        from utils.streaming import stream_generation

        try:
            prompt = self.ids + self.turn_ids(user_text)
        except Exception as exc:  # e.g. text the tokenizer cannot take
            raise UsageError(
                f"could not encode that message ({first_line(exc)}); "
                "it was not sent, type another one."
            ) from None
        closing = [IM_END_ID, *self.encode("\n")]  # what ends the answer's turn
        room = self.context_length - len(prompt) - len(closing)
        if room < 1:
            raise UsageError(
                f"the conversation would be {len(prompt) + 1 + len(closing)} tokens, "
                f"over the context length of {self.context_length}; type /clear "
                "to start over (or send a shorter message)."
            )
        budget = min(self.max_new_tokens, room)
        try:
            result = stream_generation(
                self.streamer,
                self.tokenizer,
                prompt,
                budget,
                IM_END_ID,
                write,
                cache=self.cache,
                compile=self.compile,
                fast=self.fast,
                device=self.device,
                kept=self.kept,
                picker=self.picker,
            )
        except ValueError as exc:  # too long for memory: checked before work
            raise UsageError(str(exc)) from None
        answer = result.token_ids
        stopped = "stopped" if result.interrupted else None
        if stopped is None and len(answer) == budget and budget < self.max_new_tokens:
            stopped = "context length reached"
        content = self._kept_answer(answer)
        # The tokenizer's own decode (it drops ids it does not know)
        text = self.tokenizer.decode(content)
        self.messages += [("user", user_text), ("assistant", text)]
        self.ids = prompt + content + closing
        # room for a next turn of up to 256 tokens and its answer
        self.kept.reserve(len(self.ids) + 256 + self.max_new_tokens)
        return {
            "prompt_tokens": len(prompt),
            "answer_tokens": len(answer),
            "answer_ids": answer,
            "tokens_per_sec": result.tokens_per_sec,
            "first_token_s": result.first_token_s,
            "stopped": stopped,
        }


def chat_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="qwen3-chat",
        description="Chat with the Qwen3 0.6B reasoning model. Reads one message "
        "per line from stdin (a file or a pipe: UTF-8, or UTF-16/UTF-32 with a "
        "byte-order mark, as Notepad's 'Unicode'). Commands: /think, /no_think, "
        "/clear, /history, /help, /quit (or end of input). Ctrl-C stops the "
        "current answer.",
    )
    _add_common(p, default_tokens=1024)
    add_sampling_options(p)
    p.add_argument(
        "--think",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="let the model think before answering (off as in the book's "
        "tokenizer; toggle with /think and /no_think)",
    )
    p.add_argument(
        "--context-length",
        type=_positive_int,
        help="most tokens the conversation may hold (none: the model's); an "
        "answer stops where it and the tokens that close its turn fill them",
    )
    return p


CHAT_HELP = (
    "Commands: /think and /no_think switch thinking, /clear forgets the "
    "conversation, /history shows it, /quit leaves (so does Ctrl-D). "
    "Ctrl-C stops an answer."
)


class BadLine(Exception):
    """A line of input that could not be read as text."""


def _read_line(lines: InputLines, prompt: str) -> str | None:
    """One line of the chat's input (None at its end); prompts only on a
    tty. On a tty, raises BadLine for bytes the terminal's encoding cannot
    read (the reader types the line again). A file or pipe is read as
    UTF-8, UTF-16 or UTF-32 with a byte-order mark, or PYTHONIOENCODING's
    encoding (`utils.stdio.InputLines`): one that is not text ends the chat
    with one `UsageError` line, a file before its first answer."""
    if lines.stream.isatty():
        try:
            return input(prompt)
        except EOFError:
            return None
        except UnicodeDecodeError as exc:
            raise BadLine(_bad_bytes(exc)) from None
    try:
        return lines.readline()
    except InputEncodingError as exc:
        raise UsageError(str(exc)) from None


def _bad_bytes(exc: UnicodeDecodeError) -> str:
    """The line for a typed line the terminal's encoding cannot read."""
    bad = exc.object[exc.start : exc.end]
    return (
        f"that line is not {exc.encoding} text (bytes {bad!r} at position "
        f"{exc.start}); it was skipped. Set the terminal to UTF-8 and type it "
        "again."
    )


def _show_history(session: ChatSession, out: TextIO) -> None:
    for role, text in session.messages:
        print(f"{role}: {text}", file=out)
    print(
        f"[history: {len(session.messages)} messages, "
        f"{session.history_tokens()} tokens]",
        file=out,
        flush=True,
    )


def _chat(argv: Sequence[str] | None) -> int:
    require_streams("stdin", "stdout")
    lines = InputLines(sys.stdin)
    args = chat_parser().parse_args(argv)
    _import_torch()
    sampling = sampling_from(args)
    _set_threads(args.threads)
    run = load(args, "reasoning")
    args.max_new_tokens = _answer_length(args, run.standin)
    model_context = run.model.cfg["context_length"]
    context = args.context_length or model_context
    if context > model_context:
        raise UsageError(
            f"--context-length {context} is more than the model's {model_context}."
        )
    session = ChatSession(
        tokenizer=run.tokenizer,
        streamer=run.streamer,
        device=run.device,
        context_length=context,
        max_new_tokens=args.max_new_tokens,
        thinking=args.think,
        cache=args.cache,
        compile=args.compile,
        fast=args.fast,
        picker=None if sampling.greedy else sampling.picker(),
    )
    _say(f"Qwen3 0.6B chat (thinking {'on' if session.thinking else 'off'}). ")
    _say(CHAT_HELP)
    while True:
        try:
            line = _read_line(lines, "You: ")
        except KeyboardInterrupt:
            _say("\n(Ctrl-D or /quit leaves)")
            continue
        except BadLine as exc:
            _say(f"qwen3-chat: {exc}")
            continue
        if line is None or not _chat_line(session, line.strip()):
            return 0


def _chat_line(session: ChatSession, message: str) -> bool:
    """Act on one line of the chat; False when it asks to leave."""
    command = message.lower()
    if not message:
        return True
    if command in ("/quit", "/exit"):
        return False
    if command == "/help":
        _say(CHAT_HELP)
    elif command == "/clear":
        session.clear()
        _say("[conversation cleared]")
    elif command == "/history":
        _show_history(session, sys.stdout)
    elif command in ("/think", "/no_think"):
        session.thinking = command == "/think"
        _say(f"[thinking {'on' if session.thinking else 'off'}]")
    elif message.startswith("/") and " " not in message:
        _say(f"unknown command {message}; {CHAT_HELP}")
    else:
        _answer(session, message)
    return True


def _answer(session: ChatSession, message: str) -> None:
    """The assistant's answer on stdout, its statistics on stderr."""
    write_stdout("Assistant: ")
    try:
        info = session.reply(message, write_stdout)
    except OutputError:
        raise
    except UsageError as exc:
        write_stdout("\n")
        _say(f"qwen3-chat: {exc}")
        return
    except KeyboardInterrupt:
        write_stdout("\n")
        _say("[stopped]")
        return
    write_stdout("\n")
    note = f"; {info['stopped']}" if info["stopped"] else ""
    _say(
        f"[prompt {info['prompt_tokens']} tokens, answer "
        f"{info['answer_tokens']} tokens, first token "
        f"{info['first_token_s']:.2f} s, "
        f"{info['tokens_per_sec']:.1f} tokens/sec; conversation "
        f"{session.history_tokens()}/{session.context_length} tokens{note}]"
    )


def chat_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `qwen3-chat` (output in UTF-8: `utils.stdio`)."""
    utf8_streams()
    return run_command("qwen3-chat", lambda: _chat(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m utils.cli generate|chat ...`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"generate": generate_main, "chat": chat_main}
    if not argv or argv[0] not in commands:
        print(
            "usage: python -m utils.cli {generate,chat} [options] (see --help of each)",
            file=sys.stderr,
        )
        return 2
    return commands[argv[0]](argv[1:])
