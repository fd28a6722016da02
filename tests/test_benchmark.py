"""utils.benchmark on a tiny model: row fields, table, JSON/CSV, CLI errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny import tiny_config

from utils import benchmark
from utils.standin import standin_state_dict

TINY = tiny_config(vocab_size=500)
MODES = ["regular", "kv_cache", "fast"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows():
    return benchmark.run_benchmark(
        modes=MODES,
        device="cpu",
        dtype="float32",
        max_new_tokens=6,
        repeats=2,
        cfg=TINY,
        state_dict=standin_state_dict(TINY, 0),
        token_ids=torch.tensor([[3, 1, 4, 1, 5]]),
        quiet=True,
    )


def test_rows_have_the_promised_fields(rows):
    assert [r["mode"] for r in rows] == MODES
    for r in rows:
        assert set(benchmark.ROW_FIELDS) <= set(r)
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


def test_table_json_csv_and_plot(rows, tmp_path):
    table = benchmark.format_table(rows)
    lines = table.splitlines()
    assert lines[0].startswith("| Mode |") and len(lines) == 2 + len(rows)
    assert all(f"| {m} |" in table for m in MODES)
    assert "1.00x" in table

    data = json.loads(benchmark.write_json(rows, tmp_path / "r.json").read_text())
    assert [d["mode"] for d in data] == MODES
    for key in ("tokens_per_sec", "ttft_s", "warmup_s", "peak_mem_bytes"):
        assert all(isinstance(d[key], (int, float)) for d in data)

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
