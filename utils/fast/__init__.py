"""The fast decoder: the book's Qwen3 weights, decoded faster (beyond Chapter 2).

The door: `paths` is the registry of decode paths that the benchmark, the
command line, the generation panel and the bonus scripts use (`PATHS`,
`get_path`, `path_for`, `DecodePath.build`); `bandwidth` measures a step
against the machine's memory speed. Behind it, in gpt-fast's order:
`model` (the book's Qwen3 with a static KV cache), `quantize` (weight-only
int8 layers), `steps` (eager, compiled and native decode steps; prefill,
decode, generate, pick_faster), `native` (the whole decode step as one C
call), `kernels` (the CPU matrix-vector products as torch operators),
`dispatch` (which kernel runs, by CPU features), `build` (compiling and
caching the C library in `csrc/`). How it works and what it measured:
ch02/03_fast-decoding/README.md.

Importing this package builds nothing; the C library is built on first use.
"""

from utils.fast.bandwidth import (
    measure_read_bandwidth,
    paired_share,
    read_buffer,
    time_beside_sum,
    weight_bytes_per_token,
)
from utils.fast.dispatch import kernel_table
from utils.fast.kernels import get_kernels
from utils.fast.model import StaticQwen3, cache_length_for
from utils.fast.paths import PATHS, DecodePath, describe_step, get_path, path_for
from utils.fast.quantize import Int8Embedding, Int8Linear, quantize_int8
from utils.fast.steps import (
    CompiledStep,
    DecodeStep,
    EagerStep,
    FastQwen3,
    decode_one_token,
    generate,
    pick_faster,
    prefill,
)

__all__ = [
    "PATHS",
    "CompiledStep",
    "DecodePath",
    "DecodeStep",
    "EagerStep",
    "FastQwen3",
    "Int8Embedding",
    "Int8Linear",
    "StaticQwen3",
    "cache_length_for",
    "decode_one_token",
    "describe_step",
    "generate",
    "get_kernels",
    "get_path",
    "kernel_table",
    "measure_read_bandwidth",
    "paired_share",
    "path_for",
    "pick_faster",
    "prefill",
    "quantize_int8",
    "read_buffer",
    "time_beside_sum",
    "weight_bytes_per_token",
]
