"""Which kernel variant the native step runs: measured on each machine.

Why measure: which kernel reads the weights fastest depends on the CPU's
cores and on its memory (AVX-512 forms have compute to spare, which pays
only where the memory streams faster than an AVX2 loop consumes; software
prefetch helps some cores and slows others), and no table of CPU models
tells. So for each class the step uses, the variants that may run here
(`utils.fast.variants.usable_variants`) are timed on the model's own
products: `qwen3_step_products`, the step's calls in its order and
grouping, every weight read once.

How (`tune`): a warm-up round, then rounds in which every candidate runs
once, in an order rotated each round; a candidate's time is divided by the
default's time of the same round (a shared machine's memory speed drifts
between rounds, hardly within one). A round counts only if the process had
the CPUs to itself (`LoadProbe`): its CPU time at least 90 % of threads x
wall time (a descheduled thread shows as missing CPU time) and, where
/proc/stat can be read, other processes below 6 % of the machine. With
fewer than 3 clean rounds the default is kept and nothing is cached.
Decision (`decide`): the candidate with the lowest median ratio, unless
the default's median is within `margin` of it (the reference kernel is
kept where the others are not measurably faster). Only the rounds in which
the memory ran fastest count (`fastest_rounds`: a round's pace is the
geometric mean of all its passes, the default's luck weighing no more in
it than any other candidate's, so rounds are picked for the memory): the
variants differ when the memory streams fast and tie when it is slow, and
a shared machine's memory changes speed from minute to minute. A tie is
not final (`settle`): the rounds are kept with the choice and the next
load times again, pooling its rounds with the earlier ones, until one
variant is measurably fastest or `SETTLE_TUNINGS` loads have timed.
The cache-resident speed of each candidate (`hot_rate`) is recorded with
the choice but does not decide: it does not predict the streamed speed.
On a 2-core Zen 5 VM the AVX-512 forms read cached weights 3-4x faster
than the AVX2 ones, yet in whole steps with 55-60 GB/s memory
`bf16_exact_avx512_s2` (a two-section form since dropped) ran at
0.76-0.80 of torch.sum where
`bf16_exact_avx2_eo`, 2 % ahead of it in the tuner's timing, ran at
0.88-0.91 (and `int8_avx512vnni` at 0.71 where `int8_avx512vnni_s2` ran
at 0.80); a tie-break by that speed had picked the slower ones.

The choice is cached next to the kernel library (`kernel_cache_dir`),
keyed by the library, the CPU, the thread count and the model's shapes,
under the library's integrity rules (a private folder, a SHA-256 record,
a fresh file renamed into place). `QWEN3_KERNEL_VARIANTS` overrides it:
"default" (the AVX2 kernels, no timing), "retune", or variant names to
force (e.g. "bf16_exact_avx512,int8_avx512vnni").
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import utils.fast.build as build
from utils.fast.kernels import Kernels
from utils.fast.variants import Variant, usable_variants, variant_table
from utils.fileio import atomic_write_bytes

__all__ = [
    "BUDGET_S",
    "ENV",
    "ROUNDS",
    "SETTLE_TUNINGS",
    "Choice",
    "LoadProbe",
    "Tuning",
    "choose_variants",
    "decide",
    "fastest_rounds",
    "hot_rate",
    "settle",
    "tune",
]

ENV = "QWEN3_KERNEL_VARIANTS"
VERSION = 4  # of the cached record and of the rules above
# Clean rounds to time, and the seconds allowed for them: one round's ratio
# to the default scatters by +-5-8 % on a shared machine, so 5 rounds (the
# first setting) often picked a variant slower over the long run (numbers
# in the fast-decoding README); 20 take about 4 s for the 0.6B model's bf16
# variants on 2 cores, once per machine and build.
ROUNDS = 20
BUDGET_S = 12.0
# Loads that time the variants while they tie (a choice made in a slow
# minute): on a 2-core Zen 4 VM all bf16 variants timed within 3 % of the
# default at 33-53 GB/s, while at 57 GB/s `bf16_exact_avx512` took 0.91 of
# its time and whole steps read at 0.95 of torch.sum against 0.84.
SETTLE_TUNINGS = 3
# The rounds that decide: those within FAST_WINDOW of the fastest pace
# pooled so far, at least MIN_FAST of them.
FAST_WINDOW = 0.15
MIN_FAST = 8


@dataclass
class Choice:
    """The variant per class and how it was reached: "tuned", "cached",
    "forced" ($QWEN3_KERNEL_VARIANTS), "default" (asked for, or nothing
    to choose from) or "untuned" (could not measure cleanly)."""

    variants: dict[str, Variant]
    how: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """e.g. "bf16_exact_avx512 (tuned)"."""
        names = ", ".join(v.name for v in self.variants.values())
        return f"{names} ({self.how})"


# ---------------------------------------------------------------------------
# Measuring: load, rounds, the decision
# ---------------------------------------------------------------------------


class LoadProbe:
    """This process's CPU time, and where /proc/stat exists every CPU's busy
    time, to tell whether a round ran on an otherwise quiet machine."""

    own_share = 0.9  # of threads x wall: less means a thread waited
    foreign_share = 0.06  # of all CPUs x wall: more means others ran

    def __init__(self) -> None:
        self.cpus = os.cpu_count() or 1
        self.tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01

    def _busy(self) -> float | None:
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        idle = ticks[3] + ticks[4]  # idle, iowait
        return (sum(ticks) - idle) * self.tick

    def sample(self) -> tuple[float, float, float, float | None]:
        """(wall, own CPU, own CPU in ticks' resolution, all CPUs' busy)."""
        t = os.times()
        return time.perf_counter(), time.process_time(), t.user + t.system, self._busy()

    def clean(self, start: tuple, end: tuple, threads: int) -> bool:
        """Whether the interval between two samples ran undisturbed."""
        wall = end[0] - start[0]
        if end[1] - start[1] < self.own_share * threads * wall:
            return False
        if start[3] is None or end[3] is None:
            return True
        foreign = (end[3] - start[3]) - (end[2] - start[2])
        slack = 2 * self.tick  # both counters tick
        return foreign <= max(self.foreign_share * self.cpus * wall, slack)


@dataclass
class Tuning:
    """The outcome of `tune`: the chosen name (the default when it could not
    measure cleanly), per candidate the time ratios of the clean rounds,
    the rounds counted and run, the seconds taken and why it fell back."""

    choice: str
    ratios: dict[str, list[float]]
    clean: int
    rounds: int
    seconds: float
    reason: str | None = None
    short: bool = False  # a pass too short to time: nothing was measured
    # the rounds the choice was decided over (earlier loads' and these), and
    # what `settle` made of them
    pool: list[Round] = field(default_factory=list)
    settled: bool = True
    decided_by: dict[str, float] = field(default_factory=dict)
    decided_rounds: int = 0

    def medians(self) -> dict[str, float]:
        return {n: statistics.median(r) for n, r in self.ratios.items() if r}


# one clean round: its pace (geometric mean of its pass times, seconds) and
# each candidate's time divided by the default's
Round = tuple[float, dict[str, float]]


def decide(
    ratios: Mapping[str, Sequence[float]], default: str, margin: float = 0.03
) -> str:
    """The candidate to run: the lowest median time ratio (to the default,
    same rounds), or the default where its median is within `margin` of
    that one's."""
    medians = {n: statistics.median(r) for n, r in ratios.items() if r}
    if default not in medians:
        return default
    best = min(medians, key=lambda n: (medians[n], n != default))
    return default if medians[default] <= medians[best] + margin else best


