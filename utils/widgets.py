"""Interactive notebook views built on `utils.token_view`.

* `token_explorer(tokenizer, text)`: a text box and the coloured tokens, ids
  and token count, updated as you type.
* `next_token_view(model, tokenizer, prompt, k)`: the top-k next-token chart;
  "Step" appends the chosen token (the most likely one unless you pick
  another) and redraws.
* `generation_panel(model, tokenizer, prompt)`: streams generated text with
  tokens/sec, with KV cache / compile / fast-path switches, sampling boxes
  (temperature 0: greedy) and a Stop button.

Their words (buttons, boxes, status line, chart) follow the notebook's
language (`utils.language`: Chinese in the `zh/` notebooks).

When widgets cannot be shown, each function prints a plain result instead and
returns None. Plain mode is used when `plain=True` is passed, when the
environment variable QWEN3_NO_WIDGETS is 1/true/yes/on (the test run sets it,
and the notebook kernels it starts inherit it), when ipywidgets is not
installed, or when the code does not run inside a Jupyter (ipykernel) kernel,
e.g. in a script or the terminal IPython. `plain=False` forces widgets, e.g.
to build them in tests without a browser. A kernel cannot tell whether its
frontend renders widgets (plain `jupyter nbconvert` does not), so set
QWEN3_NO_WIDGETS=1 there.

Stopping: the generation panel decodes in a background thread. The cell that
starts it returns at once, so the kernel is free to handle the Stop click,
which sets a `threading.Event` that the thread checks before each new token
(a stop lands after the current token; during a torch.compile warm-up it
lands once the first compiled step returns). Widget values are updated from
that thread, which ipywidgets supports.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Sequence
from typing import Any

from utils import settings
from utils.language import in_language

NO_WIDGETS_ENV = "QWEN3_NO_WIDGETS"
DEFAULT_PROMPT = "Explain large language models."


def widgets_enabled(plain: bool | None = None) -> bool:
    """Whether to build widgets (True) or print plain results (False); see
    the module docstring for the rules. `plain` overrides them."""
    if plain is not None:
        return not plain
    if settings.flag(NO_WIDGETS_ENV):
        return False
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class _View:
    """Displays as its `widget` in Jupyter."""

    widget: Any

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


# --------------------------------------------------------------------------
# Token explorer
# --------------------------------------------------------------------------


class TokenExplorer(_View):
    """Text box plus coloured token boxes (ids below, count on top)."""

    def __init__(self, tokenizer: Any, text: str) -> None:
        import ipywidgets as w

        self.tokenizer = tokenizer
        self.text_box = w.Textarea(
            value=text,
            description=in_language("Text"),
            continuous_update=True,
            layout=w.Layout(width="100%", height="5em"),
        )
        self.tokens_html = w.HTML()
        self.text_box.observe(lambda change: self.update(), names="value")
        self.widget = w.VBox([self.text_box, self.tokens_html])
        self.widget.add_class("qwen3-token-explorer")  # hook for the browser test
        self.update()

    @property
    def spans(self) -> list[Any]:
        from utils.token_view import token_spans

        return token_spans(self.tokenizer, self.text_box.value)

    def update(self) -> None:
        from utils.token_view import render_html

        self.tokens_html.value = render_html(self.spans)


def token_explorer(
    tokenizer: Any, text: str = DEFAULT_PROMPT, plain: bool | None = None
) -> TokenExplorer | None:
    """Show how `tokenizer` splits `text`: a live widget, or (plain mode) the
    book's ``<id> --> <piece>`` lines and the token count."""
    from utils.token_view import render_plain, token_spans

    if widgets_enabled(plain):
        return TokenExplorer(tokenizer, text)
    spans = token_spans(tokenizer, text)
    print(render_plain(spans))
    print(f"({len(spans)} tokens)")
    return None


# --------------------------------------------------------------------------
# Next-token view
# --------------------------------------------------------------------------


def _format_top_k(topk: Any) -> str:
    lines = [f"{'rank':>4}  {'id':>6}  {'prob':>7}  piece"]
    for rank, (tid, piece, prob) in enumerate(topk.rows(), start=1):
        lines.append(f"{rank:>4}  {tid:>6}  {prob:7.4f}  {piece!r}")
    return "\n".join(lines)


