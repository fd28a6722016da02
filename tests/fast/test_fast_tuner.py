"""utils.fast.tuner: the choice of kernel variant, decided by injected timings
and an injected load probe (no test here times the real kernels): it picks
the faster variant, never a measurably slower one, ignores rounds run under
foreign load, keeps the default without caching when it cannot measure
cleanly, and caches its choice beside the kernel library under the
library's integrity rules."""

from __future__ import annotations

import json

import pytest
import torch

import utils.fast.build as build
import utils.fast.tuner as tuner
from tests.tiny import tiny_config, tiny_state_dict
from utils.fast import FastQwen3
from utils.fast.kernels import Kernels
from utils.fast.tuner import (
    ROUNDS,
    SETTLE_TUNINGS,
    LoadProbe,
    cache_path,
    choose_variants,
    decide,
    fastest_rounds,
    settle,
    tune,
)

ONE = {"default": [1.0] * 5}


def test_decide_picks_the_faster_variant():
    ratios = {**ONE, "fast": [0.90, 0.91, 0.88, 0.93, 0.90], "same": [1.0] * 5}
    assert decide(ratios, "default") == "fast"


def test_decide_never_picks_a_slower_variant():
    ratios = {**ONE, "slow": [1.08, 1.10, 1.05, 1.12, 1.09]}
    assert decide(ratios, "default") == "default"


def test_decide_keeps_the_default_within_the_margin_of_the_best():
    ratios = {**ONE, "near": [0.99, 0.97, 0.98, 0.97, 0.99]}  # median 0.98
    assert decide(ratios, "default") == "default"
    assert decide(ratios, "default", margin=0.01) == "near"
    ratios["wide"] = [1.01, 1.02, 1.00, 1.01, 1.03]
    assert decide(ratios, "default") == "default"


def test_decide_takes_the_fastest_not_the_fastest_in_cache():
    # two variants ahead of the default: the one 2 % behind the best is not
    # chosen, whatever its cache-resident speed (see the module docstring)
    ratios = {**ONE, "eo": [0.92, 0.93, 0.92], "wide": [0.94, 0.95, 0.94]}
    assert decide(ratios, "default") == "eo"
    ratios["wide"] = [0.90, 0.91, 0.90]
    assert decide(ratios, "default") == "wide"


def test_the_rounds_with_the_fastest_memory_decide():
    paces = [1.0, 1.5, 1.1, 1.6, 1.05]
    assert fastest_rounds(paces, window=0.15, least=2) == [0, 2, 4]
    assert fastest_rounds(paces, window=0.15, least=4) == [0, 1, 2, 4]
    assert fastest_rounds([], least=3) == []
    # slow rounds tie, fast ones favour "wide": over all rounds the default
    # would stay (median 1.0), over the fast ones "wide" is 10 % faster
    slow = [(0.040, {"default": 1.0, "wide": 1.0 + d}) for d in (0, 0.01, -0.01)]
    fast = [(0.020, {"default": 1.0, "wide": 0.90})] * 8
    rounds = slow * 4 + fast
    assert decide({"default": [1.0] * 20, "wide": [1.0] * 12 + [0.9] * 8},
                  "default") == "default"  # fmt: skip
    name, settled, medians, used = settle(rounds, "default", tunings=1)
    assert (name, settled, used) == ("wide", True, 8)
    assert medians["wide"] == pytest.approx(0.90)


def test_a_tie_is_final_only_after_the_last_load_that_times():
    tie = [(0.040, {"default": 1.0, "a": 0.99, "b": 1.01})] * 10
    for tunings in range(1, SETTLE_TUNINGS):
        assert settle(tie, "default", tunings)[:2] == ("default", False)
    assert settle(tie, "default", SETTLE_TUNINGS)[:2] == ("default", True)
    # the default measurably fastest: final at once
    behind = [(0.040, {"default": 1.0, "a": 1.05, "b": 1.08})] * 10
    assert settle(behind, "default", 1)[:2] == ("default", True)


