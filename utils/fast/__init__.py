"""The fast decoder: the book's Qwen3 weights, decoded faster (beyond Chapter 2).

Read in gpt-fast's order: `model` (the book's Qwen3 with a static KV
cache), `quantize` (weight-only int8 layers), `steps` (eager, compiled and
native decode steps; prefill, decode, generate, pick_faster). Underneath:
`kernels` (the CPU matrix-vector products as torch operators, and when
they give torch's own bits), `native` (the whole decode step as one C
call), `variants` and `tuner` (the kernel variants this CPU runs, checked
at load, and the one the native step runs, measured once per machine),
`build` (compiling and caching the C library in `csrc/`).
Measurements and how to reproduce them: ch02/03_fast-decoding/README.md.

Importing this package builds nothing; the C library is built on first use.
"""

from utils.fast.kernels import get_kernels
from utils.fast.model import StaticQwen3, cache_length_for
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
    "CompiledStep",
    "DecodeStep",
    "EagerStep",
    "FastQwen3",
    "Int8Embedding",
    "Int8Linear",
    "StaticQwen3",
    "cache_length_for",
    "decode_one_token",
    "generate",
    "get_kernels",
    "pick_faster",
    "prefill",
    "quantize_int8",
]
