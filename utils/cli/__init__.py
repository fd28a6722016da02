"""The commands: `qwen3-generate` and `qwen3-chat` (`python -m utils.cli
generate|chat`) and `ChatSession`, the conversation behind the chat, in
`commands`; `qwen3-batch` (`python -m utils.batch`) in `batch`; the options
they share in `options`. This is the door.

Each name is imported from its module on first use, not here: a command's
entry point (`utils.cli:generate_main`) imports this package before its
body runs, and torch's import (seconds) then happens inside the command,
where Ctrl-C ends it with one line instead of a traceback.
"""

from utils.lazy import lazy_attributes

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

_HOMES = {
    "batch": ("batch_main", "batch_parser"),
    "commands": ("ChatSession", "Loaded", "chat_main", "generate_main", "load",
                 "main", "model_options"),
    "options": ("add_sampling_options", "sampling_from"),
}  # fmt: skip


__getattr__ = lazy_attributes(__name__, _HOMES)