class FakeProbe(LoadProbe):
    """Round r is disturbed where `busy(r)` says so."""

    def __init__(self, busy=lambda r: False) -> None:
        super().__init__()
        self.busy, self.round = busy, 0

    def sample(self):
        return (0.0, 0.0, 0.0, None)

    def clean(self, start, end, threads):
        self.round += 1
        return not self.busy(self.round - 1)


def timer(
    seconds: dict[str, float], loaded: dict[str, float] | None = None, probe=None
):
    """time_pass(name) -> seconds: `loaded` ones while the probe's current
    round is disturbed (it counts rounds as the tuner samples them)."""

    def time_pass(name: str) -> float:
        if loaded is not None and probe.busy(probe.round):
            return loaded[name]
        return seconds[name]

    return time_pass


TIMES = {"default": 0.040, "fast": 0.036, "slow": 0.048}


def test_tune_picks_the_fastest_in_clean_rounds():
    result = tune(timer(TIMES), list(TIMES), "default", 2, FakeProbe())
    assert result.choice == "fast" and result.reason is None
    assert result.clean == ROUNDS and result.rounds == ROUNDS + 1  # 0 warms up
    assert result.medians()["fast"] == pytest.approx(0.9)
    assert result.medians()["slow"] == pytest.approx(1.2)


def test_rounds_under_foreign_load_are_not_counted():
    # every other round disturbed; there the default happens to run slowly,
    # so "slow" would look twice as fast if those rounds counted
    probe = FakeProbe(busy=lambda r: r % 2 == 1)
    loaded = {"default": 0.100, "fast": 0.040, "slow": 0.050}
    result = tune(timer(TIMES, loaded, probe), list(TIMES), "default", 2, probe)
    assert result.choice == "fast"
    assert all(r == pytest.approx(1.2) for r in result.ratios["slow"])
    assert result.clean == ROUNDS and result.rounds > 2 * ROUNDS - 1


def test_a_busy_machine_keeps_the_default_and_says_why():
    probe = FakeProbe(busy=lambda r: True)
    result = tune(timer(TIMES), list(TIMES), "default", 2, probe)
    assert result.choice == "default" and result.clean == 0
    assert result.rounds == 4 and "0 of 4 rounds undisturbed" in result.reason
    few = FakeProbe(busy=lambda r: r % 3 != 1)  # clean now and then only
    result = tune(timer(TIMES), list(TIMES), "default", 2, few, budget_s=0.0)
    assert result.choice == "default" and result.reason


def test_a_pass_too_short_to_time_keeps_the_default():
    tiny = {n: t / 100 for n, t in TIMES.items()}
    result = tune(timer(tiny), list(tiny), "default", 2, FakeProbe())
    assert result.choice == "default" and "too short" in result.reason
    # a first pass slowed down (cold memory, a preempted thread) does not
    # make a small model worth timing: its second pass is short
    passes = iter([0.05] + [0.0004] * 50)
    result = tune(lambda name: next(passes), list(tiny), "default", 2, FakeProbe())
    assert result.choice == "default" and result.short and result.rounds == 2


def test_the_load_probe_reads_missing_cpu_time_and_foreign_work():
    probe = LoadProbe()
    probe.cpus, probe.tick = 2, 0.01
    start = (0.0, 0.0, 0.0, 100.0)
    assert probe.clean(start, (1.0, 1.95, 1.95, 101.95), threads=2)
    assert not probe.clean(start, (1.0, 1.5, 1.5, 101.5), threads=2)  # waited
    assert not probe.clean(start, (1.0, 1.95, 1.95, 102.9), threads=2)  # others
    assert probe.clean(start, (1.0, 0.99, 0.99, None), threads=1)  # no /proc/stat
    real = probe.sample()
    assert len(real) == 4 and real[0] > 0


# ---------------------------------------------------------------------------
# choose_variants: real kernels and their checks, fake timings and load
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def _module_kernels(kernels, tmp_path_factory):
    return Kernels(build.build_and_load(tmp_path_factory.mktemp("kernels")))


