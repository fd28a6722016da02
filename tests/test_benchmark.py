"""utils.benchmark on a tiny model: row fields, bandwidth figures, the book's
compile setting, skipped modes, table, JSON/CSV, CLI errors."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import utils.benchmark.bandwidth
import utils.fast
from tests.ctrl_c import ctrl_c_while_torch_imports
from tests.tiny import benchmark_inputs, tiny_run
from utils.benchmark import modes as benchmark_modes
from utils.benchmark import report as benchmark_report
from utils.benchmark import runner as benchmark
from utils.benchmark.bandwidth import weight_bytes_per_token
from utils.models import load_book_model

TINY, SD, PROMPT = benchmark_inputs()  # the tiny config, vocabulary 500
MODES = ["regular", "kv_cache", "optimized", "fast"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows():
    return tiny_run(MODES, max_new_tokens=6, repeats=2)


def _weight_bytes_by_hand() -> int:
    """float32 bytes of every tensor but the embedding table (the stand-in's
    output head is its own tensor), plus the one embedding row read."""
    total = sum(v.numel() for k, v in SD.items() if k != "tok_emb.weight")
    return 4 * (total + TINY["emb_dim"])


def test_rows_have_the_promised_fields(rows):
    assert [r["mode"] for r in rows] == MODES
    for r in rows:
        assert set(benchmark_report.ROW_FIELDS) <= set(r)
        assert r["new_tokens"] == 6 and r["prompt_tokens"] == 5
        assert r["tokens_per_sec"] > 0 and r["e2e_tokens_per_sec"] > 0
        assert 0 <= r["ttft_s"] <= r["warmup_s"] + 60
        assert r["warmup_s"] > 0 and r["peak_mem_bytes"] > 0
        assert r["device"] == "cpu" and r["dtype"] == "float32"
    base = next(r for r in rows if r["mode"] == "kv_cache")
    assert base["ratio_vs_kv_cache"] == pytest.approx(1.0)
    fast = next(r for r in rows if r["mode"] == "fast")
    assert fast["ratio_vs_kv_cache"] == pytest.approx(
        fast["tokens_per_sec"] / base["tokens_per_sec"]
    )


def test_rows_report_bandwidth_and_time_to_last_token(rows):
    expected = _weight_bytes_by_hand()
    first = rows[0]["run_read_gbps"]
    assert first > 0
    for r in rows:
        machine = r["machine_read_gbps"]  # probed just before and after it
        assert r["run_read_gbps"] == first and machine > 0
        assert r["weight_bytes_per_token"] == expected, r["mode"]
        assert r["weight_read_gbps"] == pytest.approx(
            expected * r["tokens_per_sec"] / 1e9
        )
        # every mode here streams its tokens: each has a same-moment share
        assert r["bandwidth_share_paired"] > 0 and r["paired_read_gbps"] > 0
        best = r["best_read_gbps"]  # the best probe of the run: one for all rows
        assert best >= machine and best == rows[0]["best_read_gbps"]
        assert r["bandwidth_share"] == pytest.approx(r["weight_read_gbps"] / best)
        # eager modes: nothing to reuse from a compile cache
        assert r["warmup_cached_s"] is None and r["to_last_token_cached_s"] is None
        assert r["to_last_token_cold_s"] >= r["warmup_s"] > 0


def test_optimized_mode_gives_the_book_models_tokens():
    """The book package's optimized model shares the weights and decodes the
    same greedy tokens as the book's model (float32)."""
    from reasoning_from_scratch.qwen3 import Qwen3Model

    from utils.generation import generate_text_basic_stream_cache

    book = load_book_model(SD, "cpu", torch.float32, TINY)
    assert isinstance(book, Qwen3Model)
    opt = benchmark_modes.optimized_model(book)
    w_opt, w_book = (m.trf_blocks[0].att.W_query.weight for m in (opt, book))
    assert w_opt.data_ptr() == w_book.data_ptr()  # shared, not copied
    want = [t.item() for t in generate_text_basic_stream_cache(book, PROMPT, 8)]
    got = [t.item() for t in benchmark_modes.optimized_stream(opt, PROMPT, 8)()]
    assert got == want


def test_book_compiled_modes_use_the_books_setting(monkeypatch):
    """Every compiled book path (and the package's optimized one) calls
    torch.compile with allow_unspec_int_on_nn_module already True, and
    compiled modes report a warm-up from the compile cache."""
    from utils.compile import BOOK_SETTING_MIN_TORCH, torch_version

    seen = []

    def fake_compile(model, **kwargs):
        seen.append(torch._dynamo.config.allow_unspec_int_on_nn_module)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    modes = ["regular_compiled", "kv_cache_compiled", "optimized_compiled"]
    with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=False):
        rows = tiny_run(modes)
    assert [r["mode"] for r in rows] == modes
    assert seen == [torch_version() >= BOOK_SETTING_MIN_TORCH] * 3
    for r in rows:
        assert r["compiled"] and r["warmup_cached_s"] > 0
        assert r["to_last_token_cached_s"] >= r["warmup_cached_s"]


def test_hf_static_without_transformers_is_skipped_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    rows = tiny_run(["kv_cache", "hf_static"], quiet=False)
    assert [r["mode"] for r in rows] == ["kv_cache"]
    captured = capsys.readouterr()
    skipped = [line for line in captured.err.splitlines() if "skipped" in line]
    assert skipped == [  # through the utils logger
        "utils.benchmark: hf_static: skipped, transformers is not installed "
        "(pip install transformers)"
    ]
    assert "utils.benchmark: kv_cache: warm-up" in captured.err  # the progress
    table = benchmark.format_table(rows)
    assert _table_rows(table)[0][0] == "kv_cache" and "hf_static" not in table


