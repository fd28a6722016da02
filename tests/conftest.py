"""The fixtures more than one test module uses. Stand-ins, kernels and
compile caches go to folders this run owns (the root conftest.py sets
QWEN3_STANDIN_DIR, QWEN3_KERNEL_CACHE and TORCHINDUCTOR_CACHE_DIR).

Environment variables only the tests read (the README lists the others):
    QWEN3_REAL_DOWNLOAD=1   run the tests that download the real model
                            (tests/test_real_download.py, test_download.py)
    QWEN3_REAL_DIR          where those keep the real files between runs
    QWEN3_BROWSER           the Chromium binary of tests/test_browser_widgets.py
    QWEN3_ZH_NOTEBOOKS=1    also run the Chinese notebooks under nbval
"""

import os
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_tls_context():
    """One TLS context for every HTTP client of the session. huggingface_hub
    makes a client per download, and each loads the system's CA bundle from
    disk; the tests speak plain HTTP to loopback hosts, so sharing
    one context changes nothing they check, only their time."""
    import functools

    try:
        from httpx2._transports import default
    except ImportError:  # another HTTP stack: nothing to share
        yield
        return
    original = default.create_ssl_context
    made = functools.lru_cache(maxsize=2)(original)

    def shared(verify=True, cert=None, trust_env=True):
        if verify is True and cert is None:
            return made(True, None, trust_env)
        return original(verify, cert, trust_env)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(default, "create_ssl_context", shared)
        yield


@pytest.fixture
def tiny_cfg():
    """The tiny float32 Qwen3 config of `tests.tiny` (GQA and qk-norm on)."""
    from tests.tiny import tiny_config

    return tiny_config()


@pytest.fixture(scope="session")
def tok(tmp_path_factory):
    """The real Qwen3 base tokenizer (its offline rebuild), once a session."""
    from tests._view_fixtures import load_tokenizer, standin_files

    path, _ = standin_files(tmp_path_factory, "base", tokenizer_only=True)
    return load_tokenizer(path)


@pytest.fixture(scope="module")
def model():
    """A tiny random Qwen3 with the real vocabulary, one per test module
    (tests may add hooks to it)."""
    from tests._view_fixtures import tiny_model

    return tiny_model()


@pytest.fixture(scope="session")
def standin_06b(tmp_path_factory):
    """(tokenizer path, weights path) of the 0.6B base stand-in, built once."""
    from tests._view_fixtures import standin_files

    return standin_files(tmp_path_factory, "base", tokenizer_only=False)


# --- the fast decoder's tests (tests/fast/) --------------------------------


@pytest.fixture(scope="session")
def kernels():
    """The fast decoder's CPU kernels; skips where they cannot be built."""
    from utils.fast import get_kernels

    loaded = get_kernels()
    if loaded is None:
        pytest.skip("the AVX2 kernel cannot be built on this machine")
    return loaded


@pytest.fixture(scope="session")
def test_kernels():
    """The library's test build: the same kernels plus tests/fast/csrc's
    entry points, with the scheduler's hooks (QWEN3_HOOKS, csrc/team.h);
    skips where it cannot be built."""
    from utils.fast import get_kernels
    from utils.fast.build import CSRC, Extra

    own = tuple(sorted((Path(__file__).parent / "fast" / "csrc").glob("*.[ch]")))
    loaded = get_kernels(Extra(own, include_dirs=(CSRC,), defines=("QWEN3_HOOKS",)))
    if loaded is None:
        pytest.skip("the AVX2 kernel cannot be built on this machine")
    return loaded


def _kernel_marks_madvised_memory() -> str | None:
    """Why this process gets no huge pages on request, or None where it
    does: the THP setting must be `always` or `madvise`, and the kernel
    must mark an anonymous map of our own advised MADV_HUGEPAGE ("hg" in
    /proc/self/smaps) and leave an unadvised neighbour unmarked. Made with
    Python's mmap, not utils.fast.hugepages, so the tests of that module
    still fail where it is broken. qemu-user, for one, accepts the advice
    without passing it on."""
    import ctypes
    import mmap
    from pathlib import Path

    from tests.memory_maps import vm_flags

    try:
        setting = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "no transparent huge pages on this machine (Linux only)"
    if "[always]" not in setting and "[madvise]" not in setting:
        return f"transparent huge pages are off ({setting.strip()})"
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return "this Python has no MADV_HUGEPAGE"
    huge = 2 << 20
    region = mmap.mmap(-1, 2 * huge)
    try:
        region.madvise(mmap.MADV_HUGEPAGE, 0, huge)  # the first half only
        view = (ctypes.c_char * (2 * huge)).from_buffer(region)
        start = ctypes.addressof(view)
        del view
        advised, plain = vm_flags(start), vm_flags(start + huge)
    except OSError as error:
        return f"madvise(MADV_HUGEPAGE) refused: {error}"
    finally:
        region.close()
    if advised is None or "hg" not in advised or "hg" in (plain or []):
        return (
            "the kernel does not mark memory advised MADV_HUGEPAGE in this "
            "process (as under qemu-user)"
        )
    return None