def fastest_rounds(
    paces: Sequence[float], window: float = FAST_WINDOW, least: int = MIN_FAST
) -> list[int]:
    """Indices (in order) of the rounds whose pace is within `window` of
    the fastest, or of the `least` fastest where fewer are: the rounds in
    which the memory streamed fastest."""
    order = sorted(range(len(paces)), key=paces.__getitem__)
    if not order:
        return []
    limit = paces[order[0]] * (1 + window)
    near = sum(1 for i in order if paces[i] <= limit)
    return sorted(order[: max(near, least)])


def settle(
    rounds: Sequence[Round], default: str, tunings: int, margin: float = 0.03
) -> tuple[str, bool, dict[str, float], int]:
    """`decide` over the pooled rounds in which the memory ran fastest.
    Returns the choice, whether it is final (a variant measurably fastest
    there, the default included, or `SETTLE_TUNINGS` loads timed), the
    medians it used and how many rounds."""
    keep = fastest_rounds([pace for pace, _ in rounds])
    names = rounds[keep[0]][1] if keep else {}
    ratios = {n: [rounds[i][1][n] for i in keep] for n in names}
    choice = decide(ratios, default, margin)
    medians = {n: statistics.median(r) for n, r in ratios.items() if r}
    others = [m for n, m in medians.items() if n != default]
    clear = choice != default or all(m > 1 + margin for m in others)
    return choice, clear or tunings >= SETTLE_TUNINGS, medians, len(keep)


