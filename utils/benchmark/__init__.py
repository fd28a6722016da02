"""The book's Table 2.1, measured: tokens/sec, time to first token and memory
per way of generating (`python -m utils.benchmark`).

The door: `run_benchmark` and the table and chart the notebook shows, the
prompt the modes share, and the bandwidth yardstick the bonus scripts use.
Behind it: `runner` (arguments, modes in turn, the command), `modes` (one
timed run of one mode), `report` (table, details, JSON, CSV, chart),
`outputs` (the files asked for, checked before any work) and `bandwidth`
(a decode step's bytes beside a `torch.sum` of as many).
"""

from utils.benchmark.bandwidth import (
    measure_read_bandwidth,
    read_buffer,
    time_beside_sum,
    weight_bytes_per_token,
)
from utils.benchmark.report import format_table, plot_results
from utils.benchmark.runner import (
    DEFAULT_PROMPT,
    main,
    prompt_token_ids,
    run_benchmark,
    synthetic_prompt,
)

__all__ = [
    "DEFAULT_PROMPT", "format_table", "main", "measure_read_bandwidth",
    "plot_results", "prompt_token_ids", "read_buffer", "run_benchmark",
    "synthetic_prompt", "time_beside_sum", "weight_bytes_per_token",
]  # fmt: skip
