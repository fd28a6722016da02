"""Decoding speed on a busy machine: N other programs keep cores busy.

A laptop is rarely idle. This script starts `--busy N` CPU-bound processes
of its own (each a Python loop; they end when the script ends, also on
Ctrl-C or an error, and by themselves if it is killed), then times
decoding in each mode with the default thread setting, `--threads 1` and
`--threads <cores>`, and prints one table of decode tok/s (and, with
`--prompt-tokens N`, one of the prefill's tok/s for a prompt of N tokens):

    QWEN3_STANDIN=1 uv run python ch02/03_fast-decoding/busy_machine.py --busy 1

Each round runs one process that loads the model once, builds the modes
from it and times every mode under each setting in turn, the settings in
another order each round (`--rounds`); a cell is the median over the
rounds. The last column is the default
setting's speed as a share of the fastest fixed count's: 1.00 means the
default did as well as the best `--threads` the reader could have picked
for that moment. `--code PATH` adds rows measured with another checkout
of this repository (e.g. an older version), in the same rounds.

`--nice N` runs the timing at niceness N and `--busy-nice M` the busy
processes at M (added to the script's own): `--busy 1 --busy-nice 10
--nice 19` is a starved process, a program the OS gives only what a
busier one leaves, as a download or a build in the background does to a
reader who lowered the model's priority.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
MODES = ("kv_cache", "fast_native", "fast_native_int8")
PROMPT = [8, 5, 1, 13, 21, 3, 34, 2]  # token ids (any do: decode speed)
# One busy process: spins until told to stop, until its parent is gone, or
# after the bound, whichever comes first (checks about ten times a second)
BUSY = """
import os, sys, time
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
os.nice(int(sys.argv[3]))
while os.getppid() == parent and time.monotonic() < end:
    x = 0
    for i in range(200000):
        x += i
"""
BUSY_BOUND_S = 3 * 3600


def start_busy(n: int, nice: int = 0) -> list[subprocess.Popen]:
    """n CPU-bound processes, each bounded (see BUSY), `nice` added to
    their niceness."""
    args = [sys.executable, "-c", BUSY, str(os.getpid()), str(BUSY_BOUND_S),
            str(nice)]  # fmt: skip
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                          start_new_session=True))  # fmt: skip
    except BaseException:
        stop_busy(procs)
        raise
    return procs


def stop_busy(procs: list[subprocess.Popen]) -> None:
    """Kill the busy processes this script started and wait for them."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        proc.wait()


def _pin(threads: int | None, default: int) -> None:
    """The thread setting of the command line's `--threads` (None: none
    given). A checkout from before `utils.threads` had torch's count only."""
    import torch

    try:
        from utils.fast import pin_step_threads
    except ImportError:
        torch.set_num_threads(threads or default)
        return
    torch.set_num_threads(default)
    pin_step_threads(threads)


def _time_book(model: Any, ids: Any, n: int) -> tuple[float, float]:
    """(Prefill tok/s, decode tok/s) of the book's KV-cache generator: its
    first token, then the rest."""
    from reasoning_from_scratch.ch02 import generate_text_basic_stream_cache

    start = time.perf_counter()
    stream = generate_text_basic_stream_cache(model, ids, n + 1)
    next(stream)
    first = time.perf_counter()
    count = sum(1 for _ in stream)
    return ids.shape[1] / (first - start), count / (time.perf_counter() - first)


def _time_fast(model: Any, ids: Any, n: int) -> tuple[float, float]:
    """(Prefill tok/s, decode tok/s) of a fast model: its first token, then
    the rest, with a fresh native step (and so a fresh choice of threads)
    where it has one."""
    import torch

    from utils.fast import decode_one_token, prefill

    if model.decode_native():
        model.use_native_step()
    model.setup_cache(1, ids.shape[1] + n + 1)
    with torch.inference_mode():
        start = time.perf_counter()
        token, _ = prefill(model, ids)
        first = time.perf_counter()
        pos = ids.shape[1]
        for i in range(n):
            token, _ = decode_one_token(model, token, torch.tensor([pos + i]))
    return ids.shape[1] / (first - start), n / (time.perf_counter() - first)