class NextTokenView(_View):
    """Top-k chart for the current text; Step appends the chosen token."""

    def __init__(self, model: Any, tokenizer: Any, prompt: str, k: int) -> None:
        import ipywidgets as w

        self.model, self.tokenizer, self.k = model, tokenizer, k
        self.prompt_ids = list(tokenizer.encode(prompt))
        self.token_ids = list(self.prompt_ids)
        self.topk: Any = None
        self.text_html = w.HTML()
        self.chart = w.Image(format="png")
        self.choice = w.Dropdown(description=in_language("Next token"))
        self.step_button = w.Button(
            description=in_language("Step"), button_style="primary"
        )
        self.reset_button = w.Button(description=in_language("Reset"))
        self.step_button.on_click(lambda _: self.step(self.choice.value))
        self.reset_button.on_click(lambda _: self.reset())
        self.widget = w.VBox(
            [
                self.text_html,
                w.HBox([self.choice, self.step_button, self.reset_button]),
                self.chart,
            ]
        )
        self.refresh()

    def refresh(self) -> None:
        """Recompute the top-k for the current ids and redraw."""
        from utils.streaming import decode_bytes
        from utils.token_view import figure_png, plot_top_k, top_k_next_tokens

        self.topk = top_k_next_tokens(
            self.model, self.tokenizer, self.token_ids, self.k
        )
        prompt = decode_bytes(self.tokenizer, self.prompt_ids)
        added = decode_bytes(self.tokenizer, self.token_ids[len(self.prompt_ids) :])
        self.text_html.value = (
            '<div style="font-family:monospace;white-space:pre-wrap">'
            f"{html.escape(prompt)}<b style='background:#fef3c7'>"
            f"{html.escape(added)}</b></div>"
        )
        self.choice.options = [
            (f"{piece!r} ({prob:.3f})", tid) for tid, piece, prob in self.topk.rows()
        ]
        self.choice.value = self.topk.ids[0]
        self.chart.value = figure_png(plot_top_k(self.topk))

    def step(self, token_id: int | None = None) -> list[int]:
        """Append `token_id` (default: the most likely) and redraw."""
        if token_id is None:
            token_id = self.topk.ids[0]
        self.token_ids = [*self.token_ids, int(token_id)]
        self.refresh()
        return self.token_ids

    def reset(self) -> None:
        self.token_ids = list(self.prompt_ids)
        self.refresh()


def next_token_view(
    model: Any,
    tokenizer: Any,
    prompt: str = DEFAULT_PROMPT,
    k: int = 10,
    plain: bool | None = None,
) -> NextTokenView | None:
    """Chart the `k` most likely next tokens after `prompt`, with a Step
    button; plain mode prints the same top-k as a table."""
    from utils.token_view import top_k_next_tokens

    if widgets_enabled(plain):
        return NextTokenView(model, tokenizer, prompt, k)
    topk = top_k_next_tokens(model, tokenizer, tokenizer.encode(prompt), k)
    print(f"Top {len(topk.ids)} next tokens after {prompt!r}:")
    print(_format_top_k(topk))
    return None


# --------------------------------------------------------------------------
# Generation panel
# --------------------------------------------------------------------------


