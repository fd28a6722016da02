"""The commands `qwen3-generate` and `qwen3-chat` (`python -m utils.cli
generate|chat`), and `ChatSession`, the conversation behind the chat.
Everything is in `commands`; this is its door.
"""

from utils.cli.commands import ChatSession, chat_main, generate_main, main

__all__ = ["ChatSession", "chat_main", "generate_main", "main"]
