"""Threads on a busy machine: the native step's choice of thread count
(utils/threads.py, by injected step times), its team's barrier with a
peer that is not running (the test build's late thread), and the bonus
script that reproduces the busy-machine table (its busy processes always
end)."""

from __future__ import annotations

import importlib.util
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import utils.fast.build as build
import utils.fast.threads as threads_module
from tests.tiny import PROMPT, fast_model, tiny_config, tiny_state_dict
from utils.errors import UsageError
from utils.fast import decode_one_token, prefill
from utils.fast.threads import ThreadChoice, pin_step_threads, thread_candidates

BONUS = Path(__file__).resolve().parents[2] / "ch02" / "03_fast-decoding"
needs_kernels = pytest.mark.skipif(
    build.unsupported_reason() is not None,
    reason="the native step needs the C kernels (x86-64 with AVX2, or AArch64)",
)


# ---------------------------------------------------------------------------
# The choice, by injected step times


def test_candidates_are_every_core_one_fewer_and_halves():
    assert thread_candidates(1) == [1]
    assert thread_candidates(2) == [2, 1]
    assert thread_candidates(4) == [4, 3, 2, 1]
    assert thread_candidates(16) == [16, 15, 8, 4, 2, 1]


def run_steps(choice, most, seconds, steps):
    """The counts `choice` picks over `steps` steps, each step taking
    seconds(count, step) seconds."""
    picked = []
    for i in range(steps):
        n = choice.next(most)
        picked.append(n)
        choice.record(n, seconds(n, i))
    return picked


def test_a_busy_core_moves_the_step_to_one_thread_and_it_rarely_looks_back():
    # two threads 10x slower than one: a peer descheduled at every barrier
    picked = run_steps(ThreadChoice(), 2, lambda n, _: 0.3 if n == 2 else 0.03, 400)
    assert picked[:3] == [2, 2, 1]  # a warm-up step, then each count once
    assert picked[3:10] == [1] * 7
    tries = picked[3:].count(2)
    assert 1 <= tries <= 400 // (16 * 10) + 1  # rechecked, rarely
    # the time lost to rechecks stays far below the 0.8x the issue asks
    spent = sum(0.3 if n == 2 else 0.03 for n in picked[3:])
    assert spent / (0.03 * len(picked[3:])) < 1.1


def test_on_a_quiet_machine_every_core_runs_and_one_thread_is_rechecked():
    picked = run_steps(ThreadChoice(), 2, lambda n, _: 0.02 if n == 2 else 0.035, 200)
    assert picked[3:].count(2) > 0.9 * len(picked[3:])
    assert picked[3:].count(1) >= 2  # still tried now and then


def test_the_choice_follows_the_machine_when_the_other_program_ends():
    def seconds(n, step):  # busy for the first 100 steps, then quiet
        busy = step < 100
        return {1: 0.03, 2: 0.3 if busy else 0.018}[n]

    picked = run_steps(ThreadChoice(), 2, seconds, 300)
    assert picked[50:100].count(1) >= 48
    assert picked[-100:].count(2) >= 95  # back to both cores


def test_the_middle_count_wins_on_four_cores_with_one_taken():
    def seconds(n, _):
        return {4: 0.2, 3: 0.02, 2: 0.028, 1: 0.05}[n]

    picked = run_steps(ThreadChoice(), 4, seconds, 300)
    assert picked[:5] == [4, 4, 3, 2, 1]
    assert picked[-100:].count(3) >= 90


def test_a_new_torch_thread_count_starts_the_choice_again():
    choice = ThreadChoice()
    run_steps(choice, 2, lambda n, _: 0.3 if n == 2 else 0.03, 20)
    assert choice.next(2) == 1
    assert choice.next(4) == 4  # a fresh start with torch's new count
    assert choice.next(1) == 1


def test_pinning_sets_torchs_count_and_is_undone_by_none(unpinned):
    pin_step_threads(1)
    assert torch.get_num_threads() == 1 and threads_module.pinned_threads() == 1
    pin_step_threads(None)
    assert torch.get_num_threads() == 1 and threads_module.pinned_threads() is None
    with pytest.raises(ValueError, match="at least 1"):
        pin_step_threads(0)


# ---------------------------------------------------------------------------
# The native step: the count it runs on, and its team with a late peer

