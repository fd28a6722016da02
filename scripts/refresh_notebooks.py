"""Re-run the chapter notebooks and store exactly the outputs nbval checks.

Every notebook is executed top to bottom in a fresh kernel of this project's
Python, with the offline stand-ins switched on (QWEN3_STANDIN=1). Afterwards

* cells whose source has a line `# NBVAL_CHECK_OUTPUT` keep their outputs and
  execution count (nbval only compares cells that have an execution count);
* every other code cell loses its outputs and execution count;
* volatile metadata (timings, widget state, Python version) is dropped.

So the committed notebooks never need hand-edited JSON. Typical use:

    uv run python scripts/refresh_notebooks.py                  # all of ch02
    uv run python scripts/refresh_notebooks.py ch02/01_main-chapter-code/03_*.ipynb
    uv run python scripts/refresh_notebooks.py --check          # exit 1 if stale
    uv run python scripts/refresh_notebooks.py --no-execute     # only clean up

A checked cell must print the same text with real and stand-in weights and
must not write to stderr (nbval compares stderr too, and progress bars or
warnings there would make the check flaky): the script refuses such cells.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import nbformat

from utils.fileio import atomic_write_text

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO_ROOT / "ch02"
CHECK_MARKER = "NBVAL_CHECK_OUTPUT"
KERNELSPEC = {
    "name": "python3",
    "display_name": "Python 3 (ipykernel)",
    "language": "python",
}
LANGUAGE_INFO = {"name": "python"}
# Cell metadata keys worth keeping; everything else (execution timing,
# "scrolled", "collapsed", editor state) is dropped.
KEEP_CELL_METADATA = ("tags",)


class RefreshError(RuntimeError):
    """A notebook cannot be refreshed as it stands (the message says why)."""


def is_checked(cell: nbformat.NotebookNode) -> bool:
    """Whether nbval compares this cell's output (a `# NBVAL_CHECK_OUTPUT` line)."""
    if cell.cell_type != "code":
        return False
    for line in cell.source.splitlines():
        line = line.strip()
        if line.startswith("#") and line.lstrip("#").strip() == CHECK_MARKER:
            return True
    return False


def find_notebooks(paths: list[str]) -> list[Path]:
    """The notebooks named (files or folders), sorted; checkpoints skipped."""
    found: list[Path] = []
    for name in paths or [str(DEFAULT_DIR)]:
        path = Path(name)
        if path.is_dir():
            found.extend(
                p
                for p in sorted(path.rglob("*.ipynb"))
                if ".ipynb_checkpoints" not in p.parts
            )
        elif path.suffix == ".ipynb" and path.is_file():
            found.append(path)
        else:
            raise RefreshError(f"{name}: not a notebook file or folder")
    return found


def _current_env_kernel_manager():
    """An async kernel manager that starts ipykernel from this very Python,
    whatever kernelspecs the user has installed elsewhere."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class CurrentEnvSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):  # noqa: ANN001, ANN202
            return self.kernel_spec_class(
                resource_dir=ipykernel.kernelspec.RESOURCES,
                **ipykernel.kernelspec.get_kernel_dict(),
            )

    return AsyncKernelManager(
        kernel_name="python3", kernel_spec_manager=CurrentEnvSpecs()
    )


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int) -> None:
    """Run all cells of `nb` in place, in a fresh kernel started in `cwd`."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    client = NotebookClient(
        nb,
        km=_current_env_kernel_manager(),
        timeout=timeout,
        record_timing=False,
        resources={"metadata": {"path": str(cwd)}},
    )
    try:
        client.execute()
    except CellExecutionError as exc:
        raise RefreshError(f"a cell raised an error:\n{exc}") from None


def merge_streams(outputs: list) -> list:
    """Join consecutive stream outputs of the same stream, so how the kernel
    happened to flush its buffer never changes the committed file."""
    merged: list = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (
            prev is not None
            and out.output_type == "stream"
            and prev.output_type == "stream"
            and prev.name == out.name
        ):
            prev.text = "".join(prev.text) + "".join(out.text)
        else:
            merged.append(out)
    return merged