def _models(modes: list[str]) -> dict[str, tuple[Any, Any]]:
    """{mode: (model, its timer)}: one book model loaded, the fast models
    built from it (bf16 weights shared; int8 ones quantized apart)."""
    import torch

    from utils.download import download_qwen3_small
    from utils.fast import get_path
    from utils.models import load_book_model_file

    files = download_qwen3_small("base", out_dir=None)  # or stand-ins
    book = load_book_model_file(files.model, "cpu", torch.bfloat16)
    return {
        mode: (book, _time_book) if mode == "kv_cache"
        else (get_path(mode).build(book), _time_fast)
        for mode in modes
    }  # fmt: skip


def prompt_for(prompt_tokens: int) -> list[int]:
    """The timed prompt's ids: PROMPT, or PROMPT repeated to `prompt_tokens`
    ids (made here, so an older checkout's worker times the same prompt)."""
    if not prompt_tokens:
        return list(PROMPT)
    import torch

    from utils.benchmark import synthetic_prompt

    return synthetic_prompt(torch.tensor([PROMPT]), prompt_tokens)[0].tolist()


def worker(spec: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """{"decode" / "prefill": {mode: {setting: tok/s}}}, each setting in
    spec's order timing every mode in turn (a first, untimed prefill per
    mode and setting when the prompt is long: the prefill is one call)."""
    import torch

    default = torch.get_num_threads()
    models = _models(spec["modes"])
    ids = torch.tensor([spec["prompt"]])
    speeds: dict[str, dict[str, dict[str, float]]] = {
        kind: {mode: {} for mode in models} for kind in ("prefill", "decode")
    }
    for setting in spec["settings"]:
        _pin(None if setting == "default" else int(setting), default)
        for mode, (model, timer) in models.items():
            if len(spec["prompt"]) > len(PROMPT):
                timer(model, ids, 2)  # warm: the first call of a shape
            got = timer(model, ids, spec["tokens"])
            speeds["prefill"][mode][setting], speeds["decode"][mode][setting] = got
    return speeds


def run_worker(code: Path | None, spec: dict[str, Any]) -> dict[str, Any]:
    """worker(spec) in a new process; with `code`: that checkout's utils."""
    env = dict(os.environ)
    if code is not None:
        paths = [str(code), *env.get("PYTHONPATH", "").split(os.pathsep)]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    nice = spec.get("nice", 0)  # set here: an older checkout's worker too
    proc = subprocess.run(
        [sys.executable, str(HERE), "--worker", json.dumps(spec)],
        capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )  # fmt: skip
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines() or ["no output"]
        raise RuntimeError(f"the timing process failed: {lines[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


Results = dict[tuple[str, str], dict[str, list[float]]]


def measure(
    codes: dict[str, Path | None],
    modes: list[str],
    settings: list[str],
    tokens: int,
    rounds: int,
    prompt_tokens: int = 0,
    nice: int = 0,
) -> dict[str, Results]:
    """{"decode" / "prefill": {(code label, mode): {setting: [tok/s per
    round]}}}; the codes' order and the settings' order change from round
    to round."""
    results: dict[str, Results] = {"prefill": {}, "decode": {}}
    prompt = prompt_for(prompt_tokens)
    for r in range(rounds):
        order = settings[r % len(settings) :] + settings[: r % len(settings)]
        for label in list(codes)[::-1] if r % 2 else list(codes):
            print(f"round {r + 1}/{rounds}: {label} ...", file=sys.stderr)
            spec = {"modes": modes, "settings": order, "tokens": tokens,
                    "prompt": prompt, "nice": nice}  # fmt: skip
            for kind, speeds in run_worker(codes[label], spec).items():
                for mode, got in speeds.items():
                    cell = results[kind].setdefault((label, mode), {})
                    for setting, speed in got.items():
                        cell.setdefault(setting, []).append(speed)
    return results


def table(
    results: Results, settings: list[str], busy: int, what: str = "decode"
) -> str:
    """The results as a markdown table: medians over the rounds, each with
    its spread (half the range, as a share of the median) when there were
    several rounds."""
    names = {"default": "default threads"} | {
        s: f"`--threads {s}`" for s in settings if s != "default"
    }
    head = ["code", "mode", *(names[s] for s in settings)]
    if "default" in settings and len(settings) > 1:
        head.append("default / best fixed")
    lines = [
        f"{busy} busy process(es); {what} tok/s, median of the rounds",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for (label, mode), cell in results.items():
        med = {s: statistics.median(cell[s]) for s in settings}
        row = [label, f"`{mode}`", *(_cell(cell[s], med[s]) for s in settings)]
        if len(head) > len(settings) + 2:
            best = max(v for s, v in med.items() if s != "default")
            row.append(f"{med['default'] / best:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)  # fmt: skip


def _cell(values: list[float], median: float) -> str:
    """'12.34' for one round, '12.34 ±5%' for several."""
    if len(values) < 2:
        return f"{median:.2f}"
    spread = (max(values) - min(values)) / 2 / median if median else 0.0
    return f"{median:.2f} ±{spread:.0%}"


def _parser():
    from utils.errors import CommandParser

    p = CommandParser(
        prog="busy_machine.py",
        description="Decoding speed with N busy processes of its own running.",
    )
    p.add_argument("--busy", type=int, default=1, help="busy processes to start")
    p.add_argument("--nice", type=int, default=0,
                   help="niceness added to the timing process (e.g. 19)")  # fmt: skip
    p.add_argument("--busy-nice", type=int, default=0,
                   help="niceness added to the busy processes (e.g. 10)")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=40, help="tokens per timing")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds; each cell is the median of its rounds")  # fmt: skip
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated modes")
    p.add_argument("--threads", default=None, help="settings to time, e.g. "
                   "default,1,2 (default: default, 1 and the core count)")  # fmt: skip
    p.add_argument("--prompt-tokens", type=int, default=0,
                   help="also time the prefill of a prompt of N tokens")  # fmt: skip
    p.add_argument("--code", type=Path, action="append", default=None,
                   help="another checkout of this repository, timed too "
                   "(repeatable; default: this checkout only)")  # fmt: skip
    return p


def _check(args) -> list[str]:
    """The settings to time; UsageError for bad arguments."""
    from utils.errors import UsageError

    if not 0 <= args.busy <= 64:
        raise UsageError("--busy must be between 0 and 64")
    if not (0 <= args.nice <= 19 and 0 <= args.busy_nice <= 19):
        raise UsageError("--nice and --busy-nice must be between 0 and 19")
    if args.max_new_tokens < 2 or args.rounds < 1:
        raise UsageError("--max-new-tokens must be at least 2 and --rounds at least 1")
    if not 0 <= args.prompt_tokens <= 4096:
        raise UsageError("--prompt-tokens must be between 0 and 4096")
    for code in args.code or []:
        if not (code / "utils" / "fast").is_dir():
            raise UsageError(f"--code {code}: not a checkout of this repository")
    settings = (args.threads or f"default,1,{os.cpu_count() or 1}").split(",")
    settings = list(dict.fromkeys(s.strip() for s in settings))
    if not all(s == "default" or (s.isdigit() and int(s) > 0) for s in settings):
        raise UsageError(
            "--threads takes 'default' and positive counts, e.g. default,1,2"
        )
    return settings


def _run(args) -> int:
    settings = _check(args)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    codes: dict[str, Path | None] = {"this": None}
    codes |= {str(c): c.resolve() for c in args.code or []}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so finally runs
    busy = start_busy(args.busy, args.busy_nice)
    try:
        results = measure(codes, modes, settings, args.max_new_tokens,
                          args.rounds, args.prompt_tokens, args.nice)  # fmt: skip
    finally:
        stop_busy(busy)
    if args.nice or args.busy_nice:
        print(f"timed at nice {args.nice}, busy processes at nice {args.busy_nice}")
    print(table(results["decode"], settings, args.busy))
    if args.prompt_tokens:
        what = f"{args.prompt_tokens}-token prefill"
        print("\n" + table(results["prefill"], settings, args.busy, what))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # one mode, in its own process
        print(json.dumps(worker(json.loads(argv[1]))))
        return 0
    from utils.errors import run_command

    args = _parser().parse_args(argv)
    return run_command("busy_machine.py", lambda: _run(args))


if __name__ == "__main__":
    raise SystemExit(main())
