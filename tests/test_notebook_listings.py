"""The notebooks type the book's code as printed, and match the `utils` copies.

Two kinds of checks. First, against the book's text (tests/data, via
tests/book_text.py): Listings 2.1-2.6 and every other code block of the
chapter are typed exactly as printed, apart from the documented differences;
every "Book output" block is the book's output; checked cells that
reproduce a printed output (tokenizer, shapes, architecture) print it; the
installing page (ch02/02_setup-tips/python-and-uv.md) carries section 2.2's commands.

Second, notebooks 02, 04 and 05 define Listings 2.1-2.4 in cells so the
reader sees them; later notebooks import the same functions from
`utils.device` and `utils.generation`. These tests pull the definitions out
of the .ipynb files and check that both behave the same (same device and
TF32 switches; same tokens and the same stop at the end-of-sequence token;
the same printed statistics), so notebook and module cannot drift apart.
"""

import ast
import difflib
import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch
from reasoning_from_scratch import ch02 as book
from reasoning_from_scratch.qwen3 import KVCache, Qwen3Model

from tests import book_text
from tests.tiny import tiny_config
from utils import device as utils_device
from utils import generation
from utils.language import in_language

NB_DIR = Path(__file__).resolve().parent.parent / "ch02" / "01_main-chapter-code"

TINY_CFG = tiny_config(context_length=64, rope_base=10_000.0)


