"""Helpers for Chapter 2 of *Build a Reasoning Model (From Scratch)*.

Nothing here runs at import time; import the module you need.

Room 1, utils/: the chapter's helpers (what the notebooks import) and the
commands. It never imports room 2 at module level.
    device         get_device() as in Listing 2.1, environment summary; the one
                   device synchronise and peak-memory helpers
    download       download_qwen3_small(): Hugging Face, then the book's mirror;
                   resume, bounded waits, one download per folder
    standin        offline stand-ins (real tokenizer, random 0.6B-shaped weights)
    provenance     verification records, stand-in markers, content checks
    models         the one loader of the book's model and the one shape check
    generation     Listings 2.2-2.4 and generate_stats() (Listing 2.3)
    compile        torch.compile the book's way (its dynamo setting), eager
                   fallback and hints: the one place that compiles the book's model
    token_view     token tables and next-token views (no widgets)
    widgets        token explorer, next-token view, live generation panel
    plotting       chart labels in the notebook's language, a CJK font fallback
    streaming      the one text-streaming loop behind the CLI and the panel
    qwen3_tokenizer  the exact Qwen3 tokenizer rebuilt offline; token-id constants
    fileio, errors   write-then-rename files; the commands' one error style
    stdio          the commands' streams: UTF-8 to files and pipes, input checked
    cli            the qwen3-generate and qwen3-chat commands
    benchmark      Table 2.1 runner: `python -m utils.benchmark`
    hf_interop     official Qwen3 safetensors <-> the book's model; import-qwen3

Room 2, utils/fast/: the fast decoder for the same weights, beyond the
chapter (gpt-fast's order): model, quantize (int8), steps (eager, compiled,
native; prefill, generate), native, kernels, build + csrc/ (the
C kernels, built on first use, F.linear fallback). See ch02/03_fast-decoding/.

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
