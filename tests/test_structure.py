"""The layout holds: the chapter's helpers directly in `utils/`, everything
else in packages behind one door each (`download`, `benchmark`, `cli`,
`hf_interop`, `fast`), no import cycles (imports inside functions count),
one place that compiles the book's model, functions short enough to read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.import_graph import UTILS, find_cycle, graph, imported, modules

MAX_FUNCTION_LINES = 60


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_counting_imports_inside_functions():
    edges = graph()
    assert "utils.streaming" in edges and edges["utils.streaming"]
    # package imports (`import utils`, `from utils import x`) are not cycles
    edges = {k: {m for m in v if m != "utils"} for k, v in edges.items()}
    assert find_cycle(edges) is None, find_cycle(edges)


def test_the_chapter_never_imports_the_fast_engine_at_module_level():
    for name, tree in modules().items():
        if name.startswith("utils.fast"):
            continue
        top = imported(tree, name, top_level_only=True)
        assert not {m for m in top if m.startswith("utils.fast")}, name


def test_only_utils_compile_compiles_the_books_model():
    """torch.compile appears in utils.compile (the book's way, with its
    dynamo setting) and inside the fast engine (its own step), nowhere else."""
    for name, tree in modules().items():
        if name in ("utils.compile",) or name.startswith("utils.fast"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "compile":
                if isinstance(node.value, ast.Name) and node.value.id == "torch":
                    raise AssertionError(f"{name} calls torch.compile directly")


def test_functions_are_short_enough_to_read():
    """In utils/, the scripts and the chapter's folders."""
    root = UTILS.parent
    trees = dict(modules())
    for path in [*root.glob("scripts/*.py"), *root.glob("ch02/**/*.py")]:
        trees[str(path.relative_to(root))] = ast.parse(path.read_text("utf-8"))
    long = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert not long, long


def test_tests_write_only_into_pytests_own_temporary_folders():
    """A test run leaves nothing behind in /tmp: tests use `tmp_path` (and
    its factory), which pytest prunes, never folders of their own."""
    tests = Path(__file__).resolve().parent
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text(encoding="utf-8")
        for needle in ("mkdtemp(", "gettempdir(", '"/tmp/'):
            if needle in text:
                offenders.append(f"{path.relative_to(tests)}: {needle}")
    assert not offenders, offenders


MAX_C_FUNCTION_LINES = 80


def c_function_lengths(text: str) -> dict[str, int]:
    """{name: lines} of the top-level function definitions in C source: a
    line at column 0 with a `(`, whose next `{` follows a `)` and comes
    before any `;`, up to the `}` that closes that brace."""
    lines = text.splitlines()
    lengths = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if line[:1].isalpha() and "(" in line and not line.startswith("typedef"):
            rest = "\n".join(lines[i:])
            brace, semi = rest.find("{"), rest.find(";")
            head = rest[:brace].rstrip()
            if brace != -1 and (semi == -1 or brace < semi) and head.endswith(")"):
                depth, end = 0, i
                for end in range(i, len(lines)):
                    depth += lines[end].count("{") - lines[end].count("}")
                    if depth == 0 and "{" in "\n".join(lines[i : end + 1]):
                        break
                name = line.split("(")[0].split()[-1].lstrip("*")
                lengths[name] = end - i + 1
                i = end
        i += 1
    return lengths


def test_the_c_length_check_measures_functions():
    src = (
        "static int f(int a,\n          int b) {\n    if (a) { b++; }\n"
        "    return a + b;\n}\nint g(void);\nstatic int h(void) { return 1; }\n"
    )
    assert c_function_lengths(src) == {"f": 5, "h": 1}


def test_c_functions_are_short_enough_to_read():
    csrc = UTILS / "fast" / "csrc"
    long = [
        f"{path.name}:{name}: {n} lines"
        for path in sorted(csrc.glob("*.[ch]"))
        for name, n in c_function_lengths(path.read_text(encoding="utf-8")).items()
        if n > MAX_C_FUNCTION_LINES
    ]
    assert csrc.is_dir() and not long, long


MAX_MODULE_LINES = 800
# 4,000 for the x86-64 engine (#44), plus about 300 for the second
# instruction set (#47): vec8.h's NEON half, AArch64's CPU features, the
# per-architecture build; 4,900 for the multi-row kernels of prefill (#54);
# 4,930 for the fused prefill of the native and int8 paths (#54: 1.3x prefill);
# 5,830 for many sequences at once (the step for several rows, its
# bf16 multi-row kernel, the continuous-batching decoder; 900 lines at most)
MAX_ENGINE_LINES = 5830
ENGINE = UTILS / "fast"


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_longer_than_800_lines():
    long = {
        str(p.relative_to(UTILS.parent)): n
        for p in sorted(UTILS.rglob("*.py"))
        if (n := line_count(p)) > MAX_MODULE_LINES
    }
    assert not long, long


def engine_lines() -> dict[str, int]:
    """Lines of the fast decoder's Python and C (its test build is in tests/)."""
    files = [*ENGINE.rglob("*.py"), *(ENGINE / "csrc").glob("*.[ch]")]
    return {str(p.relative_to(ENGINE)): line_count(p) for p in sorted(files)}


def test_the_fast_engine_stays_in_proportion():
    counts = engine_lines()
    assert "csrc/api.h" in counts and "paths.py" in counts
    assert sum(counts.values()) <= MAX_ENGINE_LINES, sum(counts.values())


DOORS = (
    "utils.batch",
    "utils.download",
    "utils.benchmark",
    "utils.cli",
    "utils.hf_interop",
    "utils.fast",
)
TOP_LEVEL_LIMIT = 450  # lines of a module directly in utils/ (the chapter's)


