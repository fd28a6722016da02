"""Getting the book's Qwen3 0.6B files, and knowing what they are.

The door: `download_qwen3_small` (as the notebooks call it) and what the
commands, the importer and the engine need. Behind it: `fetch` (one file
after another, the store, the lock, then the sources), `sources` (Hugging
Face, then the book's mirror, with resume), `watch` (every wait bounded),
`errors` (what a failure says), `lock` (one download per file), `store`
(the model cache folder), `provenance` (content checks and records, the
stand-in markers) and `standin` (offline stand-ins).
"""

from utils.download.errors import disk_reason
from utils.download.fetch import (
    DownloadError,
    Qwen3Files,
    download_qwen3_small,
    file_names,
    local_files,
)
from utils.download.provenance import (
    IntegrityError,
    check_content,
    check_tokenizer,
    hash_file,
    model_config,
    print_standin_banner,
    read_record,
    record_path,
    sidecar_path,
    write_record,
)
from utils.download.standin import standin_enabled, standin_files_dir
from utils.download.store import store_dir

__all__ = [
    "DownloadError", "IntegrityError", "Qwen3Files", "check_content", "check_tokenizer",
    "disk_reason", "download_qwen3_small", "file_names", "hash_file", "local_files",
    "model_config", "print_standin_banner", "read_record", "record_path",
    "sidecar_path", "standin_enabled", "standin_files_dir", "store_dir", "write_record",
]  # fmt: skip
