"""Helpers for Chapter 2 of *Build a Reasoning Model (From Scratch)*.

Nothing here runs at import time; import the module you need.

What the notebooks import (the chapter itself):
    device         get_device() as in Listing 2.1, plus an environment summary
    download       download_qwen3_small(): Hugging Face, then the book's mirror;
                   resume, bounded waits, one download per folder
    standin        offline stand-ins (real tokenizer, random 0.6B-shaped weights)
    provenance     verification records, stand-in markers, content checks
    generation     Listings 2.2-2.4 and generate_stats() (Listing 2.3)
    compile        torch.compile the book's way, with an eager fallback and hints
    token_view     token tables and next-token views (no widgets)
    widgets        token explorer, next-token view, live generation panel
    plotting       chart labels in the notebook's language, a CJK font fallback

Beyond the chapter (speed, tools, interop):
    streaming      the one text-streaming loop behind the CLI and the panel
    fast/          the fast decoder for the same weights (gpt-fast style): model,
                   quantize (int8), steps (eager/compiled/native, generate),
                   kernels + csrc/ (AVX2 C, F.linear fallback); see
                   ch02/03_fast-decoding/
    benchmark      Table 2.1 runner: `python -m utils.benchmark`
    hf_interop     official Qwen3 safetensors <-> the book's model; import-qwen3
    cli            the qwen3-generate and qwen3-chat commands
    qwen3_tokenizer  the exact Qwen3 tokenizer rebuilt offline; token-id constants
    fileio, errors   write-then-rename files; one-line error text

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
