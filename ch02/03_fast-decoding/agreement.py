r"""How close the approximate fast paths are to the eager bf16 fast path.

    QWEN3_STANDIN=1 uv run python ch02/03_fast-decoding/agreement.py \
        [--prompts 8] [--tokens 30]

For each pair (reference, candidate) it follows the reference's greedy
continuation of each prompt (teacher-forced) and prints the share of steps
where both pick the same token, the largest logit difference relative to the
largest reference logit, and the share of prompts whose free-running greedy
continuations are identical (`int8_agreement` below). The candidates are
the fast decoder's registry paths `fast_native`, `fast_eager_int8` and
`fast_native_int8`, against `fast` (eager bf16).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

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


def int8_agreement(
    reference: Any,
    quantized: Any,
    prompts: Sequence[torch.Tensor],
    max_new_tokens: int = 50,
) -> dict[str, float]:
    """How close `quantized` (e.g. an int8 or native FastQwen3) is to
    `reference` (bf16).

    Along each prompt's greedy continuation by `reference` (teacher-forced):
    `token_agreement` = share of steps where both pick the same token;
    `logits_max_rel_error` = max |logit difference| / max |reference logit|
    over all steps; plus `identical_continuations` = share of prompts whose
    free-running greedy continuations are identical."""
    from utils.fast import generate

    same = steps = identical = 0
    worst = 0.0
    for prompt in prompts:
        prompt = prompt.reshape(1, -1)
        seq = torch.cat(list(generate(reference, prompt, max_new_tokens)), dim=1)
        free = torch.cat(list(generate(quantized, prompt, max_new_tokens)), dim=1)
        identical += int(torch.equal(seq, free))
        s, n, w = _teacher_forced(reference, quantized, prompt, seq)
        same, steps, worst = same + s, steps + n, max(worst, w)
    return {
        "token_agreement": same / max(steps, 1),
        "logits_max_rel_error": worst,
        "identical_continuations": identical / max(len(prompts), 1),
        "steps": float(steps),
    }


def _teacher_forced(
    reference: Any, quantized: Any, prompt: torch.Tensor, seq: torch.Tensor
) -> tuple[int, int, float]:
    """(equal greedy picks, steps, worst relative logit error) of both
    models fed `prompt` then `seq`, one token at a time."""
    from utils.fast import decode_one_token, prefill

    for model in (reference, quantized):
        model.setup_cache(1, prompt.shape[1] + seq.shape[1])
    ref_tok, ref_logits = prefill(reference, prompt)
    q_tok, q_logits = prefill(quantized, prompt)
    pos = torch.tensor([prompt.shape[1]])
    same = steps = 0
    worst = 0.0
    for i in range(seq.shape[1]):
        err = (q_logits.float() - ref_logits.float()).abs().max()
        worst = max(worst, float(err / ref_logits.float().abs().max()))
        same += int(torch.equal(q_tok, ref_tok))
        steps += 1
        if i + 1 == seq.shape[1]:
            break
        tok = seq[:, i : i + 1]
        kv = int(pos) + 1
        ref_tok, ref_logits = decode_one_token(reference, tok, pos, kv)
        q_tok, q_logits = decode_one_token(quantized, tok, pos, kv)
        pos = pos + 1
    return same, steps, worst


CANDIDATES = (
    ("native (bf16)", "fast_native"),
    ("int8, eager", "fast_eager_int8"),
    ("int8, native", "fast_native_int8"),
)


def _parser():
    from utils.errors import CommandParser

    parser = CommandParser(
        prog="agreement.py",
        description="How close the approximate fast paths (native, int8) are "
        "to the eager bf16 fast path.",
    )
    parser.add_argument(
        "--prompts",
        type=int,
        default=8,
        help=f"how many of the {len(PROMPTS)} built-in prompts",
    )
    parser.add_argument(
        "--tokens", type=int, default=30, help="greedy tokens per prompt"
    )
    parser.add_argument("--out-dir", default=None,
                        help="folder of the model files (default: the per-user "
                        "store; stand-ins with QWEN3_STANDIN=1)")  # fmt: skip
    return parser


def _run(args) -> int:
    from utils.benchmark import prompt_token_ids
    from utils.download import download_qwen3_small
    from utils.errors import UsageError
    from utils.fast import get_path
    from utils.models import load_book_model_file

    if not 1 <= args.prompts <= len(PROMPTS) or args.tokens < 1:
        raise UsageError(f"--prompts must be 1 to {len(PROMPTS)}, --tokens >= 1")
    reason = get_path("fast_native").unavailable("cpu")
    if reason is not None:
        raise UsageError(f"the native step cannot run here: {reason}")
    cpu = torch.device("cpu")
    files = download_qwen3_small("base", out_dir=args.out_dir)  # or stand-ins
    book = load_book_model_file(files.model, cpu, torch.bfloat16)
    prompts = [prompt_token_ids(files.tokenizer, p, cpu)
               for p in PROMPTS[: args.prompts]]  # fmt: skip
    eager = get_path("fast").build(book)  # every model shares the book's weights
    print(f"vs the eager bf16 fast path, {len(prompts)} prompts x {args.tokens} tokens")
    print(
        "| candidate | same greedy token | max logit error | identical continuations |"
    )
    print("|---|---|---|---|")
    for name, path in CANDIDATES:
        got = int8_agreement(eager, get_path(path).build(book), prompts, args.tokens)
        print(
            f"| {name} | {got['token_agreement']:.1%} | "
            f"{got['logits_max_rel_error']:.2%} | "
            f"{got['identical_continuations']:.0%} |"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    from utils.errors import run_command

    args = _parser().parse_args(argv)
    return run_command("agreement.py", lambda: _run(args))


if __name__ == "__main__":
    raise SystemExit(main())