def tune(
    time_pass: Callable[[str], float],
    candidates: Sequence[str],
    default: str,
    threads: int,
    probe: LoadProbe | None = None,
    rounds: int = ROUNDS,
    budget_s: float = BUDGET_S,
    margin: float = 0.03,
    min_pass_s: float = 0.002,
    earlier: Sequence[Round] = (),
    tunings: int = 1,
) -> Tuning:
    """Time `candidates` (the default among them) with `time_pass(name)` ->
    seconds of one pass over the model's products, in rotated rounds, and
    `settle` over them pooled with the `earlier` rounds of an undecided
    record (this being load number `tunings`); see the module docstring.
    Keeps the default, with a reason, when a pass is too short to time (the
    default's first or second under `min_pass_s`: a small model), when the
    first 4 rounds are all disturbed or when the budget ends before 3 clean
    rounds."""
    probe = probe or LoadProbe()
    names = list(dict.fromkeys([default, *candidates]))
    ratios: dict[str, list[float]] = {n: [] for n in names}
    paces: list[float] = []
    start, clean, r = time.perf_counter(), 0, 0
    while clean < rounds and time.perf_counter() - start < budget_s:
        if r >= 4 and clean == 0:
            break
        order = names[r % len(names) :] + names[: r % len(names)]
        before = probe.sample()
        times = {n: time_pass(n) for n in order}
        undisturbed = probe.clean(before, probe.sample(), threads)
        # the first pass starts cold (a first touch, a preempted thread): a
        # small model is told by its shorter of the first two
        if r <= 1 and times[default] < min_pass_s:
            reason = f"one pass takes {times[default] * 1e3:.2f} ms, too short to time"
            seconds = time.perf_counter() - start
            return Tuning(default, ratios, 0, r + 1, seconds, reason, short=True)
        if r and undisturbed:  # round 0 warms up
            clean += 1
            for n in names:
                ratios[n].append(times[n] / times[default])
            paces.append(statistics.geometric_mean(times.values()))
        r += 1
    seconds = time.perf_counter() - start
    if clean < 3:
        reason = f"{clean} of {r} rounds undisturbed by other processes"
        return Tuning(default, ratios, clean, r, seconds, reason)
    own = [(p, {n: ratios[n][i] for n in names}) for i, p in enumerate(paces)]
    pool = [old for old in earlier if set(old[1]) == set(names)] + own
    pool = pool[-SETTLE_TUNINGS * rounds :]
    choice, settled, medians, used = settle(pool, default, tunings, margin)
    return Tuning(
        choice, ratios, clean, r, seconds,
        pool=pool, settled=settled, decided_by=medians, decided_rounds=used,
    )  # fmt: skip


def hot_rate(kernels: Kernels, variant: Variant, reps: int = 200) -> float:
    """Bytes/s of `variant` on one thread over a cache-resident 512 KB
    matrix (best of 3): the kernel's own speed, the memory left out."""
    return _hot_rate(kernels.library, variant, reps)


@functools.cache
def _hot_rate(library: build.Library, variant: Variant, reps: int) -> float:
    kernels = Kernels(library)
    import array

    import torch

    gen = torch.Generator().manual_seed(0)
    k = 1024
    if variant.cls == "int8":
        w = torch.randint(-127, 128, (512, k), dtype=torch.int8, generator=gen)
        scales = torch.rand(512, generator=gen)
        s_ptr = scales.data_ptr()
    else:
        w = torch.randn(256, k, generator=gen).bfloat16()
        s_ptr = None
    x = torch.randn(k, generator=gen).bfloat16().float()
    y = array.array("f", [0.0] * w.shape[0])
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        rc = kernels.lib.qwen3_variant_hot(
            variant.index, x.data_ptr(), w.data_ptr(), s_ptr, w.shape[0], k, reps,
            y.buffer_info()[0],
        )  # fmt: skip
        best = min(best, time.perf_counter() - t0)
        if rc:
            raise RuntimeError(f"{variant.name}: hot loop failed with code {rc}")
    return w.numel() * w.element_size() * reps / best


# ---------------------------------------------------------------------------
# The cached choice
# ---------------------------------------------------------------------------


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_path(kernels: Kernels, shapes: str, threads: int) -> Path:
    """Where the choice for this library, CPU, thread count and model
    shapes is kept: beside the library, in the same private folder."""
    features = kernels.lib.qwen3_cpu_features()
    parts = [kernels.path.name, _cpu_name(), features, threads, shapes, VERSION]
    key = "\0".join(str(part) for part in parts)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return kernels.path.with_name(f"variants_{digest}.json")