def load_function(notebook: str, name: str):
    """Exec only the `def name(...)` found in the notebook's code cells."""
    nb = nbformat.read(NB_DIR / notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code" or f"def {name}(" not in cell.source:
            continue
        tree = ast.parse(cell.source)
        defs = [
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == name
        ]
        if defs:
            namespace = {"torch": torch, "KVCache": KVCache, "warnings": warnings}
            module = ast.Module(body=defs, type_ignores=[])
            exec(compile(module, f"{notebook}:{name}", "exec"), namespace)
            return namespace[name]
    raise AssertionError(f"{notebook} has no cell defining {name}()")


@pytest.fixture(scope="module")
def listings():
    return {
        "plain": load_function("04_generate.ipynb", "generate_text_basic_stream"),
        "cache": load_function("05_kv-cache.ipynb", "generate_text_basic_stream_cache"),
    }


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(123)
    return Qwen3Model(TINY_CFG)


@pytest.fixture(scope="module")
def prompt():
    gen = torch.Generator().manual_seed(7)
    return torch.randint(0, TINY_CFG["vocab_size"], (1, 6), generator=gen)


def tokens(fn, model, ids, n, eos=None) -> list[list[int]]:
    return [t.tolist() for t in fn(model, ids, n, eos_token_id=eos)]


@pytest.mark.parametrize("n", [0, 1, 12])
def test_notebook_listings_match_utils_and_book(listings, model, prompt, n):
    plain = tokens(listings["plain"], model, prompt, n)
    cache = tokens(listings["cache"], model, prompt, n)
    assert len(plain) == n
    assert plain == tokens(generation.generate_text_basic_stream, model, prompt, n)
    assert cache == tokens(
        generation.generate_text_basic_stream_cache, model, prompt, n
    )
    assert plain == tokens(book.generate_text_basic_stream, model, prompt, n)
    # A cache changes the work done, not the result
    assert cache == plain


def test_listings_run_without_autograd(listings, model, prompt):
    for fn in listings.values():
        token = next(fn(model, prompt, 1))
        assert token.shape == (1, 1)
        assert torch.is_inference(token), "missing @torch.inference_mode()"


@pytest.mark.parametrize("kind", ["plain", "cache"])
def test_eos_stop_matches_utils(listings, model, prompt, kind):
    utils_fn = {
        "plain": generation.generate_text_basic_stream,
        "cache": generation.generate_text_basic_stream_cache,
    }[kind]
    full = [t[0][0] for t in tokens(listings[kind], model, prompt, 12)]
    for eos in (full[0], full[4], -1):
        got = tokens(listings[kind], model, prompt, 12, eos=eos)
        assert got == tokens(utils_fn, model, prompt, 12, eos=eos)
        # Stops right before the first EOS; the EOS itself is never yielded
        expected = full[: full.index(eos)] if eos in full else full
        assert [t[0][0] for t in got] == expected


def test_batched_eos_waits_for_every_row(listings, model):
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, TINY_CFG["vocab_size"], (2, 5), generator=gen)
    steps = tokens(listings["plain"], model, ids, 6)  # [[[row0], [row1]], ...]
    (row0,), (row1,) = steps[0]
    assert row0 != row1, "pick another seed: both rows start alike"
    for kind in ("plain", "cache"):
        utils_fn = getattr(generation, listings[kind].__name__)
        got = tokens(listings[kind], model, ids, 6, eos=row0)
        assert got == tokens(utils_fn, model, ids, 6, eos=row0)
        # Only row 0 produced the EOS, so generation goes on for both rows
        assert got[0] == [[row0], [row1]]


def test_listings_are_labelled_cells():
    """Each book listing sits in its own cell whose first line names it."""
    expected = {
        "02_load-model.ipynb": {"# Listing 2.1": "get_device"},
        "04_generate.ipynb": {
            "# Listing 2.2": "generate_text_basic_stream",
            "# Listing 2.3": "generate_stats",
        },
        "05_kv-cache.ipynb": {"# Listing 2.4": "generate_text_basic_stream_cache"},
    }
    for notebook, listings in expected.items():
        nb = nbformat.read(NB_DIR / notebook, as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        for label, name in listings.items():
            cells = [s for s in code if s.splitlines()[0].startswith(label + " ")]
            assert len(cells) == 1, f"{notebook}: one cell must start with {label}"
            assert f"def {name}(" in cells[0], f"{notebook}: {label} defines {name}"


# --- Listing 2.1: get_device (notebook 02) vs utils.device.get_device ---


def _fresh_tf32_switches(monkeypatch):
    """Install stand-ins for the CUDA/cuDNN settings objects, so the test sees
    which TF32 switches get_device sets without touching the real ones, and
    return a function that reads them back."""
    matmul = SimpleNamespace()
    cudnn = SimpleNamespace(conv=SimpleNamespace())
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends, "cudnn", cudnn)

    def snapshot():
        flat = {k: v for k, v in vars(cudnn).items() if k != "conv"}
        return dict(vars(matmul)), flat, dict(vars(cudnn.conv))

    return snapshot


def _pretend_hardware(monkeypatch, kind: str, version: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: kind == "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: kind == "mps")
    monkeypatch.setattr(torch.xpu, "is_available", lambda: kind == "xpu")
    monkeypatch.setattr(torch, "__version__", version)


@pytest.mark.parametrize(
    ("kind", "version", "tensor_cores", "matmul_flags"),
    [
        ("cuda", "2.10.0+cu128", True, {"allow_tf32": True}),
        ("cuda", "2.11.0+cu130", True, {"fp32_precision": "tf32"}),
        ("cuda", "2.12.1", True, {"fp32_precision": "tf32"}),
        ("cuda", "2.11.0", False, {}),
        ("mps", "2.11.0", True, {}),
        ("xpu", "2.11.0", True, {}),
        ("cpu", "2.10.0", True, {}),
    ],
)
def test_notebook_get_device_matches_utils(
    monkeypatch, capsys, kind, version, tensor_cores, matmul_flags
):
    book_get_device = load_function("02_load-model.ipynb", "get_device")
    _pretend_hardware(monkeypatch, kind, version)

    switches = _fresh_tf32_switches(monkeypatch)
    book_device = book_get_device(enable_tensor_cores=tensor_cores)
    book_line = capsys.readouterr().out.strip()
    book_switches = switches()
    assert book_switches[0] == matmul_flags

    switches = _fresh_tf32_switches(monkeypatch)
    utils_dev = utils_device.get_device(enable_tensor_cores=tensor_cores)
    utils_line = capsys.readouterr().out.strip()

    assert utils_dev == book_device == torch.device(kind)
    assert switches() == book_switches
    # utils adds the GPU's name in parentheses; the start is the book's line
    assert utils_line.startswith(book_line) and book_line.startswith("Using ")


# --- Listing 2.3: generate_stats (notebook 04) vs utils.generation ---


class _FakeCudaTokens:
    """Just enough of a tensor for generate_stats: numel() and .device."""

    device = torch.device("cuda")

    def __init__(self, n: int) -> None:
        self.n = n

    def numel(self) -> int:
        return self.n


def test_generate_stats_cpu_prints_book_lines_then_memory(monkeypatch, capsys):
    book_stats = load_function("04_generate.ipynb", "generate_stats")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    ids = torch.arange(10).unsqueeze(0)

    assert book_stats(ids, None, 100.0, 102.5) is None
    book_out = capsys.readouterr().out
    assert book_out == "\n\nTime: 2.50 sec\n4 tokens/sec\n"

    stats = generation.generate_stats(ids, None, 100.0, 102.5)
    utils_out = capsys.readouterr().out
    # Same lines as the book, then one extra line: the process's peak RSS
    assert utils_out.startswith(book_out)
    extra = utils_out[len(book_out) :].splitlines()
    assert len(extra) == 1 and extra[0].startswith("Peak process memory (RSS): ")
    assert stats["num_tokens"] == 10 and stats["tokens_per_sec"] == 4.0
    assert stats["time_s"] == 2.5 and stats["peak_mem_bytes"] > 0


def test_generate_stats_cuda_lines_are_identical(monkeypatch, capsys):
    book_stats = load_function("04_generate.ipynb", "generate_stats")
    resets = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(
        torch.cuda, "max_memory_allocated", lambda *a, **k: int(1.5 * 1024**3)
    )
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", lambda *a, **k: resets.append(1)
    )
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    ids = _FakeCudaTokens(41)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the tokens are "on" CUDA: no warning
        book_stats(ids, None, 0.0, 1.4)
    book_out = capsys.readouterr().out
    stats = generation.generate_stats(ids, None, 0.0, 1.4)
    utils_out = capsys.readouterr().out

    assert book_out == (
        "\n\nTime: 1.40 sec\n29 tokens/sec\nMax CUDA memory allocated: 1.50 GB\n"
    )
    assert utils_out == book_out
    assert len(resets) == 2, "both reset the peak counter after reading it"
    assert stats["memory_kind"] == "Max CUDA memory allocated"


# --------------------------------------------------------------------------
# The book's text: listings, snippets and "Book output" blocks as printed
# --------------------------------------------------------------------------
# tests/data/book_listings.md holds the chapter's code and printed output,
# block by block; tests/book_text.py says where each code block is typed and
# lists every documented difference as (printed text, typed text), and
# ch02/01_main-chapter-code/README.md gives the reason for each. Anything
# else that differs from the book fails.

ZH_DIR = NB_DIR / "zh"
# "Book output" blocks: each notebook shows exactly these, as printed.
BOOK_OUTPUT_BLOCKS = {
    "01_tokenizer.ipynb": {9, 11, 14, 16},
    "02_load-model.ipynb": {21},
    "03_next-token.ipynb": {31, 33, 35},
    "04_generate.ipynb": {42, 45, 48},
    "05_kv-cache.ipynb": {53},
    "06_compile.ipynb": {56, 58},
}
# Outputs a checked cell reproduces (the tokenizer and shapes are real with
# stand-ins too): output block -> (code block, how the cell's text differs)
CHECKED_BOOK_OUTPUTS = {
    14: (13, lambda text: text.strip("'")),  # print() shows no quotes
    16: (15, lambda text: re.sub(r"(?m)^(\d+) -->", r"[\1] -->", text)),  # {[i]}
    23: (22, lambda text: text),
    26: (25, lambda text: text),
    28: (27, lambda text: text),
    29: (24, lambda text: text),
    35: (34, lambda text: " " + text),  # the token's leading space
    37: (36, lambda text: text),
    39: (38, lambda text: text),
}
LABEL = re.compile(
    r"^(?:Book output|书中的输出)[^\n]*[:：]\n\n```text\n(.*?)\n```", re.M | re.S
)


def code_sources(path: Path) -> list[str]:
    """Code cells without nbval markers (as the reader's code reads)."""
    nb = nbformat.read(path, as_version=4)
    return [
        "\n".join(ln for ln in c.source.splitlines() if not ln.startswith("# NBVAL_"))
        for c in nb.cells
        if c.cell_type == "code"
    ]


def listing_cell(path: Path, n: int, label: str = "# Listing") -> str:
    cells = [s for s in code_sources(path) if s.startswith(f"{label} 2.{n} ")]
    assert len(cells) == 1, f"{path.name}: one cell must start with {label} 2.{n}"
    return cells[0]


@pytest.mark.parametrize("n", range(1, 7))
def test_typed_listings_are_the_books(n):
    block = book_text.listing(n)
    notebook, kind = book_text.TYPED[block.number]
    assert kind == "listing"
    cell = listing_cell(NB_DIR / notebook, n)
    body = cell.split("\n", 1)[1]  # below the "# Listing 2.n ..." line
    assert body == book_text.typed(block.number), "\n".join(
        difflib.unified_diff(
            book_text.typed(block.number).splitlines(), body.splitlines()
        )
    )


def test_every_code_block_of_the_book_is_typed():
    blocks = book_text.book_blocks()
    code_blocks = {n for n, b in blocks.items() if b.kind == "code"}
    readme = code_blocks & {n for n, b in blocks.items() if b.section == "2.2"}
    assert set(book_text.TYPED) | readme == code_blocks
    for n, (notebook, kind) in book_text.TYPED.items():
        sources = code_sources(NB_DIR / notebook)
        if kind == "cell":
            assert book_text.typed(n) in sources, (
                f"block {n} is not a cell of {notebook}"
            )
        elif kind == "line":
            lines = {ln.strip() for s in sources for ln in s.splitlines()}
            assert book_text.typed(n) in lines, f"block {n} is not a line of {notebook}"
        elif kind == "markdown":
            nb = nbformat.read(NB_DIR / notebook, as_version=4)
            fence = f"```python\n{book_text.typed(n)}\n```"
            assert any(fence in c.source for c in nb.cells if c.cell_type == "markdown")


@pytest.mark.parametrize(
    ("page", "heading", "level"),
    [("python-and-uv.md", "## Following section 2.2 with this repository", "\n## "),
     ("python-and-uv.zh.md", "## 对照书中 2.2 节使用本仓库", "\n## ")],
    ids=["en", "zh"],
)  # fmt: skip
def test_section_2_2_commands_are_on_the_installing_page(page, heading, level):
    readme = (NB_DIR.parents[0] / "02_setup-tips" / page).read_text(encoding="utf-8")
    assert readme.count(heading) == 1
    start = readme.index(heading)
    section = readme[start : readme.index(level, start + 3)]
    for n, block in book_text.book_blocks().items():
        if block.section == "2.2":
            assert f"```bash\n{block.text}\n```" in section, f"block {n}"
    # The book's `>=` unquoted is a shell redirect: the page quotes it
    quoted = 'pip install "torch>=2.7.1" "tokenizers>=0.21.2" reasoning-from-scratch'
    assert f"```bash\n{quoted}\n```" in section


@pytest.mark.parametrize("folder", [NB_DIR, ZH_DIR], ids=["en", "zh"])
@pytest.mark.parametrize("notebook", sorted(BOOK_OUTPUT_BLOCKS))
def test_book_output_blocks_are_the_books(folder, notebook):
    outputs = {
        b.text: n for n, b in book_text.book_blocks().items() if b.kind == "output"
    }
    nb = nbformat.read(folder / notebook, as_version=4)
    shown = [
        m[1]
        for c in nb.cells
        if c.cell_type == "markdown"
        for m in LABEL.finditer(c.source)
    ]
    unknown = [text for text in shown if text not in outputs]
    assert unknown == [], "a 'Book output' block is not the book's output"
    assert sorted(outputs[t] for t in shown) == sorted(BOOK_OUTPUT_BLOCKS[notebook])


def cell_output_text(cell) -> str:
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "execute_result":
            parts.append(out.data["text/plain"] + "\n")
    return "".join(parts)


@pytest.mark.parametrize("output", sorted(CHECKED_BOOK_OUTPUTS))
def test_checked_outputs_are_the_books(output):
    code_block, how = CHECKED_BOOK_OUTPUTS[output]
    notebook, kind = book_text.TYPED[code_block]
    nb = nbformat.read(NB_DIR / notebook, as_version=4)
    (cell,) = [
        c
        for c in nb.cells
        if c.cell_type == "code"
        and c.source == f"# NBVAL_CHECK_OUTPUT\n{book_text.typed(code_block)}"
    ]
    expected = how(book_text.book_blocks()[output].text) + "\n"
    assert cell_output_text(cell) == expected


@pytest.mark.parametrize("folder", [NB_DIR, ZH_DIR], ids=["en", "zh"])
def test_table_2_1_is_printed_in_full(folder):
    nb = nbformat.read(folder / "06_compile.ipynb", as_version=4)
    rows = [  # the Table 2.1 cell (Exercise 2.2's filled table comes after it)
        [cell.strip() for cell in line.strip("|").split("|")]
        for c in nb.cells
        if c.cell_type == "markdown" and c.get("id") == "nb06-table"
        for line in c.source.splitlines()
        if line.startswith("| ") and ("Mac Mini" in line or "H100 GPU" in line)
    ]
    printed = book_text.book_blocks()[61].text.splitlines()
    printed = [row.split("\t") for row in printed]
    assert len(printed) == 12 and all(len(r) == 4 for r in printed)
    # the modes by the names notebook 06's chart gives them (Chinese in zh/)
    lang = "zh" if folder == ZH_DIR else "en"
    printed = [[in_language(mode, lang=lang), *rest] for mode, *rest in printed]
    assert rows == printed