SPLIT = tiny_config(
    emb_dim=256, hidden_dim=512, head_dim=64, context_length=64,
    dtype=torch.bfloat16,
)  # fmt: skip


class Recording:
    """The library, its decode step's thread count recorded."""

    def __init__(self, lib):
        self.lib, self.threads = lib, []

    def qwen3_decode_step(self, *args):
        self.threads.append(args[-1])
        return self.lib.qwen3_decode_step(*args)


def native_split_model(kernels, monkeypatch, int8=False):
    import utils.fast.native as native_module
    from utils.fast import quantize_int8

    monkeypatch.setattr(native_module, "get_kernels", lambda: kernels)
    model = fast_model(SPLIT, tiny_state_dict(14, SPLIT))
    if int8:
        model = quantize_int8(model)
    assert model.use_native_step() and model.decode_native()
    return model


def steps(model, n):
    model.setup_cache(1, 40)
    prefill(model, torch.arange(1, 31).view(1, -1))
    with torch.inference_mode():
        for i in range(n):
            decode_one_token(model, PROMPT[:, :1], torch.tensor([30 + i % 8]))


@needs_kernels
def test_the_native_step_runs_on_the_choice_or_the_pinned_count(
    kernels, monkeypatch, unpinned
):
    model = native_split_model(kernels, monkeypatch)
    step = model.decode_step
    recording = Recording(kernels.lib)
    monkeypatch.setattr(step, "_kernels", type("K", (), {"lib": recording})())
    torch.set_num_threads(2)
    monkeypatch.setattr(step.threads, "next", lambda most: 7 if most == 2 else -1)
    steps(model, 3)
    assert recording.threads == [7, 7, 7]  # the choice's count, given torch's
    pin_step_threads(1)
    steps(model, 2)
    assert recording.threads[3:] == [1, 1]
    assert step.threads.steps >= 4  # every step's time was recorded


@needs_kernels
@pytest.mark.skipif(
    not hasattr(resource, "RUSAGE_THREAD"), reason="Linux's per-thread rusage"
)
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_a_team_waiting_for_a_late_peer_sleeps_instead_of_spinning(
    int8, test_kernels, monkeypatch, unpinned
):
    """The last thread of the step's team sleeps 3 ms before its part of
    every product, attention and SwiGLU (the test build's hook), as a
    thread the OS descheduled would be away. The first thread (the caller's)
    takes the late one's passes and then waits at the barrier: it must give
    its core up (a futex: a voluntary context switch) after a short spin,
    not spin for the whole 3 ms (no switch at all: the barrier of OpenMP and
    of main's code), and the logits stay the quiet run's bits."""
    model = native_split_model(test_kernels, monkeypatch, int8)
    lib = test_kernels.lib
    pin_step_threads(2)
    runs = []
    try:
        for us in (0, 3000):
            model.setup_cache(1, 40)
            prefill(model, torch.arange(1, 31).view(1, -1))
            lib.qwen3_test_stolen_passes(us)
            switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
            with torch.inference_mode():
                _, logits = decode_one_token(model, PROMPT[:, :1], torch.tensor([30]))
            switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - switches
            runs.append((switches, logits.view(torch.int16).clone()))
    finally:
        lib.qwen3_test_stolen_passes(0)
    assert torch.equal(runs[1][1], runs[0][1])
    assert runs[1][0] >= 5  # one per barrier the late thread holds up


# ---------------------------------------------------------------------------
# busy_machine.py


