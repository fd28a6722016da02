"""The notebook widgets as readers use them: JupyterLab in headless Chromium.

The test starts its own JupyterLab (free loopback port, random token, a temp
copy of the notebooks as root, temp Jupyter config/data dirs, stand-in
weights) and drives it with Playwright's Python API and the OS Chromium:

* 01_tokenizer: run all cells, no error; the token explorer shows the book's
  six tokens and ids; typing a new sentence updates the boxes and the count;
  CJK and emoji glyphs render (not the missing-glyph box) where fonts exist.
* zh/04_generate, the Chinese copy (its set-up, model and panel cells:
  nbval runs the rest): run them, no error; the panel speaks Chinese, no
  label cut short; "生成" (Generate) streams growing text and ends with the
  statistics line; "停止" (Stop) ends a long run early and says so; the
  panel then generates again. (The English panel's words are the same code
  with the English table: tests/test_widgets.py.)

Screenshots of each widget go to $CI_ARTIFACTS (or a temp dir), listed at the
end of the run. Skipped with one line where Playwright or Chromium is missing
(`.ci/run` installs the Debian packages chromium, fonts-noto-cjk and
fonts-noto-color-emoji). Set QWEN3_BROWSER to use another Chromium binary.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest

from utils.language import ZH_TEXT

pytestmark = pytest.mark.slow  # a real JupyterLab in a real Chromium

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "ch02" / "01_main-chapter-code"
TOKENIZER_NB = "01_tokenizer.ipynb"
GENERATE_NB = "zh/04_generate.ipynb"  # Jupyter runs its kernel in zh/
BROWSER_ENV = "QWEN3_BROWSER"

BOOK_PROMPT = "Explain large language models."
# The book's token ids for BOOK_PROMPT (Qwen3 tokenizer; also in 01's output).
BOOK_IDS = [840, 20772, 3460, 4128, 4119, 13]
NEW_SENTENCE = "The flumbrous zorbitude quenched the glimmerfax."
CJK_SENTENCE = "解释大型语言模型。檸檬 🍋"
# Characters whose glyphs must not be the missing-glyph box, with the
# fontconfig charset that tells whether an installed font covers them.
GLYPHS = {"解": "89e3", "檬": "6aac", "🍋": "1f34b"}

SERVER_START_S = 180
CELL_RUN_S = {TOKENIZER_NB: 300, GENERATE_NB: 600}
UI_S = 60
GENERATION_S = 300

# Lab settings: every cell stays in the DOM; no news/update pop-ups.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {
        "windowingMode": "none",
        "autoStartDefaultKernel": True,  # no "Select Kernel" dialog
    },
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


# --------------------------------------------------------------------------
# JupyterLab server and browser
# --------------------------------------------------------------------------


def find_chromium() -> str | None:
    """$QWEN3_BROWSER, else the first Chromium/Chrome binary on PATH."""
    explicit = os.environ.get(BROWSER_ENV)
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server started for this test and stopped afterwards."""

    def __init__(self, root: Path, home: Path) -> None:
        self.root, self.home = root, home
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "jupyterlab.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            # The kernel would inherit these and show plain text, not widgets.
            if k not in {"PYTEST_CURRENT_TEST", "QWEN3_NO_WIDGETS"}
        }
        dirs = {
            "JUPYTER_CONFIG_DIR": "config",
            "JUPYTER_DATA_DIR": "data",
            "JUPYTER_RUNTIME_DIR": "runtime",
            "JUPYTERLAB_SETTINGS_DIR": "settings",
            "JUPYTERLAB_WORKSPACES_DIR": "workspaces",
            "IPYTHONDIR": "ipython",
            "MPLCONFIGDIR": "matplotlib",
            "QWEN3_STANDIN_DIR": "standins",
        }
        for key, sub in dirs.items():
            env[key] = str(self.home / sub)
            (self.home / sub).mkdir(exist_ok=True)
        env["QWEN3_STANDIN"] = "1"
        env["TOKENIZERS_PARALLELISM"] = "false"
        return env

    def write_settings(self) -> None:
        for plugin, values in LAB_SETTINGS.items():
            package, name = plugin.rsplit("/", 1)
            path = self.home / "settings" / package / f"{name}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))

    def start(self) -> None:
        env = self.env()
        self.write_settings()
        cmd = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited early:\n{self.log_tail()}")
            try:
                self.api("GET", "/api/status", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"JupyterLab did not answer:\n{self.log_tail()}")

    def api(self, method: str, path: str, timeout: float = 10) -> Any:
        req = urllib.request.Request(
            self.url + path,
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def page_url(self, notebook: str) -> str:
        # One workspace per notebook, so a page does not restore the others.
        stem = Path(notebook).stem.replace("_", "-")
        return f"{self.url}/lab/workspaces/{stem}/tree/{notebook}?token={self.token}"

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.api("POST", "/api/shutdown", timeout=5)  # also ends the kernels
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def chromium_path() -> str:
    pytest.importorskip(
        "playwright.sync_api",
        reason="browser test needs the playwright package (uv sync --locked)",
    )
    path = find_chromium()
    if path is None:
        pytest.skip(
            "browser test needs Chromium: install the OS package 'chromium' "
            f"(.ci/run does) or set {BROWSER_ENV}"
        )
    return path


@pytest.fixture(scope="module")
def shots(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    """Folder for widget screenshots ($CI_ARTIFACTS, else under pytest's own
    temporary folder, which pytest prunes); the paths are printed at
    teardown."""
    base = os.environ.get("CI_ARTIFACTS")
    if base:
        folder = Path(base) / "browser-widgets"
        folder.mkdir(parents=True, exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("browser-shots")
    yield folder
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capman = plugins.get_plugin("capturemanager")
    # Output capture is on during teardown: lift it so the paths reach the log
    lifted = capman.global_and_fixture_disabled() if capman else nullcontext()
    with lifted:
        for path in sorted(folder.glob("*.png")):
            line = f"browser test screenshot: {path}"
            if reporter is not None:
                reporter.write_line(line)
            else:
                print(line)


# The code cells of 04_generate.ipynb the generation panel needs (set-up,
# model, Listing 2.2, the prompt, the panel). nbval runs every cell of the
# notebook; here the other generation runs would only add minutes.
PANEL_NEEDS = (
    "download_qwen3_small(",
    "model.load_state_dict(",
    "def generate_text_basic_stream(",
    "prompt = ",
    "generation_panel(",
)


def write_panel_notebook(source: Path, dest: Path) -> None:
    """A copy of `source` without the code cells the panel does not need
    (its markdown kept); fails if a needed cell is no longer there."""
    nb = json.loads(source.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    kept = [c for c in code if any(m in "".join(c["source"]) for m in PANEL_NEEDS)]
    found = [m for m in PANEL_NEEDS if any(m in "".join(c["source"]) for c in kept)]
    assert found == list(PANEL_NEEDS), (
        f"{source.name} lacks {set(PANEL_NEEDS) - set(found)}"
    )
    nb["cells"] = [c for c in nb["cells"] if c["cell_type"] != "code" or c in kept]
    dest.write_text(json.dumps(nb), encoding="utf-8")


@pytest.fixture(scope="module")
def lab(chromium_path: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("lab-root")
    shutil.copy2(NOTEBOOK_DIR / TOKENIZER_NB, root / TOKENIZER_NB)
    (root / GENERATE_NB).parent.mkdir()
    write_panel_notebook(NOTEBOOK_DIR / GENERATE_NB, root / GENERATE_NB)
    server = Lab(root, tmp_path_factory.mktemp("lab-home"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Any:
    from playwright.sync_api import sync_playwright

    args = []
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses root with its sandbox
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=chromium_path, args=args)
        try:
            yield chromium
        finally:
            chromium.close()


# --------------------------------------------------------------------------
# Driving a notebook
# --------------------------------------------------------------------------


class Notebook:
    """One notebook open in its own browser page."""

    def __init__(self, lab: Lab, browser: Any, name: str, shots: Path) -> None:
        self.lab, self.name, self.shots = lab, name, shots
        self.page = browser.new_page(viewport={"width": 1280, "height": 1000})
        self.page.set_default_timeout(UI_S * 1000)
        self.page.goto(lab.page_url(name))
        self.panel = self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        self.panel.locator(".jp-Cell").first.wait_for()
        # Should a "Select Kernel" dialog still come up, take the default.
        dialog = self.page.locator(".jp-Dialog", has_text="Select Kernel")
        try:
            dialog.locator("button", has_text="Select").click(timeout=5000)
        except Exception:
            pass  # no dialog
        # The kernel has started once the toolbar's indicator says idle.
        self.panel.locator(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']"
        ).wait_for(timeout=SERVER_START_S * 1000)

    def fail(self, message: str) -> AssertionError:
        """An AssertionError with a full-page screenshot and the server log."""
        shot = self.shots / f"FAILED-{Path(self.name).stem}.png"
        try:
            self.page.screenshot(path=str(shot), full_page=True)
        except Exception as exc:  # the page may be gone; keep the message
            shot = Path(f"(no screenshot: {exc})")
        return AssertionError(
            f"{self.name}: {message}\nscreenshot: {shot}\n"
            f"JupyterLab log (tail):\n{self.lab.log_tail()}"
        )

    def run_all(self) -> None:
        """Run > Run All Cells, wait until every code cell has run, save, and
        check the saved notebook has no error output."""
        self.page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
        self.page.locator(
            ".lm-Menu-item",
            has=self.page.locator(
                ".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")
            ),
        ).click()
        try:
            self.page.wait_for_function(
                """panel => {
                    const prompts = [...panel.querySelectorAll(
                        '.jp-CodeCell .jp-InputPrompt')];
                    return prompts.length > 0 &&
                        prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
                }""",
                arg=self.panel.element_handle(),
                timeout=CELL_RUN_S[self.name] * 1000,
                polling=500,
            )
        except Exception as exc:
            raise self.fail(f"not every cell ran: {exc}") from exc
        saved = self.save()
        errors = [
            f"{out.get('ename')}: {out.get('evalue')}"
            for cell in saved["cells"]
            for out in cell.get("outputs", [])
            if out.get("output_type") == "error"
        ]
        unrun = [
            i
            for i, cell in enumerate(saved["cells"])
            if cell["cell_type"] == "code" and cell.get("execution_count") is None
        ]
        if errors or unrun:
            raise self.fail(f"errors {errors}, cells not run {unrun}")
        text = self.panel.inner_text()
        for bad in ("Traceback", "Error displaying widget", "Failed to load model"):
            if bad in text:
                raise self.fail(f"{bad!r} in the notebook page")

    def save(self) -> dict[str, Any]:
        """Save with Ctrl+S and return the notebook as written to disk."""
        path = self.lab.root / self.name
        before = path.stat().st_mtime_ns
        self.page.keyboard.press("Control+s")
        deadline = time.monotonic() + UI_S
        while path.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                raise self.fail("Ctrl+S did not save the notebook")
            time.sleep(0.2)
        # Jupyter writes a temp file and renames it: the new file is whole.
        return json.loads(path.read_text(encoding="utf-8"))

    def widget(self, css_class: str) -> Any:
        """The rendered widget with `css_class` (the last one if several)."""
        loc = self.panel.locator(f".{css_class}").last
        try:
            loc.wait_for(state="visible")
        except Exception as exc:
            raise self.fail(f"widget .{css_class} not shown: {exc}") from exc
        return loc

    def shot(self, locator: Any, label: str) -> Path:
        path = self.shots / f"{Path(self.name).stem}-{label}.png"
        locator.scroll_into_view_if_needed()
        locator.screenshot(path=str(path))
        return path

    def wait_until(self, js: str, arg: Any, what: str, timeout_s: float) -> Any:
        try:
            return self.page.wait_for_function(
                js, arg=arg, timeout=timeout_s * 1000, polling=100
            ).json_value()
        except Exception as exc:
            raise self.fail(f"timed out waiting for {what}: {exc}") from exc

    def close(self) -> None:
        self.page.close()


# --------------------------------------------------------------------------
# 01_tokenizer: the token explorer
# --------------------------------------------------------------------------

READ_TOKENS_JS = """root => {
    const view = root.querySelector('.token-view');
    if (!view || view.children.length < 2) return null;
    return {
        header: view.children[0].textContent.trim(),
        boxes: [...view.children[1].children].map(
            box => [box.children[0].textContent,
                    Number(box.children[1].textContent)]),
    };
}"""


def read_tokens(explorer: Any) -> dict[str, Any]:
    tokens = explorer.evaluate(READ_TOKENS_JS)
    assert tokens is not None, "the token explorer shows no token view"
    return tokens


def shown_text(tokens: dict[str, Any]) -> str:
    """The text the boxes spell, with the visible-space dots undone."""
    return "".join(piece for piece, _ in tokens["boxes"]).replace("\u00b7", " ")


def type_and_wait(nb: Notebook, explorer: Any, text: str, n_tokens: int) -> dict:
    explorer.locator("textarea").fill(text)
    return nb.wait_until(
        f"root => ({READ_TOKENS_JS})(root)?.header === '{n_tokens} tokens'"
        f" && ({READ_TOKENS_JS})(root)",
        explorer.element_handle(),
        f"the explorer to show {n_tokens} tokens for {text!r}",
        UI_S,
    )


@pytest.fixture(scope="module")
def tokenizer_nb(lab: Lab, browser: Any, shots: Path) -> Any:
    nb = Notebook(lab, browser, TOKENIZER_NB, shots)
    nb.run_all()
    yield nb
    nb.close()


@pytest.fixture(scope="module")
def reference_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The project's (stand-in, exact) Qwen3 tokenizer, for expected ids."""
    from reasoning_from_scratch.qwen3 import Qwen3Tokenizer

    from utils.download.fetch import download_qwen3_small

    files = download_qwen3_small(
        "base", tokenizer_only=True, out_dir=tmp_path_factory.mktemp("tok")
    )
    return Qwen3Tokenizer(tokenizer_file_path=files.tokenizer)


def test_token_explorer_shows_book_tokens_and_follows_typing(
    tokenizer_nb: Notebook, reference_tokenizer: Any
) -> None:
    nb = tokenizer_nb
    explorer = nb.widget("qwen3-token-explorer")
    tokens = read_tokens(explorer)
    nb.shot(explorer, "token-explorer")
    assert tokens["header"] == "6 tokens"
    assert [tid for _, tid in tokens["boxes"]] == BOOK_IDS
    assert shown_text(tokens) == BOOK_PROMPT

    expected = reference_tokenizer.encode(NEW_SENTENCE)
    assert len(expected) != len(BOOK_IDS)  # so the count must change
    tokens = type_and_wait(nb, explorer, NEW_SENTENCE, len(expected))
    assert [tid for _, tid in tokens["boxes"]] == expected
    assert shown_text(tokens) == NEW_SENTENCE
    nb.shot(explorer, "token-explorer-typed")


# Canvas drawing uses the page's font fallback; a character no font covers is
# drawn as the same missing-glyph box as an unassigned code point.
GLYPH_JS = """([el, chars]) => {
    const family = getComputedStyle(el).fontFamily;
    const canvas = document.createElement('canvas');
    canvas.width = canvas.height = 64;
    const ctx = canvas.getContext('2d', {willReadFrequently: true});
    const draw = ch => {
        ctx.clearRect(0, 0, 64, 64);
        ctx.font = `40px ${family}`;
        ctx.textBaseline = 'top';
        ctx.fillStyle = '#000';
        ctx.fillText(ch, 4, 4);
        return Array.from(ctx.getImageData(0, 0, 64, 64).data);
    };
    const same = (a, b) => a.every((v, i) => v === b[i]);
    const ink = px => px.filter((v, i) => i % 4 === 3 && v > 0).length;
    const tofu = [draw('\\u0378'), draw('\\u0379')];
    const result = {family, tofu_consistent: same(tofu[0], tofu[1]), chars: {}};
    for (const ch of chars) {
        const px = draw(ch);
        result.chars[ch] = {ink: ink(px), tofu: tofu.some(t => same(px, t))};
    }
    return result;
}"""


def font_covers(charset_hex: str) -> bool | None:
    """Whether fontconfig knows a font with the code point (None: no fc-list)."""
    fc_list = shutil.which("fc-list")
    if fc_list is None:
        return None
    out = subprocess.run(
        [fc_list, f":charset={charset_hex}", "family"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return bool(out.stdout.strip())


def test_cjk_and_emoji_render_with_real_glyphs(
    tokenizer_nb: Notebook, reference_tokenizer: Any
) -> None:
    covered = [ch for ch, hexcode in GLYPHS.items() if font_covers(hexcode)]
    if not covered:
        pytest.skip("no CJK or emoji font (fonts-noto-cjk, fonts-noto-color-emoji)")
    nb = tokenizer_nb
    explorer = nb.widget("qwen3-token-explorer")
    n = len(reference_tokenizer.encode(CJK_SENTENCE))
    type_and_wait(nb, explorer, CJK_SENTENCE, n)
    nb.shot(explorer, "token-explorer-cjk-emoji")
    text_box = explorer.locator("textarea").element_handle()
    piece = explorer.locator(".token-view span > div").first.element_handle()
    in_pieces = [ch for ch in covered if ch in "解檬"]  # the emoji is split
    for where, handle, chars in (
        ("text box", text_box, covered),
        ("token boxes", piece, in_pieces),
    ):
        result = nb.page.evaluate(GLYPH_JS, [handle, chars])
        assert result["tofu_consistent"], result
        missing = [ch for ch, r in result["chars"].items() if r["tofu"] or not r["ink"]]
        assert not missing, (
            f"missing-glyph boxes for {missing} in the {where} "
            f"(font {result['family']!r}); fontconfig lists fonts for them"
        )


# --------------------------------------------------------------------------
# 04_generate: the generation panel
# --------------------------------------------------------------------------

# The Chinese panel's status line ("done: 12 tokens, 3.4 tokens/sec")
STATUS_RE = re.compile(r"^(完成|已停止)：(\d+) 个 token，每秒 [\d.]+ 个 token")

# Records every text the output shows, to see it grow while streaming.
OBSERVE_JS = """root => {
    const out = root.querySelector('.qwen3-generation-output');
    window.__qwen3Seen = [];
    if (window.__qwen3Observer) window.__qwen3Observer.disconnect();
    window.__qwen3Observer = new MutationObserver(() =>
        window.__qwen3Seen.push(out.textContent));
    window.__qwen3Observer.observe(
        out, {subtree: true, childList: true, characterData: true});
}"""

# Each description label of the panel, and whether its text is cut short
# (ipywidgets' labels end in an ellipsis where the text is wider than them).
LABELS_JS = """root => [...root.querySelectorAll('.widget-label, label')]
    .filter(el => el.textContent.trim())
    .map(el => ({text: el.textContent.trim(),
                 cut: el.scrollWidth > el.clientWidth + 1}))"""

STATUS_JS = """([root, pattern]) => {
    const status = root.querySelector('.qwen3-generation-status').textContent;
    return new RegExp(pattern).test(status) && status;
}"""


class Panel:
    """The generation panel's controls."""

    def __init__(self, nb: Notebook) -> None:
        self.nb = nb
        self.root = nb.widget("qwen3-generation-panel")
        self.handle = self.root.element_handle()
        self.generate = self.root.locator("button", has_text=ZH_TEXT["Generate"])
        self.stop = self.root.locator("button", has_text=ZH_TEXT["Stop"])

    def set_max_tokens(self, n: int) -> None:
        box = self.root.get_by_role("spinbutton", name=ZH_TEXT["Max tokens"])
        box.fill(str(n))
        box.press("Enter")
        box.blur()

    def wait_status(self, pattern: str, what: str) -> str:
        return self.nb.wait_until(STATUS_JS, [self.handle, pattern], what, GENERATION_S)

    @property
    def output(self) -> str:
        return self.root.locator(".qwen3-generation-output").inner_text()


@pytest.fixture(scope="module")
def generate_nb(lab: Lab, browser: Any, shots: Path) -> Any:
    nb = Notebook(lab, browser, GENERATE_NB, shots)
    nb.run_all()
    yield nb
    nb.close()


def test_generation_panel_streams_stops_and_restarts(generate_nb: Notebook) -> None:
    nb = generate_nb
    panel = Panel(nb)
    assert panel.generate.is_enabled() and panel.stop.is_disabled()
    labels = panel.root.evaluate(LABELS_JS)
    shown = [label["text"] for label in labels]
    assert "提示词" in shown and "最多 token 数" in shown, shown
    cut = [label["text"] for label in labels if label["cut"]]
    assert not cut, f"labels cut short (an ellipsis): {cut}"

    # A short run: the text grows while it streams, then the statistics line.
    asked = 12
    panel.set_max_tokens(asked)
    panel.root.evaluate(OBSERVE_JS)
    panel.generate.click()
    status = panel.wait_status(r"^完成：", "the first run to finish")
    match = STATUS_RE.match(status)
    assert match, status
    assert 1 <= int(match[2]) <= asked
    seen = [t for t in nb.page.evaluate("window.__qwen3Seen") if t.strip()]
    lengths = [len(t) for t in seen]
    assert len(set(lengths)) >= 2, f"output did not grow while streaming: {seen}"
    assert lengths == sorted(lengths), seen
    assert all(seen[-1].startswith(t) for t in seen), seen
    assert panel.output.strip()
    nb.shot(panel.root, "generation-panel")

    # A long run, stopped early: fewer tokens than asked, and it says so.
    long_run = 2000
    panel.set_max_tokens(long_run)
    panel.generate.click()
    panel.wait_status(r"^生成中：([2-9]|\d\d+) 个 token", "the long run to stream")
    panel.stop.click()
    status = panel.wait_status(r"^已停止：", "the stop to take effect")
    match = STATUS_RE.match(status)
    assert match and int(match[2]) < long_run, status
    assert panel.generate.is_enabled() and panel.stop.is_disabled()
    nb.shot(panel.root, "generation-panel-stopped")

    # The panel starts again after a stop.
    again = 3
    panel.set_max_tokens(again)
    panel.generate.click()
    status = panel.wait_status(r"^完成：", "the restarted run to finish")
    match = STATUS_RE.match(status)
    assert match and 1 <= int(match[2]) <= again, status
    assert panel.output.strip()
    nb.shot(panel.root, "generation-panel-restarted")