def _table_rows(text: str) -> list[list[str]]:
    """The short table's body in `text`: each row's cells (split at 2+
    spaces), the lines under the header that start with a mode's name."""
    import re

    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mode "))
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines[start + 1 :]]
    return [c for c in cells if c[0] in benchmark.mode_names()]


def test_default_modes_leave_out_the_slow_and_the_compiled_ones_on_cpu(capsys):
    cpu = benchmark.default_modes(torch.device("cpu"))
    assert "regular" not in cpu and "regular_compiled" not in cpu
    assert {"kv_cache", "optimized", "fast", "fast_native", "hf_static"} <= set(cpu)
    compiled = [m.name for m in benchmark.all_modes() if m.compiled]
    assert len(compiled) >= 5 and not set(compiled) & set(cpu)
    gpu = benchmark.default_modes(torch.device("cuda"))
    assert "regular" in gpu and "fast_int8" not in gpu
    assert {"kv_cache_compiled", "fast_compiled"} <= set(gpu)
    assert benchmark._check_modes(["all"]) == list(benchmark.mode_names())
    # the run says what it left out and how to ask for it
    assert benchmark._modes_for(torch.device("cpu"), None, quiet=False) == cpu
    err = capsys.readouterr().err
    assert "kv_cache_compiled" in err and "--modes all" in err