def busy_script():
    spec = importlib.util.spec_from_file_location(
        "busy_machine", BONUS / "busy_machine.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_busy_processes_are_stopped_on_an_error_and_on_ctrl_c(monkeypatch, capsys):
    script = busy_script()
    started = []
    real_start = script.start_busy

    def start(n, nice=0):
        started.extend(real_start(n, nice))
        return started

    monkeypatch.setattr(script, "start_busy", start)
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):

        def failing(*args, exc=exc):
            assert all(p.poll() is None for p in started)  # running meanwhile
            raise exc

        monkeypatch.setattr(script, "measure", failing)
        args = script._parser().parse_args(["--busy", "2"])
        with pytest.raises(type(exc)):
            script._run(args)
        assert len(started) == 2 and all(p.poll() is not None for p in started)
        started.clear()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_busy_processes_and_the_timing_run_at_the_niceness_asked(monkeypatch):
    """A starved process: `--busy-nice 10 --nice 19`."""
    script = busy_script()
    procs = script.start_busy(1, nice=5)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _nice(procs[0].pid) == _nice("self"):
            time.sleep(0.05)  # until the child has set it
        assert _nice(procs[0].pid) == min(_nice("self") + 5, 19)
    finally:
        script.stop_busy(procs)
    ran = {}

    def fake_run(args, **kwargs):
        ran.update(kwargs)
        return subprocess.CompletedProcess(args, 0, '{"decode": {}}', "")

    monkeypatch.setattr(script.subprocess, "run", fake_run)
    script.run_worker(None, {"nice": 19})
    assert ran["preexec_fn"] is not None  # os.nice(19) in the child, any checkout
    args = script._parser().parse_args(["--nice", "20"])
    with pytest.raises(UsageError, match="--nice"):
        script._check(args)


def _nice(pid) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


BUSY_ORPHAN = """
import sys
sys.path.insert(0, sys.argv[1])
import busy_machine
procs = busy_machine.start_busy(1)
print(procs[0].pid, flush=True)
import os
os._exit(0)  # killed without a chance to stop them
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_busy_processes_end_by_themselves_when_the_script_is_killed():
    out = subprocess.run(
        [sys.executable, "-c", BUSY_ORPHAN, str(BONUS)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_table_gives_the_default_as_a_share_of_the_best_fixed_count():
    script = busy_script()
    results = {
        ("this", "fast_native_int8"): {
            "default": [27.0, 29.0],
            "1": [30.0, 30.0],
            "2": [3.0, 2.0],
        },  # fmt: skip
    }
    text = script.table(results, ["default", "1", "2"], busy=1)
    lines = text.splitlines()
    head = [" default threads ", " `--threads 1` ", " `--threads 2` "]
    assert lines[1].split("|")[3:7] == [*head, " default / best fixed "]
    want = "| this | `fast_native_int8` | 28.00 ±4% | 30.00 ±0% | 2.50 ±20% | 0.93 |"
    assert lines[3] == want
    one_round = {
        key: {s: v[:1] for s, v in cell.items()} for key, cell in results.items()
    }
    lines = script.table(one_round, ["default", "1", "2"], busy=1).splitlines()
    assert lines[3] == "| this | `fast_native_int8` | 27.00 | 30.00 | 3.00 | 0.90 |"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--busy", "-1"], "--busy must be between 0 and 64"),
        (["--threads", "default,0"], "--threads takes 'default' and positive"),
        (["--max-new-tokens", "1"], "--max-new-tokens must be at least 2"),
        (["--code", "/nonexistent"], "not a checkout of this repository"),
        (["--prompt-tokens", "5000"], "--prompt-tokens must be between 0 and 4096"),
    ],
)
def test_bad_arguments_get_one_line(argv, message, capsys):
    script = busy_script()
    assert script.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_prompt_tokens_adds_the_prefills_table(monkeypatch, capsys):
    script = busy_script()
    seen = {}

    def measure(codes, modes, settings, tokens, rounds, prompt_tokens=0, nice=0):
        seen["prompt_tokens"], seen["nice"] = prompt_tokens, nice
        cell = {("this", "fast_native"): {"default": [10.0], "1": [8.0]}}
        return {"decode": cell, "prefill": cell}

    monkeypatch.setattr(script, "measure", measure)
    monkeypatch.setattr(script, "start_busy", lambda n, nice=0: [])
    argv = ["--busy", "0", "--threads", "default,1", "--modes", "fast_native"]
    assert script.main(argv) == 0
    assert "prefill" not in capsys.readouterr().out and seen["prompt_tokens"] == 0
    assert script.main([*argv, "--prompt-tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert seen["prompt_tokens"] == 64 and "64-token prefill tok/s" in out
    assert script.main([*argv, "--nice", "19"]) == 0 and seen["nice"] == 19
    assert "timed at nice 19" in capsys.readouterr().out
    assert script.prompt_for(0) == script.PROMPT
    assert script.prompt_for(20) == (script.PROMPT * 3)[:20]
