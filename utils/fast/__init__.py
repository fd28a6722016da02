"""The fast decoder: the book's Qwen3 weights, decoded faster (beyond Chapter 2).

The door is `paths`, the registry of decode paths the rest of the project
uses. Behind it: `model` (static KV cache), `quantize` (int8 weights),
`steps` (eager, compiled and native decode steps), `native` (the step as
one C call, for one row or several), `batch` (many sequences at once),
`kernels` and `dispatch` (the C matrix-vector kernels, chosen by CPU
features), `build` (compiles `csrc/` on first use). How it works:
ch02/03_fast-decoding/README.md.
"""

from utils.fast.batch import BatchDecoder, Event, Request, step_rates
from utils.fast.dispatch import kernel_table
from utils.fast.hugepages import huge_page_empty, huge_pages_enabled
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
    prefill,
    prefill_at,
)
from utils.fast.threads import pin_step_threads

__all__ = [
    "PATHS",
    "BatchDecoder",
    "Event",
    "Request",
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
    "huge_page_empty",
    "huge_pages_enabled",
    "kernel_table",
    "path_for",
    "pin_step_threads",
    "prefill",
    "prefill_at",
    "quantize_int8",
    "step_rates",
]
