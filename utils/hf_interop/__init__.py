"""Official Qwen3 checkpoints (Hugging Face safetensors) and the book's files,
both ways (`python -m utils.hf_interop import-qwen3 | export`).

The door: the importer and exporter and the two conversions the benchmark's
`hf_static` mode uses. Behind it: `convert` (folders, checks, the command)
and `mapping` (parameter names and configs, book <-> Hugging Face).
"""

from utils.hf_interop.convert import (
    export_hf_folder,
    import_qwen3,
    load_hf_checkpoint,
    main,
)
from utils.hf_interop.mapping import book_to_hf_state_dict, hf_config_from_book

__all__ = [
    "book_to_hf_state_dict", "export_hf_folder", "hf_config_from_book", "import_qwen3",
    "load_hf_checkpoint", "main",
]  # fmt: skip
