"""Helpers for Chapter 2 of *Build a Reasoning Model (From Scratch)*.

Nothing here runs at import time; import the module you need.

Directly in utils/, the chapter's helpers (what the notebooks import):
    device, models, generation, compile, streaming, chat_cache, token_view,
    widgets, plotting, qwen3_tokenizer; and the small shared ones: settings,
    log, errors, fileio, linksafe, stdio. They never import utils.fast at
    module level. The ways to generate have one registry,
    streaming.generation_paths(): the book's (generation.BOOK_PATHS), then
    the fast decoder's (fast.PATHS); the benchmark, the commands and the
    panel ask it.

Packages, each used through its door (its __init__.py):
    download     download_qwen3_small(), the model store, content checks and
                 records, offline stand-ins (QWEN3_STANDIN=1)
    benchmark    Table 2.1: `python -m utils.benchmark`
    cli          the qwen3-generate and qwen3-chat commands
    hf_interop   official Qwen3 safetensors <-> the book's files
    fast         the fast decoder for the same weights, beyond the chapter
                 (static KV cache, native C kernels, int8); its registry of
                 decode paths is its door. See ch02/03_fast-decoding/.

Helpers that share a name with the book's package (reasoning_from_scratch):
    download_qwen3_small       returns the file paths (the book's returns None);
                               stand-ins with QWEN3_STANDIN=1
    get_device                 same choice of device; TF32 switch at torch 2.11,
                               as the package 0.2.0 does
    generate_text_basic_stream[_cache]
                               the book's loops, plus input checks that say what
                               to fix
    generate_stats             the book's printed lines; returns a dict and reports
                               peak RSS on a CPU
"""
