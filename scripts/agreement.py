"""How close the approximate fast paths are to the eager bf16 fast path.

    QWEN3_STANDIN=1 uv run python scripts/agreement.py [--prompts 8] [--tokens 30]

For each pair (reference, candidate) it follows the reference's greedy
continuation of each prompt (teacher-forced) and prints the share of steps
where both pick the same token, the largest logit difference relative to the
largest reference logit, and the share of prompts whose free-running greedy
continuations are identical (`utils.quantize.int8_agreement`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = [
    "Explain large language models in a single sentence.",
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "List three prime numbers.",
    "How does a KV cache speed up decoding?",
    "Translate 'good morning' into Chinese.",
    "Why is the sky blue?",
    "Give me a short recipe for pancakes.",
]


def main(argv: list[str] | None = None) -> int:
    from utils.benchmark import load_book_model, prompt_token_ids
    from utils.fast_decode import FastQwen3
    from utils.quantize import int8_agreement, quantize_int8

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="at most 8")
    parser.add_argument("--tokens", type=int, default=30)
    parser.add_argument("--out-dir", default="qwen3")
    args = parser.parse_args(argv)
    cpu = torch.device("cpu")
    book, tokenizer, _ = load_book_model(cpu, torch.bfloat16, out_dir=args.out_dir)
    prompts = [prompt_token_ids(tokenizer, p, cpu) for p in PROMPTS[: args.prompts]]

    def fast(native: bool = False, int8: bool = False) -> FastQwen3:
        model = FastQwen3.from_book_model(book)  # shares the book's weights
        if int8:
            model = quantize_int8(model)
        if native and not model.use_native_step():
            raise SystemExit("the native step cannot run here")
        return model

    eager = fast()
    pairs = [
        ("native (bf16)", eager, fast(native=True)),
        ("int8, eager", eager, fast(int8=True)),
        ("int8, native", eager, fast(native=True, int8=True)),
    ]
    print(f"vs the eager bf16 fast path, {len(prompts)} prompts x {args.tokens} tokens")
    print(
        "| candidate | same greedy token | max logit error | identical continuations |"
    )
    print("|---|---|---|---|")
    for name, ref, cand in pairs:
        got = int8_agreement(ref, cand, prompts, args.tokens)
        print(
            f"| {name} | {got['token_agreement']:.1%} | "
            f"{got['logits_max_rel_error']:.2%} | "
            f"{got['identical_continuations']:.0%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
