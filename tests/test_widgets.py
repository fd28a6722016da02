"""Widgets build without a browser, fall back to plain text, and the
generation panel streams the generator's tokens and can be stopped."""

from __future__ import annotations

import time

import pytest
import torch

from tests._view_fixtures import (
    unknown_id_model,
)
from utils import widgets
from utils.generation import generate_text_basic_stream_cache
from utils.token_view import render_plain, token_spans, top_k_next_tokens

PROMPT = "Explain large language models."


def reference_ids(model, tok, prompt, n):
    ids = torch.tensor([tok.encode(prompt)])
    return [int(t) for t in generate_text_basic_stream_cache(model, ids, n)]


def test_detection_rules(monkeypatch):
    assert widgets.widgets_enabled(plain=True) is False
    assert widgets.widgets_enabled(plain=False) is True
    # the switch the root conftest.py sets for the tests (nbval kernels
    # inherit it) -> plain
    assert widgets.widgets_enabled() is False
    monkeypatch.delenv("QWEN3_NO_WIDGETS")
    # Not inside an IPython kernel (this test process) -> plain
    assert widgets.widgets_enabled() is False


def test_token_explorer_widget_updates_with_text(tok):
    view = widgets.token_explorer(tok, PROMPT, plain=False)
    assert isinstance(view, widgets.TokenExplorer)
    assert "6 tokens" in view.tokens_html.value
    assert ">840</div>" in view.tokens_html.value
    view.text_box.value = "你好<|im_end|>"  # as if typed
    spans = token_spans(tok, "你好<|im_end|>")
    assert f"{len(spans)} tokens" in view.tokens_html.value
    assert ">151645</div>" in view.tokens_html.value
    bundle = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_token_explorer_plain_prints_book_lines(tok, capsys):
    assert widgets.token_explorer(tok, PROMPT) is None  # auto: plain in pytest
    out = capsys.readouterr().out
    assert out.startswith(render_plain(token_spans(tok, PROMPT)))
    assert "840 --> Ex" in out and "(6 tokens)" in out


def test_next_token_view_steps_and_resets(tok, model):
    view = widgets.next_token_view(model, tok, PROMPT, k=5, plain=False)
    assert isinstance(view, widgets.NextTokenView)
    prompt_ids = tok.encode(PROMPT)
    first = top_k_next_tokens(model, tok, prompt_ids, k=5)
    assert view.topk == first
    assert view.choice.value == first.ids[0]
    assert bytes(view.chart.value).startswith(b"\x89PNG")
    view.step_button.click()  # greedy step
    assert view.token_ids == [*prompt_ids, first.ids[0]]
    view.choice.value = view.topk.ids[2]
    picked = view.topk.ids[2]
    view.step_button.click()  # the selected token, not the argmax
    assert view.token_ids[-1] == picked
    assert view.topk == top_k_next_tokens(model, tok, view.token_ids, k=5)
    view.reset_button.click()
    assert view.token_ids == prompt_ids


def test_next_token_view_plain_prints_table(tok, model, capsys):
    assert widgets.next_token_view(model, tok, PROMPT, k=3, plain=True) is None
    out = capsys.readouterr().out.splitlines()
    top = top_k_next_tokens(model, tok, tok.encode(PROMPT), k=3)
    assert len(out) == 2 + 3
    for line, tid in zip(out[2:], top.ids, strict=True):
        assert line.split()[1] == str(tid)


@pytest.mark.heavy_under_emulation
def test_generation_panel_matches_generator(tok, model):
    panel = widgets.generation_panel(model, tok, PROMPT, max_new_tokens=12, plain=False)
    assert isinstance(panel, widgets.GenerationPanel)
    assert panel.stop_button.disabled
    # Each status line with the Generate button's state when it was shown:
    # the browser applies the changes in this order, so a final line must
    # find the buttons already back.
    shown = []
    panel.status.observe(
        lambda change: shown.append((change["new"], panel.generate_button.disabled)),
        names="value",
    )
    panel.generate_button.click()
    assert panel.wait(timeout=60)
    assert panel.error is None
    expected = reference_ids(model, tok, PROMPT, 12)
    assert panel.token_ids == expected
    assert panel.status.value.startswith(f"done: {len(expected)} tokens")
    assert shown[-1] == (panel.status.value, False)
    assert all(disabled for _, disabled in shown[:-1]), shown
    assert panel.stats["num_tokens"] == len(expected)
    assert panel.generate_button.disabled is False and panel.stop_button.disabled
    # Without the KV cache: same tokens
    panel.cache_box.value = False
    panel.start()
    assert panel.wait(timeout=60)
    assert panel.token_ids == expected


def test_the_panels_sampling_boxes_sample_as_the_commands_do(tok, model):
    """Temperature 0 (the default) is the greedy panel above; a temperature,
    top-k, top-p and seed draw what utils.sampling draws, the same twice."""
    from utils.sampling import Sampling
    from utils.streaming import GreedyStreamer

    panel = widgets.generation_panel(model, tok, PROMPT, max_new_tokens=8, plain=False)
    assert [b.value for b in panel.sampling_boxes] == [0.0, 0, 1.0, 123]
    assert panel.picker() is None
    for box, value in zip(panel.sampling_boxes, (1.3, 50, 0.9, 7), strict=True):
        box.value = value
    runs = []
    for _ in range(2):
        panel.start()
        assert panel.wait(timeout=60) and panel.error is None
        runs.append(list(panel.token_ids))
    picker = Sampling(1.3, 50, 0.9, 7).picker()
    prompt = torch.tensor([tok.encode(PROMPT)])
    want = list(
        GreedyStreamer(model).stream(prompt, 8, tok.eos_token_id, picker=picker)
    )
    assert runs == [want, want] and want != reference_ids(model, tok, PROMPT, 8)


