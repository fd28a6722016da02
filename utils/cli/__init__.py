"""The commands `qwen3-generate` and `qwen3-chat` (`python -m utils.cli
generate|chat`), and `ChatSession`, the conversation behind the chat, in
`commands`; the options and the loading other commands share
(`qwen3-batch`, `utils.batch`); this is its door.
"""

from utils.cli.commands import (
    ChatSession,
    Loaded,
    chat_main,
    generate_main,
    load,
    main,
    model_options,
)
from utils.cli.options import add_sampling_options, sampling_from

__all__ = [
    "ChatSession",
    "Loaded",
    "add_sampling_options",
    "chat_main",
    "generate_main",
    "load",
    "main",
    "model_options",
    "sampling_from",
]