def exported(package: str) -> set[str]:
    path = UTILS.parent.joinpath(*package.split("."), "__init__.py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "__all__":
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{package} has no __all__")


def imports_into(path: Path, package: str) -> list[tuple[str, str]]:
    """(module, name) of every import of `package` or its modules in a file."""
    found = []
    inside = (package, package + ".")
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(inside):
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "utils":
            found += [(f"utils.{a.name}", "") for a in node.names
                      if f"utils.{a.name}" == package]  # fmt: skip
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith(inside)]
    return found


def test_outside_code_uses_only_each_packages_door():
    """The chapter's helpers, the other packages, the commands and the bonus
    scripts import only what a package exports (`__all__` of its
    `__init__.py`), or the package itself; its modules are its own business
    (tests may look inside)."""
    wrong = []
    for package in DOORS:
        door = exported(package)
        folder = UTILS.parent.joinpath(*package.split("."))
        outside = [
            *(p for p in UTILS.rglob("*.py") if folder not in p.parents),
            *(UTILS.parent / "ch02").rglob("*.py"),
            *(UTILS.parent / "scripts").rglob("*.py"),
        ]
        wrong += [
            f"{p.relative_to(UTILS.parent)}: {module} {name}"
            for p in outside
            for module, name in imports_into(p, package)
            if module != package or (name and name not in door)
        ]
    assert not wrong, wrong


def test_the_top_level_is_the_chapter():
    """Directly in utils/: short modules (the chapter's helpers and the small
    shared ones); every other folder under utils/ is a package with a door."""
    long = {
        p.name: n for p in UTILS.glob("*.py") if (n := line_count(p)) > TOP_LEVEL_LIMIT
    }
    assert not long, long
    folders = {
        f"utils.{p.name}" for p in UTILS.iterdir() if (p / "__init__.py").exists()
    }
    assert folders == set(DOORS), folders


def environment_reads(tree: ast.Module) -> set[str]:
    """Names of environment variables a module reads: os.environ.get("X"),
    os.environ["X"], os.getenv("X"), settings.text/flag("X"), the name
    given directly or as a module constant."""
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }
    names = set()
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            fn = node.func
            called = ast.unparse(fn)
            if called in ("os.environ.get", "os.getenv", "settings.text",
                          "settings.flag", "os.environ.setdefault"):  # fmt: skip
                key = node.args[0]
        elif (
            isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ"
        ):
            key = node.slice
        if isinstance(key, ast.Name):  # a module constant naming it
            key = ast.Constant(constants.get(key.id))
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
    return names


def test_every_environment_variable_the_code_reads_is_a_setting():
    from utils.settings import SETTINGS

    known = {s.name for s in SETTINGS}
    read = {
        (name, module)
        for module, tree in modules().items()
        for name in environment_reads(tree)
    }
    assert {n for n, _ in read} >= {"QWEN3_STANDIN", "QWEN3_KERNEL_CACHE"}
    unknown = sorted((n, m) for n, m in read if n not in known)
    assert not unknown, unknown


def test_the_commands_page_lists_every_setting():
    from utils.settings import SETTINGS

    readme = (UTILS.parent / "docs" / "commands.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(" `") for line in readme.splitlines()
            if line.startswith("| `")}  # fmt: skip
    missing = [s.name for s in SETTINGS if s.name not in rows]
    assert not missing, missing


def test_no_test_module_imports_another():
    """What tests share lives in conftest.py (fixtures) and in helper
    modules under tests/ (plain code), never in a test module that another
    one imports (its code would load twice, as pytest's `test_x` and as
    `tests.test_x`, each copy with its own state)."""
    tests = Path(__file__).resolve().parent
    wrong = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
                names += [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            wrong += [
                f"{path.relative_to(tests)}: {name}"
                for name in names
                if name.startswith("tests.")
                and any(part.startswith("test_") for part in name.split("."))
            ]
    assert not wrong, wrong


def test_no_code_outside_tests_knows_the_tests():
    """Code under utils/ (Python, C and headers), scripts/ (Python, shell)
    and ch02/ (Python) knows nothing of the tests: it never names PYTEST or
    QWEN3_TESTING, and its code (comments and docstrings aside, which may
    point a reader to a test, as the README and docs do) names no path
    into tests/ and imports nothing from it. Test hooks come in from the
    tests (tests/conftest.py, the root conftest.py). pyproject.toml is left
    out: it is pytest's configuration."""

    def code_only(path: Path) -> str:
        """The file's code without its comments (and a Python file's
        docstrings): what runs, not what points a reader somewhere."""
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".py":
            tree = ast.parse(text)
            for node in ast.walk(tree):
                body = getattr(node, "body", None)
                if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                    if isinstance(getattr(body[0].value, "value", None), str):
                        body[0] = ast.Pass()
            return ast.unparse(tree)  # comments are not in the tree
        if path.suffix in (".c", ".h"):
            return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)
        return re.sub(r"(^|\s)#.*", r"\1", text, flags=re.M)  # shell

    root = UTILS.parent
    files = [*UTILS.rglob("*.py"), *UTILS.rglob("*.[ch]"),
             *root.glob("scripts/*.py"), *root.glob("scripts/*.sh"),
             *(root / "ch02").rglob("*.py")]  # fmt: skip
    assert len(files) > 60 and root / "scripts" / "check_arm64.sh" in files
    names = re.compile(r"PYTEST|QWEN3_TESTING")
    into_tests = re.compile(r"""(?<![\w.])tests(?:/|\.\w)|["']tests["']""")
    found = [
        str(p.relative_to(root))
        for p in files
        if names.search(p.read_text(encoding="utf-8"))
        or into_tests.search(code_only(p))
    ]
    assert not found, found