@dataclass
class Record:
    """A cached choice: the variant per class, whether it is final, how many
    loads have timed, and their pooled rounds per class."""

    variants: dict[str, Variant]
    settled: bool
    tunings: int
    rounds: dict[str, list[Round]] = field(default_factory=dict)


def load_choice(path: Path, usable: Mapping[str, Sequence[Variant]]) -> Record | None:
    """The cached record at `path` if it verifies and every name is a
    usable variant of its class; else None (tuned again)."""
    if not build.verified(path):
        return None
    try:
        data = json.loads(path.read_text())
        names = dict(data["variants"])
        rounds = {
            c: [(float(p), {n: float(r) for n, r in rs.items()}) for p, rs in v]
            for c, v in data.get("rounds", {}).items()
        }
        settled, tunings = bool(data["settled"]), int(data["tunings"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    by_name = {v.name: v for vs in usable.values() for v in vs}
    ok = all(
        by_name.get(n) is not None and by_name[n].cls == c for c, n in names.items()
    )
    if not ok:
        return None
    variants = {c: by_name[n] for c, n in names.items()}
    return Record(variants, settled, tunings, rounds)


def save_choice(path: Path, record: Record, evidence: dict) -> None:
    """Write the choice: a fresh file renamed into place, then its record;
    a folder that is not private is refused (nothing written)."""
    build.check_private_dir(path.parent)
    data = {
        "version": VERSION,
        "variants": {c: v.name for c, v in record.variants.items()},
        "settled": record.settled,
        "tunings": record.tunings,
        "evidence": evidence,
        "cpu": _cpu_name(),
        "rounds": {
            c: [[round(p, 7), {n: round(r, 5) for n, r in rs.items()}] for p, rs in v]
            for c, v in record.rounds.items()
        },
    }
    blob = (json.dumps(data, indent=1) + "\n").encode()
    atomic_write_bytes(path, blob)
    atomic_write_bytes(
        build.record_path(path), hashlib.sha256(blob).hexdigest().encode()
    )


# ---------------------------------------------------------------------------
# What the native step calls
# ---------------------------------------------------------------------------


def _forced(
    text: str,
    classes: Sequence[str],
    usable: Mapping[str, Sequence[Variant]],
    table: Sequence[Variant],
) -> dict[str, Variant]:
    """The variants $QWEN3_KERNEL_VARIANTS names for `classes` (the default
    where it names none); one line for each name that cannot run here."""
    chosen = {c: usable[c][0] for c in classes}
    known = {v.name: v for v in table}
    for name in (n.strip() for n in text.split(",") if n.strip()):
        v = known.get(name)
        if v is None:
            print(
                f"utils.fast: {ENV} names no kernel variant {name!r} (known: "
                f"{', '.join(known)})"
            )
        elif v not in usable[v.cls]:
            print(
                f"utils.fast: kernel variant {name} cannot run on this CPU; "
                f"using {chosen.get(v.cls, usable[v.cls][0]).name}"
            )
        elif v.cls in chosen:
            chosen[v.cls] = v
    return chosen


def choose_variants(
    kernels: Kernels,
    classes: Sequence[str],
    time_pass: Callable[[Mapping[str, Variant]], float],
    shapes: str,
    threads: int,
    setting: str | None = None,
    features: frozenset[str] | None = None,
    probe: LoadProbe | None = None,
) -> Choice:
    """The variant per class in `classes` for the native step: forced or
    default by `setting` (None: $QWEN3_KERNEL_VARIANTS), else cached, else
    tuned with `time_pass({class: variant})` -> seconds of one pass over
    the model's products, and cached when measured cleanly. `features`
    and `probe` stand in for the CPU's and the machine's (tests)."""
    usable = usable_variants(kernels, features)
    if setting is None:
        setting = os.environ.get(ENV, "")
    setting = setting.strip()
    defaults = {c: usable[c][0] for c in classes}
    if setting == "default":
        return Choice(defaults, "default")
    if setting not in ("", "tune", "retune"):
        forced = _forced(setting, classes, usable, variant_table(kernels))
        return Choice(forced, "forced" if forced != defaults else "default")
    if all(len(usable[c]) == 1 for c in classes):
        return Choice(defaults, "default")
    path = cache_path(kernels, shapes, threads)
    cached = None if setting == "retune" else load_choice(path, usable)
    if cached is not None and set(cached.variants) != set(classes):
        cached = None
    if cached is not None and cached.settled:
        return Choice(cached.variants, "cached")
    if cached is not None and path in _TIMED:  # undecided, timed this process
        return _TIMED[path]
    choice = _tune_classes(
        kernels, classes, usable, time_pass, threads, probe, path, cached
    )
    _TIMED[path] = choice
    return choice


# undecided choices timed in this process: the next load times again, not
# the next native step made in the same process
_TIMED: dict[Path, Choice] = {}


def _tune_classes(
    kernels, classes, usable, time_pass, threads, probe, path, prior
) -> Choice:
    """Tune each class in turn (the others at their defaults), pooling the
    rounds with those of `prior` (an undecided record); cache the result
    when every class was measured cleanly; one line on stderr (none for a
    model too small to time: it keeps the defaults)."""
    chosen = {c: usable[c][0] for c in classes}
    tunings = prior.tunings + 1 if prior else 1
    record = Record(chosen, True, tunings)
    evidence: dict[str, Any] = {}
    untuned, short = [], []
    for cls in classes:
        if len(usable[cls]) == 1:
            continue
        by_name = {v.name: v for v in usable[cls]}

        def one_pass(name: str, cls: str = cls, by_name=by_name) -> float:
            return time_pass({**chosen, cls: by_name[name]})

        default = usable[cls][0].name
        earlier = prior.rounds.get(cls, []) if prior else []
        result = tune(
            one_pass, list(by_name), default, threads, probe,
            earlier=earlier, tunings=tunings,
        )  # fmt: skip
        # recorded beside the choice, not used by it (module docstring)
        hot = (
            {}
            if result.reason
            else {n: hot_rate(kernels, v) for n, v in by_name.items()}
        )
        chosen[cls] = by_name[result.choice]
        evidence[cls] = _evidence(result, hot)
        if result.reason:
            (short if result.short else untuned).append(f"{cls}: {result.reason}")
            continue
        record.rounds[cls] = result.pool
        record.settled = record.settled and result.settled
    if short and not untuned and len(short) == len(evidence):
        return Choice(chosen, "default", evidence)
    choice = Choice(chosen, "untuned" if untuned or short else "tuned", evidence)
    if choice.how == "tuned":
        try:
            save_choice(path, record, evidence)
        except (OSError, RuntimeError):
            pass  # the choice holds for this process; tuned again next time
    print(
        f"utils.fast: kernel variants timed on this machine ({threads} threads): "
        + _describe(choice, untuned + short, record),
        file=sys.stderr,
    )
    return choice


def _evidence(result: Tuning, hot: Mapping[str, float]) -> dict[str, Any]:
    """What the cached record and the printed line say about one class."""
    return {
        "time_vs_default": {n: round(m, 4) for n, m in result.medians().items()},
        "hot_gb_s": {n: round(h / 1e9, 1) for n, h in hot.items()},
        "decided_by": {n: round(m, 4) for n, m in result.decided_by.items()},
        "decided_rounds": result.decided_rounds,
        "pooled_rounds": len(result.pool),
        "clean_rounds": result.clean,
        "rounds": result.rounds,
        "seconds": round(result.seconds, 2),
    }


def _describe(choice: Choice, untuned: list[str], record: Record) -> str:
    parts = []
    for cls, v in choice.variants.items():
        ev = choice.evidence.get(cls)
        medians = (ev or {}).get("decided_by")
        if medians:
            times = ", ".join(f"{n} {m:.3f}" for n, m in medians.items())
            parts.append(
                f"{cls}: {v.name} (time / default in the rounds with the "
                f"fastest memory: {times}; {ev['decided_rounds']} of "
                f"{ev['pooled_rounds']} rounds; this load {ev['clean_rounds']} "
                f"clean rounds, {ev['seconds']:.1f} s)"
            )
    if untuned:
        parts.append(
            "the defaults kept where it could not measure cleanly ("
            + "; ".join(untuned)
            + "), nothing cached"
        )
    elif record.tunings > 1:
        parts.append(f"rounds pooled over {record.tunings} loads")
    if not untuned and not record.settled:
        left = SETTLE_TUNINGS - record.tunings
        parts.append(
            "undecided: the variants tie in this minute's memory speed; "
            f"timed again at the next load ({left} more at most)"
        )
    return "; ".join(parts)