def test_generation_panel_fast_toggle_state(tok, model):
    panel = widgets.generation_panel(model, tok, PROMPT, plain=False)
    assert not panel.fast_box.disabled and "utils.fast" in panel.fast_box.tooltip
    panel.fast_box.value = True
    panel.max_tokens.value = 6
    panel.start()
    assert panel.wait(timeout=60) and panel.error is None
    assert panel.token_ids == reference_ids(model, tok, PROMPT, 6)


def test_stop_button_stops_a_running_generation(tok, model):
    # Slow each forward pass down so the generation is still running when the
    # main thread presses Stop, as a user would.
    def slow(*_):
        time.sleep(0.05)

    handle = model.register_forward_pre_hook(slow)
    try:
        panel = widgets.generation_panel(
            model, tok, PROMPT, max_new_tokens=200, plain=False
        )
        panel.start()
        deadline = time.monotonic() + 60
        while len(panel.token_ids) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert panel.running
        panel.stop_button.click()
        assert panel.wait(timeout=30)
    finally:
        handle.remove()
    n = len(panel.token_ids)
    assert 3 <= n < 200
    assert panel.status.value.startswith(f"stopped: {n} tokens")
    assert panel.token_ids == reference_ids(model, tok, PROMPT, n)


def test_generation_panel_reports_errors_in_the_panel(tok, model):
    panel = widgets.generation_panel(model, tok, "", plain=False)  # empty prompt
    panel.start()
    assert panel.wait(timeout=30)
    assert panel.error is not None and "empty" in panel.error
    assert panel.status.value.startswith("error:")
    assert not panel.generate_button.disabled


def test_generation_panel_plain_streams_and_prints_stats(tok, model, capsys):
    assert widgets.generation_panel(model, tok, PROMPT, max_new_tokens=5) is None
    out = capsys.readouterr().out
    from utils.streaming import decode_bytes

    text = decode_bytes(tok, reference_ids(model, tok, PROMPT, 5))
    assert out.startswith(text)
    assert "tokens/sec" in out and "Time:" in out


def test_panel_and_next_token_view_show_unknown_ids(tok):
    model = unknown_id_model()
    panel = widgets.generation_panel(model, tok, PROMPT, max_new_tokens=4, plain=False)
    panel.start()
    assert panel.wait(timeout=60) and panel.error is None
    assert len(panel.token_ids) == 4
    assert panel.text == "".join(f"<unk:{i}>" for i in panel.token_ids)
    assert "&lt;unk:1517" in panel.output.value
    view = widgets.next_token_view(model, tok, PROMPT, k=3, plain=False)
    assert view.topk.pieces[0] == f"<unk:{view.topk.ids[0]}>"
    view.step_button.click()  # an unknown id can be appended and shown
    assert "&lt;unk:" in view.text_html.value


def test_the_widgets_speak_the_notebooks_language(tok, model, monkeypatch):
    """In a zh notebook the buttons, boxes, counts, chart and status line are
    Chinese (they once read "Next token", "Step", "Generate", "6 tokens");
    in an English one, English."""
    from utils.language import LANG_ENV

    monkeypatch.setenv(LANG_ENV, "zh")
    view = widgets.next_token_view(model, tok, PROMPT, k=3, plain=False)
    said = [view.choice.description, view.step_button.description,
            view.reset_button.description]  # fmt: skip
    assert said == ["下一个 token", "前进一步", "重置"]
    explorer = widgets.token_explorer(tok, PROMPT, plain=False)
    assert explorer.text_box.description == "文本"
    assert "<b>6 个 token</b>" in explorer.tokens_html.value
    panel = widgets.generation_panel(model, tok, PROMPT, max_new_tokens=3, plain=False)
    boxes = [panel.prompt_box, panel.max_tokens, panel.cache_box, panel.fast_box,
             panel.generate_button, panel.stop_button]  # fmt: skip
    said = [box.description for box in boxes]
    assert said == ["提示词", "最多 token 数", "KV 缓存", "快速路径", "生成", "停止"]
    said = [box.description for box in panel.sampling_boxes]
    assert said == ["温度", "top-k", "top-p", "随机种子"]
    panel.start()
    assert panel.wait(timeout=60) and panel.error is None
    assert panel.status.value.startswith("完成：3 个 token，每秒 ")
    assert "；进程内存峰值（RSS）：" in panel.status.value

    monkeypatch.setenv(LANG_ENV, "en")
    view = widgets.next_token_view(model, tok, PROMPT, k=3, plain=False)
    assert view.step_button.description == "Step"
    assert (
        "<b>6 tokens</b>"
        in widgets.token_explorer(tok, PROMPT, plain=False).tokens_html.value
    )
