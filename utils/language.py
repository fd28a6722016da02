"""The notebook's language, and the words its charts and widgets show in it.

The English notebooks and their Chinese copies in `zh/` share every code
cell, so whatever a cell draws or builds says its words through this table:
a chart's labels through `utils.plotting.chart_text`, a widget's buttons,
boxes and status line through `in_language`. English is the key; a text
without a Chinese entry stays English in both languages (a command's name,
`torch.compile`, a hardware name).

The language is "zh" in a folder named `zh` (where Jupyter starts the kernels
of the Chinese notebooks) or with `QWEN3_LANG=zh`, else "en".
"""

from __future__ import annotations

from pathlib import Path

from utils import settings

LANG_ENV = "QWEN3_LANG"

# English text -> the Chinese edition's wording (terms: ch02/README.zh.md).
ZH_TEXT = {
    # 02_load-model's chart
    "Qwen3 0.6B weights": "Qwen3 0.6B 权重大小",
    "as loaded": "加载后（输出层单独一份）",
    "tied once": "共享权重只算一次",
    # 03_next-token's charts and the next-token view
    "probability": "概率",
    "Top-10 next tokens after the prompt": "提示词之后概率最高的 10 个 token",
    "Top {k} next tokens": "下一个 token 的前 {k} 个候选",
    "Next token": "下一个 token",
    "Step": "前进一步",
    "Reset": "重置",
    # the token explorer (01_tokenizer)
    "Text": "文本",
    "1 token": "1 个 token",
    "{n} tokens": "{n} 个 token",
    # 05_kv-cache's chart
    "KV cache (bfloat16)": "KV 缓存（bfloat16）",
    "model weights (bfloat16)": "模型权重（bfloat16）",
    "tokens in the sequence": "序列中的 token 数",
    "KV cache memory of Qwen3 0.6B": "Qwen3 0.6B 的 KV 缓存内存占用",
    # 06_compile's chart and Table 2.1 (the book's four modes)
    "Regular": "常规",
    "Regular compiled": "常规 + 编译",
    "KV cache": "KV 缓存",
    "KV cache compiled": "KV 缓存 + 编译",
    "tokens/sec": "每秒 token 数",
    "This machine": "本机",
    "Table 2.1 from the book next to this machine ({device})": (
        "书中表 2.1 与本机（{device}）的结果对比"
    ),
    # the generation panel (04_generate)
    "Prompt": "提示词",
    "Max tokens": "最多 token 数",
    "fast path": "快速路径",
    "Temperature": "温度",
    "Seed": "随机种子",
    "compiles on first use: minutes of warm-up on a CPU": (
        "第一次使用时编译：在 CPU 上要预热几分钟"
    ),
    "static KV cache decoder from utils.fast (beyond the book)": (
        "utils.fast 中使用静态 KV 缓存的解码器（本书之外）"
    ),
    "Generate": "生成",
    "Stop": "停止",
    "starting ...": "正在启动……",
    "generating": "生成中",
    "done": "完成",
    "stopped": "已停止",
    "{state}: {n} tokens, {rate} tokens/sec": (
        "{state}：{n} 个 token，每秒 {rate} 个 token"
    ),
    "; {kind}: {gb} GB": "；{kind}：{gb} GB",
    "error: {message}": "出错：{message}",
    # 04_batched-inference's chart (bonus)
    "batch size": "batch 大小",
    "all sequences together": "所有序列合计",
    "each sequence": "每个序列",
    "Decode speed on this machine ({device})": "本机的解码速度（{device}）",
    "the book's batched model (bf16)": "书中的批量模型（bf16）",
    "this repository's fast decoder": "本仓库的快速解码器",
    # what `utils.device.peak_memory_bytes` says a memory figure is
    "Peak process memory (RSS)": "进程内存峰值（RSS）",
    "MPS memory held": "MPS 占用的内存",
    "Max CUDA memory allocated": "CUDA 显存分配峰值",
    "Max XPU memory allocated": "XPU 显存分配峰值",
}


def notebook_language() -> str:
    """ "zh" for a notebook in a `zh` folder (or `QWEN3_LANG=zh`), else "en"."""
    lang = (settings.text(LANG_ENV) or "").lower()
    if lang in {"zh", "en"}:
        return lang
    return "zh" if Path.cwd().name == "zh" else "en"


def in_language(text: str, /, lang: str | None = None, **fields: object) -> str:
    """`text` in `lang` (default: the notebook's language), formatted with
    `fields`; the English text where the table has no translation."""
    if (lang or notebook_language()) == "zh":
        text = ZH_TEXT.get(text, text)
    return text.format(**fields) if fields else text