def test_table_json_csv_and_plot(rows, tmp_path):
    table = benchmark.format_table(rows)
    lines = table.splitlines()
    header = lines[lines.index("") + 1 :][:2]
    assert header[0].split() == ["decode", "time", "to", "peak", "vs", "book's",
                                 "spread"]  # fmt: skip
    assert header[1].split() == ["mode", "tok/s", "first", "token", "memory", "KV",
                                 "cache", "of", "runs"]  # fmt: skip
    cells = _table_rows(table)
    assert [c[0] for c in cells] == MODES and all(len(c) == 6 for c in cells)
    base = cells[MODES.index("kv_cache")]
    kv = rows[MODES.index("kv_cache")]
    assert base[4] == "1.00x" + (" noisy" if kv["noisy"] else "")
    assert base[1] == benchmark_report.rate(kv["tokens_per_sec"])
    assert base[2] == benchmark_report.seconds(kv["ttft_s"])
    assert base[3] == f"{kv['peak_mem_bytes'] / 1024**3:.2f} GB"
    assert "STAND-IN" not in table  # the tiny rows are not stand-ins
    details = benchmark.format_details(rows).splitlines()
    assert "To token 6" in details[0] and len(details) == 2 + len(rows)
    assert all(line.count("|") == 8 for line in details)
    assert "(nothing to compile)" in details[2]
    note = benchmark.describe_bandwidth(rows)
    assert f"at the {rows[0]['machine_read_gbps']:.1f} GB/s" in note
    assert note.startswith("Memory read speed measured around each mode: ")

    data = json.loads(benchmark.write_json(rows, tmp_path / "r.json").read_text())
    assert [d["mode"] for d in data] == MODES
    for key in (
        "tokens_per_sec",
        "ttft_s",
        "warmup_s",
        "to_last_token_cold_s",
        "weight_read_gbps",
        "machine_read_gbps",
        "bandwidth_share",
        "peak_mem_bytes",
    ):
        assert all(isinstance(d[key], (int, float)) for d in data)
    assert all("warmup_cached_s" in d for d in data)

    with open(benchmark.write_csv(rows, tmp_path / "r.csv"), newline="") as f:
        got = list(csv.DictReader(f))
    assert [g["mode"] for g in got] == MODES
    assert float(got[0]["tokens_per_sec"]) == pytest.approx(rows[0]["tokens_per_sec"])

    fig = benchmark.plot_results(rows, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 0
    assert len(fig.axes[0].patches) == len(rows)


def test_bad_arguments_raise_clear_errors():
    common = {"cfg": TINY, "state_dict": {}, "quiet": True}
    with pytest.raises(ValueError, match="unknown mode"):
        benchmark.run_benchmark(modes=["warp_speed"], **common)
    with pytest.raises(ValueError, match="dtype"):
        benchmark.run_benchmark(modes=["fast"], dtype="int4", **common)
    with pytest.raises(ValueError, match="max_new_tokens"):
        benchmark.run_benchmark(modes=["fast"], max_new_tokens=1, **common)
    with pytest.raises(ValueError, match="repeats"):
        benchmark.run_benchmark(modes=["fast"], repeats=0, **common)


def test_cli_bad_flags_give_one_line_and_nonzero_exit(capsys):
    assert benchmark.main(["--modes", "regular,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown mode(s) nope" in err[0]
    with pytest.raises(SystemExit) as info:
        benchmark.main(["--max-new-tokens", "many"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-new-tokens" in err[0]


@pytest.mark.slow
def test_help_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "utils.benchmark", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0
    for flag in ("--device", "--dtype", "--max-new-tokens", "--modes", "--json"):
        assert flag in out.stdout


def test_memory_is_the_modes_own_and_the_spread_is_reported(rows):
    """Every mode here reads the loaded weights in place, so its memory is
    at least those weights; the spread is half the range of the timed runs."""
    loaded = sum(v.numel() * 4 for v in SD.values())
    for r in rows:
        # (the book's own modes also read its RoPE buffers in place)
        assert r["shared_weight_bytes"] >= loaded, r["mode"]
        assert r["peak_mem_bytes"] >= loaded + r["own_tensor_bytes"]
        assert r["process_peak_mem_bytes"] >= r["peak_mem_bytes"] - loaded
        runs = r["tokens_per_sec_runs"]
        assert len(runs) == 2
        want = (max(runs) - min(runs)) / 2 / r["tokens_per_sec"]
        assert r["tokens_per_sec_spread"] == pytest.approx(want)
    assert "±" in benchmark.format_table(rows)


def test_shared_weight_bytes_counts_only_tensors_still_in_use():
    from utils.fast import FastQwen3, quantize_int8

    cfg = {**TINY, "dtype": torch.bfloat16}
    sd = {k: v.to(torch.bfloat16) for k, v in SD.items()}
    book = load_book_model(sd, "cpu", torch.bfloat16, cfg)
    fast = FastQwen3.from_book_model(book)
    everything = sum(p.numel() * 2 for p in book.parameters())
    assert benchmark_modes.shared_weight_bytes(fast, book) == everything > 0
    # int8 copies: only the norms' scales are still the loaded tensors
    q = quantize_int8(FastQwen3.from_book_model(book))
    norms = sum(p.numel() * 2 for n, p in book.named_parameters() if p.dim() == 1)
    assert benchmark_modes.shared_weight_bytes(q, book) == norms
    assert weight_bytes_per_token(q) < everything / 1.9
    # ... and the int8 tables and scales are its own, plus a cache once it
    # has one
    int8 = sum(b.numel() * b.element_size() for b in q.buffers() if b is not None)
    assert int8 > everything / 2.1
    assert benchmark_modes.own_tensor_bytes(q, book) == int8
    assert benchmark_modes.own_tensor_bytes(fast, book) == 0
    fast.setup_cache(1, 10)
    cache = 2 * TINY["n_layers"] * fast.trf_blocks[0].att.k_cache.nbytes
    rope = fast.cos.nbytes + fast.sin.nbytes + fast.positions.nbytes
    assert benchmark_modes.own_tensor_bytes(fast, book) == cache + rope


def test_tensor_bytes_count_views_of_one_storage_once():
    block = torch.zeros(1000, dtype=torch.uint8)
    m = torch.nn.Module()
    m.register_buffer("a", block[0:400])
    m.register_buffer("b", block[300:500])  # overlaps a
    m.register_buffer("c", block[350:450])  # inside b
    m.register_buffer("d", block[600:700].view(torch.int16))
    # 500 bytes of a..c, 100 of d; not the storage's 1000
    assert benchmark_modes.storages(m) == {block.untyped_storage().data_ptr(): 600}


def test_choice_names_the_fastest_and_the_soonest_fast_path():
    def row(mode, rate, cold):
        return {"mode": mode, "tokens_per_sec": rate, "new_tokens": 100,
                "to_last_token_cold_s": cold, "peak_mem_bytes": 10}  # fmt: skip

    rows = [row("kv_cache", 4, 25), row("fast", 8, 13), row("fast_compiled", 12, 100),
            row("fast_block_compiled", 10, 30), row("fast_int8", 20, 90)]  # fmt: skip
    rows[-1]["peak_mem_bytes"] = 5
    benchmark._add_ratios(rows)
    assert [r["mode"] for r in rows if r["best_bf16_fast"]] == ["fast_compiled"]
    assert [r["mode"] for r in rows if r["soonest_bf16_fast"]] == ["fast"]
    assert rows[-1]["speed_vs_best_bf16_fast"] == pytest.approx(20 / 12)
    assert rows[-1]["memory_vs_fast_compiled"] == pytest.approx(0.5)
    text = benchmark.describe_choice(rows)
    assert "fast_compiled (12.0 tok/s)" in text and "fast (13.0 s" in text
    assert benchmark.describe_choice(rows[:1]) is None


def test_native_modes_run_and_count_in_the_choice():
    from utils.fast import get_kernels

    if get_kernels() is None:
        pytest.skip("the native step needs the C kernels (x86-64 with AVX2, AArch64)")
    modes = ["fast", "fast_native", "fast_native_int8"]
    rows = tiny_run(modes, dtype="bfloat16", max_new_tokens=6, repeats=2)
    by_mode = {r["mode"]: r for r in rows}
    assert list(by_mode) == ["fast", "fast_native", "fast_native_int8"]
    assert by_mode["fast_native"]["warmup_cached_s"] is None  # nothing compiles
    # int8 reads about half the bytes and is compared with the best bf16 row
    native_int8 = by_mode["fast_native_int8"]
    assert (
        native_int8["weight_bytes_per_token"]
        < 0.6 * (by_mode["fast_native"]["weight_bytes_per_token"])
    )
    best = max(rows[:2], key=lambda r: r["tokens_per_sec"])
    assert native_int8["speed_vs_best_bf16_fast"] == pytest.approx(
        native_int8["tokens_per_sec"] / best["tokens_per_sec"]
    )
    assert "fast_native" in benchmark.describe_choice(rows) or best["mode"] == "fast"


def test_native_modes_are_skipped_in_one_line_where_they_cannot_run(capsys):
    rows = tiny_run(["fast_native"])  # float32: the native step needs bf16
    assert rows == []
    assert "fast_native: skipped, " in capsys.readouterr().err


def test_each_mode_is_compared_with_the_read_speed_around_it(monkeypatch):
    probes = iter([30e9, 20e9, 40e9])  # start, after mode 1, after mode 2
    monkeypatch.setattr(
        utils.benchmark.bandwidth, "measure_read_bandwidth", lambda *a: next(probes)
    )
    rows = tiny_run(["kv_cache", "fast"], max_new_tokens=5)
    # the larger of the probes just before and just after each mode
    assert [r["machine_read_gbps"] for r in rows] == [30.0, 40.0]
    assert [r["run_read_gbps"] for r in rows] == [30.0, 30.0]
    assert rows[1]["bandwidth_share"] == pytest.approx(rows[1]["weight_read_gbps"] / 40)
    # the share compares with the run's best probe, so rows compare with
    # each other; the probe around the mode is kept beside it
    assert [r["best_read_gbps"] for r in rows] == [40.0, 40.0]
    assert rows[0]["bandwidth_share"] == pytest.approx(rows[0]["weight_read_gbps"] / 40)
    details = benchmark.format_details(rows)
    paired = rows[0]["bandwidth_share_paired"]
    assert f"| {paired:.0%} | {rows[0]['bandwidth_share']:.0%} |" in details
    note = benchmark.describe_bandwidth(rows)
    assert "20.0" not in note and "30.0-40.0 GB/s" in note
    # each mode's note is whole: what it reads, what that allows, and its
    # share of torch.sum's speed at the same moment, ending with a stop
    kv = " ".join(note.split("\nfast reads")[0].splitlines()[1:]).replace("  ", " ")
    assert kv.startswith("kv_cache reads ") and kv.endswith(" GB/s).")
    assert f"(which read at {rows[0]['paired_read_gbps']:.1f} GB/s)" in kv
    assert f"at {paired:.0%} of the speed of a torch.sum" in kv


def test_a_mode_without_a_token_stream_has_no_paired_share(monkeypatch):
    bandwidth = utils.benchmark.bandwidth
    monkeypatch.setattr(bandwidth, "measure_read_bandwidth", lambda *a: 30e9)
    stamps = benchmark_modes.Prepared(lambda: [1.0, 2.0, 3.0], torch.nn.Linear(1, 1))
    stamps.timer = lambda stream, dev, **kw: {
        "ttft_s": 0.1,
        "total_s": 1.0,
        "tokens": 3,
    }
    monkeypatch.setitem(benchmark_modes.PREPARE, "hf", lambda *a: stamps)
    rows = tiny_run(["hf_static"])
    assert rows[0]["bandwidth_share_paired"] is rows[0]["paired_read_gbps"] is None
    assert "| - | " in benchmark.format_details(rows)


# ---------------------------------------------------------------------------
# The command: checks before work, one line per problem, streams, help
# ---------------------------------------------------------------------------


def _no_run(*args, **kwargs):
    raise AssertionError("the benchmark ran before its arguments were checked")


@pytest.mark.parametrize("flag", ["--json", "--csv", "--plot"])
def test_unwritable_output_path_fails_before_any_mode_runs(
    flag, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(benchmark, "run_benchmark", _no_run)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for bad, why in (
        (blocker / "out.png", "is a file, not a folder"),
        (tmp_path, "is a folder"),
    ):
        assert benchmark.main([flag, str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0] and flag in err[0], err
        assert err[0].startswith("python -m utils.benchmark: error: ")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not os.access(locked, os.W_OK):  # (root may write anywhere)
        assert benchmark.main([flag, str(locked / "r.png")]) == 2
        assert "cannot write into" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "pickle"])
def test_unusable_model_path_is_one_line(damage, tmp_path, capsys):
    import pickle
    import zipfile

    path = tmp_path / "qwen3-0.6B-base.pth"
    if damage == "truncated":
        torch.save({"w": torch.zeros(1000)}, path)
        path.write_bytes(path.read_bytes()[:-300])
    else:  # a zip checkpoint whose pickle calls a function
        torch.save({"w": torch.zeros(2)}, path)
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            data = {n: z.read(n) for n in names}
        pkl = next(n for n in names if n.endswith("data.pkl"))
        data[pkl] = pickle.dumps(print, protocol=2)
        with zipfile.ZipFile(path, "w") as z:
            for n in names:
                z.writestr(n, data[n])
    rc = benchmark.main(["--model-path", str(path), "--modes", "kv_cache"])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "error" in x]
    assert rc == 2 and len(lines) == 1, err
    assert str(path) in lines[0] and "Traceback" not in err
    assert "\x1b[" not in err and "This file can still be loaded" not in err


def test_a_single_repeat_shows_no_spread():
    rows = tiny_run(["kv_cache"])  # repeats=1
    assert _table_rows(benchmark.format_table(rows))[0][5] == "1 run"
    assert "±" not in benchmark.format_table(rows)


def test_progress_off_a_terminal_is_one_line_per_phase(capsys, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)  # phases only
    tiny_run(["kv_cache", "kv_cache_compiled"], quiet=False, max_new_tokens=4)
    err = capsys.readouterr().err
    assert "\r" not in err
    phases = [x for x in err.splitlines() if ": warm-up" in x]
    # each phase: one line when it starts, one when it is done
    assert len(phases) == 6, phases
    assert sum("done, 4 tokens in" in x for x in phases) == 3
    # the compiled mode's first warm-up says it is compiling
    assert "kv_cache_compiled: warm-up, compiling (minutes on a CPU) ..." in err


def test_results_on_stdout_progress_and_banner_on_stderr(monkeypatch, capsys):
    rows = tiny_run(["kv_cache"])
    rows[0]["standin"] = True
    monkeypatch.setattr(benchmark, "run_benchmark", lambda **kw: rows)
    assert benchmark.main(["--modes", "kv_cache"]) == 0
    out, err = capsys.readouterr()
    assert "\nkv_cache  " in out and "STAND-IN WEIGHTS" not in out
    assert "STAND-IN weights" in out.split("\nmode ")[0]  # the table says it
    assert "STAND-IN WEIGHTS" in err and "\nkv_cache  " not in err


def test_help_explains_every_option_and_the_offline_mode():
    text = benchmark.build_parser().format_help()
    for flag in ("--dtype", "--max-new-tokens", "--prompt", "--json", "--csv"):
        block = text.split(flag, 1)[1].split("\n  -", 1)[0]
        assert len(block.split()) > 3, (flag, block)  # a help text, not bare
    assert "(default: 100)" in text and "(default: bfloat16)" in text
    assert "QWEN3_STANDIN=1" in " ".join(text.split())
    # every mode name appears whole (the list wraps only between names)
    for mode in benchmark.mode_names():
        assert mode in text.replace("\n", " "), mode


def test_a_prompt_too_long_for_memory_is_refused_before_any_mode(monkeypatch):
    from utils import models

    monkeypatch.setattr(models, "free_memory_bytes", lambda device: 1_000_000)
    monkeypatch.setattr(benchmark._Run, "all", _no_run)
    long_prompt = torch.randint(0, 500, (1, 200))
    with pytest.raises(ValueError, match="GB for the attention scores"):
        tiny_run(["kv_cache"], token_ids=long_prompt)


def test_the_table_names_the_kernels_each_native_mode_ran(monkeypatch, capsys):
    from utils.fast import get_kernels

    kernels = get_kernels()
    if kernels is None:
        pytest.skip("the native step needs the C kernels (x86-64 with AVX2, AArch64)")
    monkeypatch.setenv("QWEN3_KERNEL_VARIANTS", "default")  # the first kernels
    exact, int8 = (kernels.table[kernels.first[c]].name for c in ("exact", "int8"))
    modes = ["fast", "fast_native", "fast_native_int8"]
    rows = tiny_run(modes, dtype="bfloat16")
    ran = {r["mode"]: r["kernels"] for r in rows}
    assert ran == {"fast": None, "fast_native": exact, "fast_native_int8": int8}
    monkeypatch.setattr(benchmark, "run_benchmark", lambda **kw: rows)
    assert benchmark.main(["--modes", ",".join(modes)]) == 0
    assert "Kernels the native modes ran" not in capsys.readouterr().out
    assert benchmark.main(["--modes", ",".join(modes), "--verbose"]) == 0
    out = capsys.readouterr().out
    assert (
        f"Kernels the native modes ran: fast_native: {exact}; "
        f"fast_native_int8: {int8}." in out
    )
    assert benchmark.describe_kernels(rows[:1]) is None


def test_the_fast_modes_are_the_registrys_paths():
    """Every path of utils.fast's registry is a mode, with its summary;
    the ones not in a default run are run only when named."""
    from utils.fast import PATHS

    for path in PATHS:
        mode = benchmark.get_mode(path.name)
        assert mode.family == "fast" and mode.note == path.summary
        assert mode.int8 == path.int8 and mode.by_default == path.in_default_run
    cpu = benchmark.default_modes(torch.device("cpu"))
    assert "fast_native" in cpu and "fast_fastest" not in cpu


def test_a_memory_mapped_model_is_made_resident_before_the_first_mode(tmp_path):
    """The weights' pages count in RSS only once read: unread, the first
    mode's growth counted them on top of the weights it reads in place."""
    import psutil

    path = tmp_path / "big.pth"
    torch.save({"w": torch.ones(8 << 20)}, path)  # 32 MiB of float32
    weights = torch.load(path, mmap=True, weights_only=True)["w"]
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(weights, requires_grad=False)
    before = psutil.Process().memory_info().rss
    benchmark.make_resident(module)
    assert psutil.Process().memory_info().rss - before > 24 << 20


def test_run_benchmark_makes_the_loaded_model_resident(monkeypatch):
    seen = []
    monkeypatch.setattr(benchmark, "make_resident", seen.append)
    tiny_run(["kv_cache"])
    assert len(seen) == 1 and hasattr(seen[0], "trf_blocks")


# ---------------------------------------------------------------------------
# Output paths: checked before the first mode, devices written through,
# links never replaced, regular files replaced whole
# ---------------------------------------------------------------------------


def test_a_plot_format_matplotlib_lacks_fails_before_anything(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(benchmark, "run_benchmark", _no_run)
    args = ["--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "out.xyz")]
    assert benchmark.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plot" in err[0] and "cannot write .xyz" in err[0]
    assert ".png" in err[0] and ".svg" in err[0]  # what it can write
    assert list(tmp_path.iterdir()) == []  # no JSON, no probe left


def test_a_folder_the_permission_bits_allow_is_probed_for_real(monkeypatch, capsys):
    """In /proc the permission bits say "writable" to root, yet no file can
    be made there: the check makes one (here os.access says yes to all)."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc")
    monkeypatch.setattr(benchmark, "run_benchmark", _no_run)
    monkeypatch.setattr(os, "access", lambda *a, **k: True)
    assert benchmark.main(["--json", "/proc/qwen3-results.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--json" in err[0], err
    assert "cannot write into /proc" in err[0]


def test_a_link_to_a_regular_file_is_refused_before_any_mode(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(benchmark, "run_benchmark", _no_run)
    target = tmp_path / "keep.json"
    target.write_text("mine")
    link = tmp_path / "r.json"
    link.symlink_to(target)
    assert benchmark.main(["--json", str(link)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "symbolic link" in err[0] and "--json" in err[0]
    assert link.is_symlink() and target.read_text() == "mine"


@pytest.mark.parametrize("flag", ["--json", "--csv", "--plot"])
def test_a_link_to_a_character_device_is_written_through(
    flag, rows, tmp_path, monkeypatch
):
    monkeypatch.setattr(benchmark, "run_benchmark", lambda **kw: rows)
    link = tmp_path / "out.png"
    link.symlink_to(os.devnull)
    assert benchmark.main([flag, str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == os.devnull
    assert Path(os.devnull).is_char_device()


def test_a_fifo_gets_the_rows_and_stays_a_fifo(rows, tmp_path, monkeypatch):
    import stat
    import threading

    fifo = tmp_path / "rows"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    monkeypatch.setattr(benchmark, "run_benchmark", lambda **kw: rows)
    assert benchmark.main(["--json", str(fifo)]) == 0
    reader.join(timeout=30)
    assert [r["mode"] for r in json.loads(got[0])] == MODES
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("flag", ["--json", "--csv", "--plot"])
def test_a_regular_file_is_replaced_whole_not_rewritten(
    flag, rows, tmp_path, monkeypatch
):
    """A hard link to the old file keeps the old bytes: the new file came
    in by a rename (a reader of the old one never sees half a file)."""
    monkeypatch.setattr(benchmark, "run_benchmark", lambda **kw: rows)
    path = tmp_path / "out.png"
    path.write_text("old")
    os.link(path, tmp_path / "old-link")
    assert benchmark.main([flag, str(path)]) == 0
    assert (tmp_path / "old-link").read_text() == "old"
    assert path.stat().st_size > 100 and not path.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old-link", "out.png"]


DRIVER = r"""
import json, sys
from utils.benchmark import runner as benchmark
from utils.benchmark import modes as benchmark_modes
from utils.benchmark import report as benchmark_report

rows = json.load(open(sys.argv[1]))
benchmark.run_benchmark = lambda **kw: rows
sys.exit(benchmark.main(sys.argv[2:]))
"""


@pytest.mark.slow  # a subprocess
def test_json_to_a_link_to_stdout_goes_to_the_pipe(rows, tmp_path):
    """`--json DIR/link` with link -> /dev/stdout -> /proc/self/fd/1 (a
    pipe here): the rows are written through and the link stays."""
    if not os.path.exists("/proc/self/fd/1"):
        pytest.skip("needs /proc/self/fd")
    saved = benchmark.write_json(rows, tmp_path / "rows.json")
    link = tmp_path / "link"
    link.symlink_to(
        "/dev/stdout" if os.path.islink("/dev/stdout") else "/proc/self/fd/1"
    )
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(saved), "--json", str(link)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith(saved.read_text())  # after the table
    assert "\nkv_cache  " in proc.stdout and link.is_symlink()


def test_a_prompt_that_is_not_utf8_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(benchmark, "run_benchmark", _no_run)
    with pytest.raises(SystemExit) as info:
        benchmark.main(["--prompt", "caf\udce9"])  # the byte 0xe9 of Latin-1
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --prompt: not UTF-8" in err[0]


def test_an_abbreviated_option_is_named_not_guessed(monkeypatch, capsys):
    monkeypatch.setattr(benchmark, "run_benchmark", _no_run)
    with pytest.raises(SystemExit):
        benchmark.main(["--max-new", "5"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --max-new (did you mean --max-new-tokens?)" in err


# ---------------------------------------------------------------------------
# What a reader sees: six columns in 80, noisy rows flagged, stand-ins said,
# the prefill of a synthetic prompt, progress with the time left, Ctrl-C
# ---------------------------------------------------------------------------


def _wide_row(mode: str, **fields) -> dict:
    """A row as wide as rows get: a GPU's speeds, a noisy spread, a
    synthetic prompt near the context length, stand-in weights."""
    row = {
        "mode": mode, "device": "cuda:0", "dtype": "bfloat16", "standin": True,
        "prompt_tokens": 40_000, "synthetic_prompt": True, "new_tokens": 100,
        "tokens_per_sec": 12_345.6, "tokens_per_sec_runs": [1.0, 2.0, 3.0],
        "tokens_per_sec_spread": 1.5, "noisy": True, "ttft_s": 123.4,
        "prefill_tokens_per_sec": 123_456.0, "peak_mem_bytes": 123 * 1024**3,
        "ratio_vs_kv_cache": 999.9,
    }  # fmt: skip
    return {**row, **fields}


def test_the_table_fits_80_columns_at_its_widest():
    rows = [_wide_row(m) for m in benchmark.mode_names()]
    text = benchmark.format_table(rows)
    assert [line for line in text.splitlines() if len(line) > 80] == []
    cells = _table_rows(text)
    assert [c[0] for c in cells] == list(benchmark.mode_names())
    assert all(len(c) == 6 for c in cells), cells
    assert cells[0][2] == "123 s (123k tok/s)"
    assert "STAND-IN weights" in " ".join(text.split("\nmode ")[0].split())
    note = benchmark.describe_noise(rows)
    assert note and all(len(line) <= 80 for line in note.splitlines())


@pytest.mark.parametrize(("spread", "noisy"), [(0.15, False), (0.35, True)])
def test_a_spread_over_20_percent_is_flagged_beside_its_ratio(spread, noisy):
    row = _wide_row("fast", tokens_per_sec_spread=spread, noisy=noisy,
                    ratio_vs_kv_cache=35.52, standin=False)  # fmt: skip
    text = benchmark.format_table([row])
    cells = _table_rows(text)[0]
    assert cells[4:] == ["35.5x" + (" noisy" if noisy else ""), f"±{spread:.0%}"]
    assert ("noisy" in text) == noisy and "STAND-IN" not in text
    assert (benchmark.describe_noise([row]) is not None) == noisy


def test_rows_say_whether_they_are_noisy(rows):
    for r in rows:
        assert r["noisy"] == (r["tokens_per_sec_spread"] > benchmark.NOISY)


def test_a_synthetic_prompt_repeats_the_prompts_tokens():
    assert benchmark.synthetic_prompt(PROMPT, 12).tolist() == [
        [3, 1, 4, 1, 5, 3, 1, 4, 1, 5, 3, 1]
    ]
    assert benchmark.synthetic_prompt(PROMPT, 3).tolist() == [[3, 1, 4]]


def test_prompt_tokens_give_the_prefill_speed_in_the_table():
    rows = tiny_run(["kv_cache", "fast"], prompt_tokens=12)
    for r in rows:
        assert r["prompt_tokens"] == 12 and r["synthetic_prompt"]
        assert r["prefill_tokens_per_sec"] == pytest.approx(12 / r["ttft_s"])
    table = benchmark.format_table(rows)
    assert "token (prefill)" in table
    assert "synthetic prompt of 12 tokens" in " ".join(table.split())
    first = benchmark_report.seconds(rows[0]["ttft_s"])
    prefill = f"{rows[0]['prefill_tokens_per_sec']:.0f} tok/s"
    assert _table_rows(table)[0][2] == f"{first} ({prefill})"
    # a text prompt of a few tokens: time to first token alone
    plain = tiny_run(["kv_cache"])
    assert not plain[0]["synthetic_prompt"] and plain[0]["prompt_tokens"] == 5
    assert "prefill" not in benchmark.format_table(plain)


def test_prompt_tokens_beyond_the_context_length_are_one_line(monkeypatch, capsys):
    monkeypatch.setattr(benchmark, "run_benchmark", _no_run)
    for n, why in (
        ("40900", "context length of 40,960 tokens; use at most 40,860 prompt tokens"),
        ("0", "--prompt-tokens must be at least 1"),
    ):
        assert benchmark.main(["--prompt-tokens", n]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
    # the library checks the loaded model's own context length
    monkeypatch.undo()
    with pytest.raises(ValueError, match="context length of 256 tokens"):
        tiny_run(["kv_cache"], prompt_tokens=254)


def test_progress_names_the_mode_its_number_and_the_time_left(capsys):
    tiny_run(["kv_cache", "fast", "optimized"], quiet=False)
    err = capsys.readouterr().err.splitlines()
    marks = [line.split(": ", 1)[1] for line in err if ": mode " in line]
    assert len(marks) == 3 and marks[0] == "mode 1 of 3: kv_cache"
    assert marks[1].startswith("mode 2 of 3: fast (about ")
    assert marks[1].endswith(" left, estimated from the 1 mode so far)")
    assert marks[2].endswith(" left, estimated from the 2 modes so far)")


def test_the_time_left_is_the_mean_time_of_the_modes_so_far_times_those_left():
    line = benchmark.progress_line(2, 6, "fast_int8", 240.0)
    assert line == (
        "mode 3 of 6: fast_int8 (about 8 min left, estimated from the 2 modes so far)"
    )
    assert "(about 40 s left, " in benchmark.progress_line(1, 3, "fast", 20.0)


def test_a_long_phase_says_it_is_still_running(monkeypatch, capsys):
    """No token for a while (a compile): the run's ticker speaks anyway."""
    import time

    from utils.benchmark import progress

    ticker = progress.Ticker(every_s=0.05)
    with ticker:
        ticker.phase("fast_compiled: warm-up, compiling (minutes on a CPU)")
        time.sleep(0.5)
    err = capsys.readouterr().err
    assert "fast_compiled: warm-up, compiling (minutes on a CPU), 0 s, still " in err
    assert err.count("still running") >= 3


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _tiny_command(monkeypatch) -> None:
    """benchmark.main runs on the tiny model (float32, 4 MiB probe)."""
    import functools

    tiny = functools.partial(benchmark.run_benchmark, cfg=TINY, state_dict=SD,
                             token_ids=PROMPT, bandwidth_bytes=1 << 22)  # fmt: skip
    monkeypatch.setattr(benchmark, "run_benchmark", tiny)


TINY_ARGS = ["--dtype", "float32", "--max-new-tokens", "3", "--repeats", "1"]


def test_ctrl_c_prints_and_saves_the_modes_that_finished(monkeypatch, tmp_path, capsys):
    _tiny_command(monkeypatch)
    monkeypatch.setitem(benchmark_modes.PREPARE, "hf", _interrupt)  # mode 3
    files = ["--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv")]
    modes = ["--modes", "kv_cache,fast,hf_static,optimized"]
    assert benchmark.main([*modes, *TINY_ARGS, *files]) == 130
    out, err = capsys.readouterr()
    cells = _table_rows(out)
    assert [c[0] for c in cells] == ["kv_cache", "fast"] and cells[0][4] == "1.00x"
    data = json.loads((tmp_path / "r.json").read_text())
    assert [d["mode"] for d in data] == ["kv_cache", "fast"]
    with open(tmp_path / "r.csv", newline="") as f:
        assert [g["mode"] for g in csv.DictReader(f)] == ["kv_cache", "fast"]
    last = err.strip().splitlines()[-1]
    assert last == (
        "python -m utils.benchmark: interrupted after 2 of 4 modes; the table "
        "above has the ones that finished"
    )
    assert "Traceback" not in err


def test_ctrl_c_before_any_mode_finished_writes_nothing(monkeypatch, tmp_path, capsys):
    _tiny_command(monkeypatch)
    monkeypatch.setitem(benchmark_modes.PREPARE, "book", _interrupt)
    args = ["--modes", "kv_cache", *TINY_ARGS, "--json", str(tmp_path / "r.json")]
    assert benchmark.main(args) == 130
    out, err = capsys.readouterr()
    assert out == "" and list(tmp_path.iterdir()) == []
    assert err.strip().endswith("interrupted after 0 of 1 modes")


SIGINT_DRIVER = r"""
import functools, signal, sys, time
# Ctrl-C as in a reader's shell, whatever the test run left ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
import torch
from tests.tiny import tiny_config
from utils.benchmark import runner as benchmark
from utils.benchmark import modes as benchmark_modes
from utils.download.standin import standin_state_dict

tiny = tiny_config(vocab_size=500)
benchmark.run_benchmark = functools.partial(
    benchmark.run_benchmark, cfg=tiny, state_dict=standin_state_dict(tiny, 0),
    token_ids=torch.tensor([[3, 1, 4]]), bandwidth_bytes=1 << 22)

def wait_for_ctrl_c(*args):
    print("READY", file=sys.stderr, flush=True)
    time.sleep(120)

benchmark_modes.PREPARE["hf"] = wait_for_ctrl_c
sys.exit(benchmark.main(sys.argv[1:]))
"""


@pytest.mark.slow  # a subprocess
def test_sigint_in_a_real_process_prints_the_finished_modes(tmp_path):
    import signal

    json_path = str(tmp_path / "r.json")
    args = ["--modes", "kv_cache,hf_static", *TINY_ARGS, "--json", json_path]
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGINT_DRIVER, *args], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    err = []
    for line in proc.stderr:
        err.append(line)
        if line.strip() == "READY":
            break
    proc.send_signal(signal.SIGINT)
    out, rest = proc.communicate(timeout=300)  # a loaded machine is slow
    assert proc.returncode == 130, "".join(err) + rest
    assert [c[0] for c in _table_rows(out)] == ["kv_cache"]
    assert "interrupted after 1 of 2 modes" in rest
    assert [d["mode"] for d in json.loads((tmp_path / "r.json").read_text())] == [
        "kv_cache"
    ]


@pytest.mark.slow  # a subprocess that imports torch
def test_sigint_while_torch_is_imported_ends_with_one_line():
    """`python -m utils.benchmark` imports its package before its
    `__main__`: Ctrl-C in those first seconds ends it as later on (a run
    that missed it would stop at its bad argument, status 2)."""
    rc, out, err = ctrl_c_while_torch_imports(
        "utils.benchmark", "--max-new-tokens", "1"
    )
    assert rc == 130, err
    assert (
        out == ""
        and err.split() == "READY python -m utils.benchmark: interrupted".split()
    )


def test_the_default_output_fits_80_columns_and_verbose_adds_the_rest(
    rows, monkeypatch, capsys
):
    monkeypatch.setattr(benchmark, "run_benchmark", lambda **kw: rows)
    assert benchmark.main([]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if len(line) > 80] == []
    assert "Share of torch.sum" not in out and "Memory read speed" not in out
    assert "--verbose" in out
    assert benchmark.main(["--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert verbose.startswith(out.split("More columns")[0])  # the same table first
    assert "Share of torch.sum's read speed, same moment" in verbose
    assert "Warm-up (s): cold / from the compile cache" in verbose
    assert "Memory read speed measured around each mode" in verbose


CUDA_PROBE = r"""
import sys
from utils.benchmark.modes import no_cuda_probe_line

if sys.argv[1] == "quiet":
    with no_cuda_probe_line():
        import torch.utils.cpp_extension
else:
    import torch.utils.cpp_extension
"""


@pytest.mark.slow  # two subprocesses
def test_the_no_cuda_runtime_line_is_not_printed(tmp_path):
    """torch.utils.cpp_extension (inductor imports it on a CPU's first
    compile) warns "No CUDA runtime is found" on import where a CUDA home
    exists without a runtime; the benchmark's runs drop that line."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA runtime is here: torch does not print the line")
    env = {**os.environ, "CUDA_HOME": str(tmp_path)}  # a CUDA home, no runtime
    said = {}
    for how in ("loud", "quiet"):
        said[how] = subprocess.run(
            [sys.executable, "-c", CUDA_PROBE, how], cwd=REPO, env=env,
            capture_output=True, text=True, timeout=300,
        ).stderr  # fmt: skip
    assert "No CUDA runtime is found" in said["loud"]  # the case is real
    assert "No CUDA runtime" not in said["quiet"], said["quiet"]


def test_runs_drop_the_no_cuda_runtime_line_and_only_it(monkeypatch):
    import logging

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("torch.utils.cpp_extension")
    logger.addHandler(handler)

    def all_modes(self, *args):
        logger.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local")
        logger.warning("another warning")
        return []

    monkeypatch.setattr(benchmark._Run, "all", all_modes)
    try:
        tiny_run(["kv_cache"])
        logger.warning("No CUDA runtime is found, after the run")
    finally:
        logger.removeHandler(handler)
    assert seen == ["another warning", "No CUDA runtime is found, after the run"]


def test_a_phase_cut_short_says_stopped_not_done(monkeypatch, capsys):
    def interrupted(mode, book, token_ids, n):
        def stream():
            yield torch.tensor([[1]])
            raise KeyboardInterrupt

        return benchmark_modes.Prepared(stream, book)

    monkeypatch.setitem(benchmark_modes.PREPARE, "fast", interrupted)
    with pytest.raises(benchmark.BenchmarkInterrupted):
        tiny_run(["kv_cache", "fast"], quiet=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("utils.benchmark: fast: warm-up: stopped, 1 tokens")