@pytest.fixture(scope="session")
def madvised_huge_pages():
    """Skips the test unless Linux honours MADV_HUGEPAGE for this process
    (probed once a session, see `_kernel_marks_madvised_memory`)."""
    reason = _kernel_marks_madvised_memory()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def fast_tiny():
    """(the book's model, a FastQwen3 sharing its weights) on the tiny
    float32 config with context 512: one pair per test module."""
    from tests.tiny import book_model, tiny_config, tiny_state_dict
    from utils.fast import FastQwen3

    cfg = tiny_config(context_length=512)
    book = book_model(tiny_state_dict(0, cfg), cfg)
    return book, FastQwen3.from_book_model(book)


@pytest.fixture
def exact_calls(monkeypatch):
    """Rows of every exact-kernel call eager code makes during the test."""
    from utils.fast.kernels import Kernels

    calls: list[int] = []
    real = Kernels.matvec

    def spy(self, x, weights, scales=None, *, exact=False, **kwargs):
        if exact:
            calls.append(sum(w.shape[0] for w in weights))
        return real(self, x, weights, scales, exact=exact, **kwargs)

    monkeypatch.setattr(Kernels, "matvec", spy)
    return calls


@pytest.fixture
def tmpfs(tmp_path):
    """Mounts a small tmpfs of this test's own: `tmpfs("64k")` (more mount
    options after the size, e.g. "ro") returns its folder, mode 700; root
    only (skips elsewhere, or where mounting fails); unmounted afterwards.
    A full or read-only disk without touching the machine's own."""
    mounted: list[Path] = []

    def mount(size: str, *options: str, name: str = "disk") -> Path:
        if os.name != "posix" or os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        folder = tmp_path / name
        folder.mkdir(mode=0o700)
        opts = ",".join((f"size={size}", "mode=0700", *options))
        cmd = ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(folder)]
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], check=False)


# --- downloads from loopback hosts (test_download*.py, test_model_store.py);
# their modules use `tiny_expectations` and `store` for every test ----------


@pytest.fixture
def tiny_expectations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Content checks expect the tiny model and the fake tokenizer's size."""
    from tests.download_helpers import TINY, VOCAB
    from utils.download import fetch, provenance, sources

    monkeypatch.setattr(provenance, "MODEL_CONFIG", TINY)
    monkeypatch.setattr(provenance, "TOKENIZER_VOCAB", VOCAB)
    monkeypatch.setattr(sources, "_BACKOFF", 0.01)
    monkeypatch.setattr(fetch, "_MIN_TIMEOUT", 0.1)  # quick tests may wait less


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch, tmp_path_factory) -> Path:
    """The model store of this test only (children started here get it too)."""
    folder = tmp_path_factory.mktemp("store")
    monkeypatch.setenv("QWEN3_MODEL_STORE", str(folder))
    return folder


@pytest.fixture
def payloads() -> dict[str, bytes]:
    """Files that pass the content checks, a few hundred kB each."""
    from tests.download_helpers import MODEL, TINY, TOK, VOCAB
    from tests.fake_hosts import fake_checkpoint, fake_tokenizer_json

    return {TOK: fake_tokenizer_json(VOCAB), MODEL: fake_checkpoint(TINY)}


@pytest.fixture
def hosts(monkeypatch: pytest.MonkeyPatch, payloads: dict[str, bytes]):
    """Hub (+ its CDN) and mirror, both serving `payloads`; real mode, no xet."""
    import huggingface_hub.constants
    import huggingface_hub.file_download

    from tests.fake_hosts import MIRROR_PREFIX, FakeHost, serve_like_b2, serve_like_hub

    monkeypatch.delenv("QWEN3_STANDIN", raising=False)
    monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)

    def no_xet(*args, **kwargs):
        raise AssertionError("plain HTTP servers must not trigger a xet download")

    monkeypatch.setattr(huggingface_hub.file_download, "xet_get", no_xet)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with FakeHost() as hub, FakeHost() as cdn, FakeHost() as mirror:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("QWEN3_BACKUP_URL", mirror.url + MIRROR_PREFIX.rstrip("/"))
        for name, data in payloads.items():
            serve_like_hub(hub, cdn, name, data)
            serve_like_b2(mirror, name, data, large=name.endswith(".pth"))
        yield hub, cdn, mirror


