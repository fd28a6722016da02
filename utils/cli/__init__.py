"""The commands: `qwen3-generate` and `qwen3-chat` (`python -m utils.cli
generate|chat`) and `ChatSession`, the conversation behind the chat, in
`commands`; `qwen3-batch` (`python -m utils.batch`) in `batch`; the options
they share in `options`. This is the door.
"""

from utils.cli.batch import batch_main, batch_parser
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
    "batch_main",
    "batch_parser",
    "chat_main",
    "generate_main",
    "load",
    "main",
    "model_options",
    "sampling_from",
]