def clean(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """Keep outputs only of checked cells; drop volatile metadata."""
    nb = copy.deepcopy(nb)
    nb.metadata = nbformat.from_dict(
        {"kernelspec": dict(KERNELSPEC), "language_info": dict(LANGUAGE_INFO)}
    )
    for index, cell in enumerate(nb.cells):
        cell.metadata = nbformat.from_dict(
            {k: v for k, v in cell.metadata.items() if k in KEEP_CELL_METADATA}
        )
        if cell.cell_type != "code":
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
            continue
        if not is_checked(cell):
            cell.outputs = []
            cell.execution_count = None
            continue
        if cell.execution_count is None:
            raise RefreshError(
                f"{name}: checked cell {index} has no execution count; run the "
                "notebook (drop --no-execute) so nbval has something to compare"
            )
        for out in cell.outputs:
            if out.output_type == "stream" and out.name == "stderr":
                raise RefreshError(
                    f"{name}: checked cell {index} wrote to stderr "
                    f"({out.text[:80]!r}...). Move the noisy call (download, "
                    "progress bar, warning) into an unchecked cell."
                )
            if out.output_type == "error":
                raise RefreshError(f"{name}: checked cell {index} raised an error")
            if "metadata" in out:
                out.metadata = nbformat.from_dict({})
        cell.outputs = merge_streams(cell.outputs)
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The notebook as the exact text that is committed."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def refresh(path: Path, run: bool, check: bool, timeout: int) -> bool:
    """Refresh one notebook; return True when the file changed (or would)."""
    old_text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(old_text, as_version=4)
    if run:
        execute(nb, cwd=path.parent.resolve(), timeout=timeout)
    new_text = render(clean(nb, str(path)))
    changed = new_text != old_text
    if changed and not check:
        atomic_write_text(path, new_text)
    return changed


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    # Offline stand-ins, exactly as under pytest (the kernels inherit this).
    os.environ["QWEN3_STANDIN"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Plain printed fallbacks instead of widgets, as under nbval (see
    # utils/widgets.py); their outputs are not stored anyway.
    os.environ.setdefault("QWEN3_NO_WIDGETS", "1")

    try:
        notebooks = find_notebooks(args.paths)
    except RefreshError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not notebooks:
        print("error: no notebooks found", file=sys.stderr)
        return 2

    stale, failed = refresh_all(notebooks, args)
    if failed:
        return 2
    if args.check and stale:
        print(
            f"{len(stale)} notebook(s) out of date; run "
            "`uv run python scripts/refresh_notebooks.py` and commit",
            file=sys.stderr,
        )
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(
            "Re-execute the chapter notebooks with the offline stand-ins and "
            "store outputs only for cells marked '# NBVAL_CHECK_OUTPUT' (all "
            "other outputs, execution counts and volatile metadata are "
            "cleared). Use this instead of editing notebook JSON by hand."
        ),
        epilog="Without paths, every notebook under ch02/ is refreshed.",
    )
    parser.add_argument(
        "paths", nargs="*", help="notebooks or folders (default: ch02/)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if any notebook would change",
    )
    parser.add_argument(
        "--no-execute",
        action="store_true",
        help="only clean outputs and metadata; keep stored checked outputs",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=900,
        help="seconds allowed per cell (default: 900)",
    )
    return parser


def refresh_all(
    notebooks: list[Path], args: argparse.Namespace
) -> tuple[list[Path], list[Path]]:
    """Refresh each notebook, one line per notebook; (stale, failed) paths."""
    stale, failed = [], []
    for path in notebooks:
        start = time.perf_counter()
        try:
            changed = refresh(
                path, run=not args.no_execute, check=args.check, timeout=args.timeout
            )
        except RefreshError as exc:
            failed.append(path)
            print(f"FAILED   {path}: {exc}", file=sys.stderr)
            continue
        took = time.perf_counter() - start
        if changed:
            stale.append(path)
        status = ("stale" if args.check else "updated") if changed else "ok"
        print(f"{status:<8} {path} ({took:.0f} s)")
    return stale, failed


if __name__ == "__main__":
    sys.exit(main())