@pytest.fixture
def tiny_standin_weights(monkeypatch):
    """Build stand-in weights for a tiny config instead of the 0.6B shape."""
    import torch

    from tests.tiny import tiny_config
    from utils.download import standin

    tiny = tiny_config(dtype=torch.bfloat16)  # the real stand-in's dtype
    real = standin.write_standin_weights
    calls = []

    def write(path, kind="base", cfg=None):
        calls.append(Path(path))
        return real(path, kind, cfg=tiny)

    monkeypatch.setattr(standin, "write_standin_weights", write)
    # The exact tokenizer build takes ~20 s and is tested on its own; a small
    # JSON stands in for it here.
    qwen3_tokenizer = pytest.importorskip("utils.qwen3_tokenizer")
    monkeypatch.setattr(
        qwen3_tokenizer, "build_qwen3_tokenizer_json", lambda: '{"fake": true}'
    )
    return calls


@pytest.fixture
def standin_env(tmp_path, monkeypatch, tiny_standin_weights):
    """Stand-in mode with its own cache and files folder."""
    from utils.download import standin

    monkeypatch.setenv("QWEN3_STANDIN", "1")
    monkeypatch.setenv(standin.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(standin.DIR_ENV, str(tmp_path / "standin-files"))
    return tmp_path / "standin-files"


# --- the commands in process on the tiny model (test_cli.py, test_stdio.py) --


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(tokenizer, tiny model, tokenizer path)."""
    from tests._view_fixtures import load_tokenizer, standin_files, tiny_model

    tok_path, _ = standin_files(tmp_path_factory, "reasoning", tokenizer_only=True)
    return load_tokenizer(tok_path), tiny_model(), tok_path


@pytest.fixture
def tiny_cli(monkeypatch, tiny):
    """Make `cli.load` hand out the tiny model with the real tokenizer."""
    import torch

    from tests._view_fixtures import load_tokenizer
    from utils.cli import commands as cli
    from utils.streaming import GreedyStreamer

    tok, model, tok_path = tiny

    def fake_load(args, kind, **tokenizer_kwargs):
        cli._resolve_device(args.device)
        cli._check_fast(args.fast, args.cache, args.int8)
        t = load_tokenizer(tok_path, **tokenizer_kwargs)
        streamer = GreedyStreamer(model, int8=args.int8)
        return cli.Loaded(t, model, torch.device("cpu"), streamer, True)

    monkeypatch.setattr(cli, "load", fake_load)
    return tiny


@pytest.fixture
def unpinned():
    """torch's thread count and the native steps' pin as they were, after
    the test."""
    import torch

    from utils.fast.threads import pin_step_threads

    before = torch.get_num_threads()
    yield
    pin_step_threads(None)
    torch.set_num_threads(before)


@pytest.fixture
def bf16_cli(monkeypatch, tiny):
    """The commands' `load` (qwen3-generate, qwen3-chat, qwen3-batch) hands
    out the tiny model in bf16, which the native step runs, with the real
    tokenizer."""
    import torch

    from tests._view_fixtures import TINY_CFG, load_tokenizer, tiny_model
    from utils.cli import batch as batch_command
    from utils.cli import commands as cli
    from utils.models import load_book_model
    from utils.streaming import GreedyStreamer

    _, _, tok_path = tiny
    sd = tiny_model().state_dict()

    def fake_load(args, kind, **tokenizer_kwargs):
        cli._check_fast(args.fast, args.cache, args.int8)
        model = load_book_model(sd, dtype=torch.bfloat16, cfg=TINY_CFG)
        t = load_tokenizer(tok_path, **tokenizer_kwargs)
        streamer = GreedyStreamer(model, int8=args.int8, adopt=args.fast)
        return cli.Loaded(t, model, torch.device("cpu"), streamer, True)

    monkeypatch.setattr(cli, "load", fake_load)
    monkeypatch.setattr(batch_command, "load", fake_load)
    return fake_load
