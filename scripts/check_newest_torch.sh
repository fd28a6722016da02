#!/usr/bin/env bash
# Runs this repository's tests against the newest PyTorch on PyPI.
#
# The committed lock pins the torch release that the book's package accepts
# (`reasoning-from-scratch` 0.2.0: torch>=2.7.1,<2.11). Readers on Colab and
# other preinstalled images have newer releases. This script builds a
# throw-away environment with every locked package except torch (and torch's
# CUDA wheels), the newest torch that PyPI offers for this Python, the book's
# package installed without its torch pin, and this repository; then it runs
# the unit tests and nbval on the notebooks, and prints a one-line verdict.
#
# Not part of `uv run pytest`: it downloads a full torch build (on Linux
# x86-64 about 3 GB with its CUDA wheels) and re-executes the notebooks.
#
# Usage (from anywhere; paths relative to the repository root; needs uv and PyPI):
#   scripts/check_newest_torch.sh                 # unit tests + every notebook
#   scripts/check_newest_torch.sh --notebooks ch02/01_main-chapter-code/01_tokenizer.ipynb,...
#   scripts/check_newest_torch.sh --torch 2.13.0  # a given release instead
# Environment: CHECK_TORCH_ENV=<folder> keeps the environment there (default:
# a temporary folder, removed at the end). Exit status 0 only if all passed.
set -euo pipefail
cd "$(dirname "$0")/.."

notebooks=""
torch_spec=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --notebooks) notebooks="$2"; shift 2 ;;
        --torch) torch_spec="$2"; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done

command -v uv >/dev/null || { echo "uv is needed: pip install uv" >&2; exit 2; }

if [[ -n "${CHECK_TORCH_ENV:-}" ]]; then
    env_dir="$CHECK_TORCH_ENV"
else
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    env_dir="$work/venv"
fi
py="$env_dir/bin/python"
tmp_reqs="$(mktemp)"
trap 'rm -f "$tmp_reqs"; [[ -n "${work:-}" ]] && rm -rf "$work"' EXIT

uv venv --quiet --allow-existing "$env_dir"

# The newest torch PyPI has for this Python (uv's resolver, not a guess).
if [[ -z "$torch_spec" ]]; then
    torch_spec="$(echo torch | uv pip compile --quiet --no-header --no-annotate \
        --python "$py" --no-deps - | sed -n 's/^torch==//p')"
fi
[[ -n "$torch_spec" ]] || { echo "could not find a torch release on PyPI" >&2; exit 2; }
book_pkg="$(uv export --frozen --no-hashes --no-annotate --no-header \
    | grep '^reasoning-from-scratch==' | cut -d' ' -f1)"

# Everything the lock pins (dev tools included), minus torch, the wheels that
# come with torch's CUDA build, the book's package and this project.
uv export --frozen --no-hashes --no-annotate --no-header --no-emit-project \
        --all-groups \
    | grep -vE '^(torch|triton|nvidia-|cuda-|reasoning-from-scratch)' >"$tmp_reqs"

echo "== installing torch==$torch_spec with the locked packages into $env_dir"
uv pip install --quiet --python "$py" -r "$tmp_reqs" "torch==$torch_spec"
uv pip install --quiet --python "$py" --no-deps "$book_pkg" -e .
installed="$("$py" -c 'import torch; print(torch.__version__)')"
echo "== torch $installed, $("$py" -V), $book_pkg without its torch pin"

unit_status=0
"$py" -m pytest -q -p no:cacheprovider tests || unit_status=$?

if [[ -n "$notebooks" ]]; then
    IFS=',' read -r -a nb_args <<<"$notebooks"
    nb_label="${#nb_args[@]} notebooks"
else
    nb_args=(ch02)
    nb_label="every notebook"
fi
nb_status=0
"$py" -m pytest -q -p no:cacheprovider "${nb_args[@]}" || nb_status=$?

verdict() { [[ "$1" == 0 ]] && echo pass || echo "FAIL (pytest rc $1)"; }
echo "VERDICT: torch $installed ($("$py" -V)): unit tests $(verdict $unit_status);" \
    "nbval on $nb_label $(verdict $nb_status)"
[[ $unit_status == 0 && $nb_status == 0 ]]
