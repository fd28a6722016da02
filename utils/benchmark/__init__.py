"""The book's Table 2.1, measured: tokens/sec, time to first token and memory
per way of generating (`python -m utils.benchmark`).

The door: `run_benchmark` and the table and chart the notebook shows, the
prompt the modes share, and the bandwidth yardstick the bonus scripts use.
Behind it: `runner` (arguments, modes in turn, the command), `modes` (one
timed run of one mode), `report` (table, details, JSON, CSV, chart),
`outputs` (the files asked for, checked before any work) and `bandwidth`
(a decode step's bytes beside a `torch.sum` of as many).

Each name is imported from its module on first use, not here: `python -m
utils.benchmark` imports this package before its `__main__` runs, and
torch's import (seconds) then happens inside the command, where Ctrl-C
ends it with one line instead of a traceback.
"""

from utils.lazy import lazy_attributes

__all__ = [
    "DEFAULT_PROMPT", "format_table", "main", "measure_read_bandwidth",
    "plot_results", "prompt_token_ids", "read_buffer", "run_benchmark",
    "synthetic_prompt", "time_beside_sum", "weight_bytes_per_token",
]  # fmt: skip

_HOMES = {
    "bandwidth": ("measure_read_bandwidth", "read_buffer", "time_beside_sum",
                  "weight_bytes_per_token"),
    "report": ("format_table", "plot_results"),
    "runner": ("DEFAULT_PROMPT", "main", "prompt_token_ids", "run_benchmark",
               "synthetic_prompt"),
}  # fmt: skip
PROG = "python -m utils.benchmark"  # the command's name in its messages


__getattr__ = lazy_attributes(__name__, _HOMES)