@pytest.fixture
def own_kernels(_module_kernels):
    """Kernels built into a folder of this module, with no cached choice
    (the choice goes beside the library)."""
    folder = _module_kernels.path.parent
    for old in folder.glob("variants_*"):
        old.unlink()
    tuner._TIMED.clear()
    yield _module_kernels
    tuner._TIMED.clear()
    folder.chmod(0o700)


def names_timer(seconds: dict[str, float], calls: list):
    """time_pass({class: variant}) -> seconds of the exact-class variant."""

    def time_pass(variants):
        name = variants["exact"].name
        calls.append(name)
        return seconds.get(name, 0.040)

    return time_pass


EXACT = {
    "bf16_exact_avx2": 0.040,
    "bf16_exact_avx2_np": 0.039,
    "bf16_exact_avx2_eo": 0.034,
    "bf16_exact_avx512": 0.041,
}


def choose(kernels, calls: list, classes=("exact",), **kwargs):
    """choose_variants timed by EXACT (tuning unless `setting` says), for
    model shapes "s" on 2 threads."""
    kwargs.setdefault("setting", "")
    timer = names_timer(EXACT, calls)
    return choose_variants(kernels, classes, timer, "s", 2, **kwargs)


def test_the_choice_is_timed_once_then_cached_with_a_record(own_kernels, capsys):
    calls: list[str] = []
    first = choose(own_kernels, calls, probe=FakeProbe())
    assert first.how == "tuned" and first.variants["exact"].name == "bf16_exact_avx2_eo"
    assert "kernel variants timed" in capsys.readouterr().err
    path = cache_path(own_kernels, "s", 2)
    assert build.verified(path)
    assert path.parent.stat().st_mode & 0o077 == 0  # the library's folder
    record = json.loads(path.read_text())
    assert record["variants"] == {"exact": "bf16_exact_avx2_eo"}
    assert record["evidence"]["exact"]["clean_rounds"] == ROUNDS
    timed = len(calls)
    again = choose(own_kernels, calls, probe=FakeProbe())
    assert again.how == "cached" and len(calls) == timed  # no timing
    assert again.variants == first.variants
    # another thread count or model is another record
    assert cache_path(own_kernels, "s", 1) != path != cache_path(own_kernels, "t", 2)
    # a changed record is not trusted: timed again
    path.write_text(path.read_text().replace("avx2_eo", "avx2_np"))
    third = choose(own_kernels, calls, probe=FakeProbe())
    assert third.how == "tuned" and len(calls) > timed
    assert third.variants["exact"].name == "bf16_exact_avx2_eo"


def test_a_tie_is_timed_again_at_later_loads_until_one_variant_leads(
    own_kernels, capsys
):
    # memory slow at the first two loads (every variant alike), fast at the
    # third (there bf16_exact_avx512 takes 0.9 of the default's time)
    slow = {n: 0.040 for n in EXACT}
    fast = {n: 0.020 for n in EXACT} | {"bf16_exact_avx512": 0.018}
    path = cache_path(own_kernels, "s", 2)
    calls: list[str] = []
    for load, seconds in enumerate((slow, slow, fast), start=1):
        timer = names_timer(seconds, calls)
        choice = choose_variants(
            own_kernels, ("exact",), timer, "s", 2, setting="", probe=FakeProbe()
        )
        err = capsys.readouterr().err
        record = json.loads(path.read_text())
        assert choice.how == "tuned" and record["tunings"] == load
        assert len(record["rounds"]["exact"]) == load * ROUNDS  # pooled
        if load < 3:
            assert choice.variants["exact"].name == "bf16_exact_avx2"
            assert not record["settled"] and "undecided" in err
            timed = len(calls)  # another native step in the same process
            again = choose_variants(own_kernels, ("exact",), timer, "s", 2,
                                    setting="", probe=FakeProbe())  # fmt: skip
            assert again is choice and len(calls) == timed
            tuner._TIMED.clear()  # the next load is another process
    # over all 60 rounds the median ratio ties (40 of them slow); the fast
    # rounds decide
    assert choice.variants["exact"].name == "bf16_exact_avx512"
    assert record["settled"] and "pooled over 3 loads" in err
    assert record["evidence"]["exact"]["decided_rounds"] == ROUNDS
    timed = len(calls)
    cached = choose(own_kernels, calls, probe=FakeProbe())
    assert cached.how == "cached" and len(calls) == timed
    assert cached.variants["exact"].name == "bf16_exact_avx512"


