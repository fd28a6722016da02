#!/usr/bin/env bash
# The GPU run in one go, for a CUDA machine (issue 13 §5): set up from the lock,
# check the fast path's tokens against the book's on CUDA in bf16, then run the
# benchmark with CUDA graphs and print one table. Budget: under 8 minutes.
#
#   bash scripts/gpu_check.sh            # stand-in weights unless QWEN3_STANDIN=0
#   OUT=/some/dir bash scripts/gpu_check.sh
#
# Not run in this repository's CI (no GPU there); `bash -n` checks its syntax.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.local/bin:$PATH"
command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
export QWEN3_STANDIN="${QWEN3_STANDIN:-1}"
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"

uv sync --locked --quiet
uv run --locked python - <<'PY'
import torch
if not torch.cuda.is_available():
    raise SystemExit("gpu_check: no CUDA device visible to PyTorch")
print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
PY

# 1. The fast path gives the book's greedy tokens on CUDA (bf16, 40 tokens).
uv run --locked python - <<'PY'
import torch
from reasoning_from_scratch.ch02 import generate_text_basic_stream_cache
from utils.download import download_qwen3_small
from utils.fast import FastQwen3, generate
from utils.models import load_book_model_file

dev = torch.device("cuda")
files = download_qwen3_small("base")
book, standin = load_book_model_file(files.model, dev, torch.bfloat16), files.standin
prompt = torch.tensor([[840, 20772, 3460, 4128, 4119, 13]], device=dev)
want = [int(t) for t in generate_text_basic_stream_cache(book, prompt, 40)]
fast = FastQwen3.from_book_model(book)
eager = [int(t) for t in generate(fast, prompt, 40)]
fast.compile_decode()  # CUDA graphs (mode="reduce-overhead")
graphs = [int(t) for t in generate(fast, prompt, 40)]
same = sum(a == b for a, b in zip(want, graphs))
print(f"tokens equal to the book's: eager {eager == want}, "
      f"CUDA graphs {same}/{len(want)}" + (" (stand-in weights)" if standin else ""))
PY

# 2. The benchmark, one table (JSON and CSV beside it).
uv run --locked python -m utils.benchmark --device cuda --dtype bfloat16 \
    --max-new-tokens 100 --repeats 3 \
    --modes regular,regular_compiled,kv_cache,kv_cache_compiled,optimized_compiled,hf_static,fast,fast_compiled \
    --json "$out/gpu-benchmark.json" --csv "$out/gpu-benchmark.csv"
echo "gpu_check: results in $out"