class GenerationPanel(_View):
    """Prompt box, options, Generate/Stop buttons and live streamed text.

    `start()` launches generation in a background thread, `stop()` asks it to
    end before the next token, `wait()` joins it. `token_ids` and `text` hold
    what was generated so far.
    """

    UPDATE_EVERY_S = 0.1  # at most ~10 widget updates per second

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        prompt: str,
        max_new_tokens: int,
        eos_token_id: int | None,
    ) -> None:
        import ipywidgets as w

        from utils.streaming import GreedyStreamer

        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.streamer = GreedyStreamer(model)
        self.token_ids: list[int] = []
        self.text = ""
        self.stats: dict[str, Any] | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

        self._build_widget(w, prompt, max_new_tokens, int(model.cfg["context_length"]))

    def _build_widget(
        self, w: Any, prompt: str, max_new_tokens: int, context_length: int
    ) -> None:
        """The prompt box, the options, the two buttons, the output and the
        status line in one box, `self.widget` (`w`: the ipywidgets module)."""
        self.prompt_box = w.Textarea(
            value=prompt,
            description=in_language("Prompt"),
            layout=w.Layout(width="100%"),
        )
        self.max_tokens = w.BoundedIntText(
            value=max_new_tokens,
            min=1,
            max=context_length,
            description=in_language("Max tokens"),
            style={"description_width": "initial"},  # the whole label, any language
        )
        self.cache_box = w.Checkbox(value=True, description=in_language("KV cache"))
        self.compile_box = w.Checkbox(
            value=False,
            description="torch.compile",
            tooltip=in_language("compiles on first use: minutes of warm-up on a CPU"),
        )
        self.fast_box = w.Checkbox(
            value=False,
            description=in_language("fast path"),
            tooltip=in_language(
                "static KV cache decoder from utils.fast (beyond the book)"
            ),
        )
        self.generate_button = w.Button(
            description=in_language("Generate"), button_style="primary"
        )
        self.stop_button = w.Button(
            description=in_language("Stop"), button_style="danger", disabled=True
        )
        self.output = w.HTML()
        self.status = w.Label()
        self.generate_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        self.widget = w.VBox(
            [
                self.prompt_box,
                w.HBox([self.max_tokens, self.cache_box, self.compile_box]),
                w.HBox(self._sampling_boxes(w)),
                w.HBox([self.fast_box, self.generate_button, self.stop_button]),
                self.output,
                self.status,
            ]
        )
        # Class names a page's scripts (and the browser test) find them by:
        self.widget.add_class("qwen3-generation-panel")
        self.output.add_class("qwen3-generation-output")
        self.status.add_class("qwen3-generation-status")

    def _sampling_boxes(self, w: Any) -> list[Any]:
        """Temperature (0: the chapter's argmax), top-k (0: all), top-p (1:
        all) and the seed of the draws (`utils.sampling.Sampling.of_boxes`)."""
        kw = dict(style={"description_width": "initial"}, layout=w.Layout(width="auto"))
        self.sampling_boxes = [
            w.BoundedFloatText(0.0, min=0.0, max=5.0, step=0.1,
                               description=in_language("Temperature"), **kw),
            w.BoundedIntText(0, min=0, max=10**6, description="top-k", **kw),
            w.BoundedFloatText(1.0, min=0.01, max=1.0, step=0.05,
                               description="top-p", **kw),
            w.BoundedIntText(123, min=0, max=2**31 - 1,
                             description=in_language("Seed"), **kw),
        ]  # fmt: skip
        return self.sampling_boxes

    def picker(self) -> Any:
        """The picker the sampling boxes ask for (None: greedy)."""
        from utils.sampling import Sampling

        sampling = Sampling.of_boxes(*(b.value for b in self.sampling_boxes))
        return None if sampling.greedy else sampling.picker()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> threading.Thread | None:
        """Start generating in a background thread (no-op while running)."""
        if self.running:
            return None
        self._stop.clear()
        self.token_ids, self.text, self.stats, self.error = [], "", None, None
        self.generate_button.disabled, self.stop_button.disabled = True, False
        self.status.value = in_language("starting ...")
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        """Ask the generation to end before its next token."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the generation to end; True if it has."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    def _show(self, elapsed: float, final: bool = False) -> str:
        """Show the text so far; its status line, shown here unless `final`."""
        n = len(self.token_ids)
        rate = n / elapsed if elapsed > 0 else 0.0
        self.output.value = (
            f'<pre style="white-space:pre-wrap;margin:0">{html.escape(self.text)}</pre>'
        )
        state = "done" if final else "generating"
        state = "stopped" if final and self._stop.is_set() else state
        status = in_language(
            "{state}: {n} tokens, {rate} tokens/sec",
            state=in_language(state), n=n, rate=f"{rate:.1f}",
        )  # fmt: skip
        if not final:
            self.status.value = status
        return status

    def _work(self) -> None:
        from utils.errors import first_line
        from utils.streaming import stream_generation

        start = time.perf_counter()
        last = start - self.UPDATE_EVERY_S  # show the first piece at once

        def write(piece: str) -> None:
            nonlocal last
            self.text += piece
            now = time.perf_counter()
            if now - last >= self.UPDATE_EVERY_S:
                self._show(now - start)
                last = now

        try:
            result = stream_generation(
                self.streamer,
                self.tokenizer,
                self.tokenizer.encode(self.prompt_box.value),
                int(self.max_tokens.value),
                self.eos_token_id,
                write,
                cache=self.cache_box.value,
                compile=self.compile_box.value,
                fast=self.fast_box.value,
                should_stop=self._stop.is_set,
                on_token=self.token_ids.append,
                stats="quiet",
                picker=self.picker(),
            )
            self.stats = result.stats
            status = self._show(result.elapsed_s, final=True)
            if self.stats:
                gb = f"{self.stats['peak_mem_bytes'] / 1024**3:.2f}"
                kind = in_language(self.stats["memory_kind"])
                status += in_language("; {kind}: {gb} GB", kind=kind, gb=gb)
        except Exception as exc:  # shown in the panel; the thread must not die
            self.error = f"{type(exc).__name__}: {exc}"
            status = in_language("error: {message}", message=first_line(exc))
        finally:
            self.generate_button.disabled, self.stop_button.disabled = False, True
        self.status.value = status  # last: a final line means "ready again"


def generation_panel(
    model: Any,
    tokenizer: Any,
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 100,
    eos_token_id: int | None = None,
    plain: bool | None = None,
    cache: bool = True,
) -> GenerationPanel | None:
    """A live generation panel; plain mode streams the text with `print` and
    then prints time, tokens/sec and memory (`utils.generation.generate_stats`).
    `eos_token_id` defaults to the tokenizer's."""
    from utils.streaming import GreedyStreamer, stream_generation

    if eos_token_id is None:
        eos_token_id = getattr(tokenizer, "eos_token_id", None)
    if widgets_enabled(plain):
        return GenerationPanel(model, tokenizer, prompt, max_new_tokens, eos_token_id)
    stream_generation(
        GreedyStreamer(model), tokenizer, tokenizer.encode(prompt), max_new_tokens,
        eos_token_id, lambda piece: print(piece, end="", flush=True), cache=cache,
        stats="print",
    )  # fmt: skip
    return None


__all__: Sequence[str] = [
    "widgets_enabled", "token_explorer", "next_token_view", "generation_panel",
    "TokenExplorer", "NextTokenView", "GenerationPanel",
]  # fmt: skip