def test_ties_settle_on_the_default_and_retune_starts_afresh(own_kernels, capsys):
    tie = {n: 0.040 for n in EXACT}
    path = cache_path(own_kernels, "s", 2)
    for _ in range(SETTLE_TUNINGS):
        tuner._TIMED.clear()
        choice = choose_variants(own_kernels, ("exact",), names_timer(tie, []),
                                 "s", 2, setting="", probe=FakeProbe())  # fmt: skip
    assert choice.variants["exact"].name == "bf16_exact_avx2"
    assert json.loads(path.read_text())["settled"]
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "undecided" not in last and "pooled over 3 loads" in last
    tuner._TIMED.clear()
    assert choose(own_kernels, [], probe=FakeProbe()).how == "cached"
    fresh = choose(own_kernels, [], setting="retune", probe=FakeProbe())
    assert fresh.variants["exact"].name == "bf16_exact_avx2_eo"
    record = json.loads(path.read_text())
    assert record["tunings"] == 1 and len(record["rounds"]["exact"]) == ROUNDS


def test_a_choice_made_under_load_is_not_cached(own_kernels, capsys):
    busy = choose(own_kernels, [], probe=FakeProbe(lambda r: True))
    assert busy.how == "untuned"
    assert busy.variants["exact"].name == "bf16_exact_avx2"  # the default
    assert "nothing cached" in capsys.readouterr().err
    assert not cache_path(own_kernels, "s", 2).exists()


def test_the_environment_forces_or_skips_the_timing(own_kernels, capsys):
    calls: list[str] = []
    both = ("exact", "int8")
    default = choose(own_kernels, calls, both, setting="default")
    assert default.how == "default" and calls == []
    names = [v.name for v in default.variants.values()]
    assert names == ["bf16_exact_avx2", "int8_avx2"]
    forced = choose(own_kernels, calls, both, setting="bf16_exact_avx2_np")
    assert forced.how == "forced" and calls == []
    assert forced.summary() == "bf16_exact_avx2_np, int8_avx2 (forced)"
    capsys.readouterr()
    unknown = choose(own_kernels, calls, both, setting="bf16_turbo")
    assert unknown.how == "default"
    assert "no kernel variant 'bf16_turbo'" in capsys.readouterr().out
    only_avx2 = frozenset({"avx2"})
    lacking = choose(
        own_kernels, calls, setting="bf16_exact_avx512", features=only_avx2
    )
    assert lacking.variants["exact"].name == "bf16_exact_avx2"
    assert "cannot run on this CPU" in capsys.readouterr().out


def test_fake_cpu_features_narrow_the_candidates(own_kernels, capsys):
    calls: list[str] = []
    only_avx2 = frozenset({"avx2"})
    choice = choose(own_kernels, calls, features=only_avx2, probe=FakeProbe())
    assert "bf16_exact_avx512" not in calls and "bf16_exact_avx2_np" in calls
    assert choice.variants["exact"].name == "bf16_exact_avx2_eo"


def test_a_folder_others_can_write_gets_no_choice(own_kernels, capsys):
    own_kernels.path.parent.chmod(0o777)
    choice = choose(own_kernels, [], probe=FakeProbe())
    assert choice.how == "tuned"  # holds for this process
    assert not cache_path(own_kernels, "s", 2).exists()


def test_the_native_step_of_a_tiny_model_keeps_the_defaults_quietly(kernels, capsys):
    cfg = tiny_config(context_length=64, dtype=torch.bfloat16)
    model = FastQwen3.from_state_dict(cfg, tiny_state_dict(5, cfg))
    assert model.use_native_step(variants="")  # tune: a pass is microseconds
    assert model.decode_step.choice.how == "default"
    assert model.decode_step.choice.summary() == "bf16_exact_avx2 (default)"
    assert capsys.readouterr().err == ""
