"""What the download tests share (test_download*.py, test_model_store.py):
the file names, the fake tokenizer's size, checks of what arrived, the
lines the download logged, and a child process that downloads. Their
fixtures (loopback hosts, the store, stand-in mode) are in conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

from tests.fake_hosts import MIRROR_PREFIX, FakeHost
from tests.tiny import tiny_config
from utils.download import provenance
from utils.download.fetch import Qwen3Files
from utils.download.provenance import is_verified

TOK, MODEL = "tokenizer-base.json", "qwen3-0.6B-base.pth"
VOCAB = 12_000  # the fake tokenizer's vocabulary (Qwen3: 151,643)
TINY = tiny_config()


def assert_real(files: Qwen3Files, payloads: dict[str, bytes]) -> None:
    assert not files.standin
    for path in files:
        assert path.read_bytes() == payloads[path.name]
        assert is_verified(path)
        assert not provenance.is_standin(path)
        assert not path.with_name(path.name + ".part").exists()


def flip_byte_keep_mtime(path: Path) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns


def said(err: str, by: str = "utils.") -> list[str]:
    """The lines the `utils` loggers (or the one named `by`) wrote into
    `err`, without their prefix."""
    return [
        line.split(": ", 1)[1]
        for line in err.splitlines()
        if line.startswith(by) and ": " in line
    ]


def source_lines(err: str, name: str) -> list[str]:
    return [line for line in said(err) if line.startswith(f"{name}: ")]


def failed_lines(out: str, name: str) -> list[str]:
    return [line for line in source_lines(out, name) if " failed: " in line]


CHILD = """
import signal, sys
# Ctrl-C as in a reader's shell, whatever the test run left ignored (an
# ignored SIGINT is inherited across exec, and Python then keeps ignoring it)
signal.signal(signal.SIGINT, signal.default_int_handler)
from tests.tiny import tiny_config
from utils.download import fetch as download
from utils.download import provenance
provenance.MODEL_CONFIG = tiny_config()
provenance.TOKENIZER_VOCAB = int(sys.argv[2])
if sys.argv[3] == "die-after-transfer":
    import os
    provenance.hash_file = lambda path: os._exit(3)
files = download.download_qwen3_small(
    "base", tokenizer_only=sys.argv[4] == "tok", out_dir=sys.argv[1]
)
print("OK", files.tokenizer, files.model)
"""


def child_env(hub: FakeHost, mirror: FakeHost) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QWEN3_")}
    env.update(
        QWEN3_MODEL_STORE=os.environ["QWEN3_MODEL_STORE"],
        HF_ENDPOINT=hub.url,
        QWEN3_BACKUP_URL=mirror.url + MIRROR_PREFIX.rstrip("/"),
        HF_HUB_OFFLINE="0",
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
    )
    return env


def run_child(out: Path, env: dict, mode: str = "", what: str = "all"):
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(out), str(VOCAB), mode or "-", what],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
