"""What a failed download says: each source with its cause in a few words,
then what the reader can try.

`describe_error` turns the nested exceptions of `requests`, `urllib3`,
`httpx` and `huggingface_hub` into one short line ("connection refused by
127.0.0.1:9", "timed out after 10 s", "HTTP 404 Not Found from ..."), and
`utils.download.DownloadError` gathers them with the `hints` (proxy, CA bundle, captive
portal, Hub mirror, ModelScope import, stand-ins).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from utils.download.provenance import IntegrityError
from utils.download.watch import SourceGaveUp, retry_after, wait_text

__all__ = ["describe_error", "disk_reason", "hints"]


def hints(out_dir: str | os.PathLike, kind: str) -> str:
    official = "Qwen3-0.6B-Base" if kind == "base" else "Qwen3-0.6B"
    also = (
        "\n    Notebook 01 also loads the reasoning tokenizer: download config.json and"
        "\n    tokenizer.json of Qwen/Qwen3-0.6B and import them with --kind reasoning"
        "\n    --tokenizer-only."
        if kind == "base"
        else ""
    )
    command = (
        "uv run python -m utils.hf_interop import-qwen3 FOLDER "
        f"--kind {kind} --out-dir {Path(out_dir).absolute()}"
    )
    return f"""\
What you can try:
  * Behind a proxy: set HTTPS_PROXY / HTTP_PROXY. If your network inspects TLS
    (company certificate), point REQUESTS_CA_BUNDLE and SSL_CERT_FILE at a CA
    bundle that contains that certificate.
  * A source answered with a web page instead of the file: a captive portal or
    login page (hotel, campus, company Wi-Fi). Open any web page in a browser,
    log in, then run this again.
  * Hugging Face blocked or slow where you are (e.g. mainland China): set
    HF_ENDPOINT to a Hugging Face mirror, e.g. HF_ENDPOINT=https://hf-mirror.com,
    and HF_HUB_DISABLE_XET=1 (Xet transfers may bypass the mirror).
  * Slow network: allow more seconds of silence, e.g. QWEN3_DOWNLOAD_TIMEOUT=60
    (it applies to both sources).
  * The official checkpoints (Qwen/Qwen3-0.6B-Base, Qwen/Qwen3-0.6B) are also on
    ModelScope (modelscope.cn). Download the Qwen/{official} folder and
    convert it into the book's verified files (in the repository):
      {command}{also}
  * Offline testing only: QWEN3_STANDIN=1 writes stand-ins instead, i.e. the real
    tokenizer and RANDOM weights of the real shape (gibberish text, NOT the model)."""


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and every exception it wraps (causes, contexts, `reason`s and
    exception arguments, as requests and urllib3 nest them), outermost first."""
    seen: list[BaseException] = []
    todo: list[Any] = [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None), *e.args]
    return seen


def _host(chain: list[BaseException], url: str) -> str:
    """The host an error was about: the request's, else the URL's."""
    for e in chain:
        with contextlib.suppress(Exception):  # httpx raises if no request
            return str(e.request.url.host)  # type: ignore[attr-defined]
        host = getattr(getattr(e, "conn", None), "host", None)
        if isinstance(host, str):
            return host
    return urlsplit(url).hostname or url


def _http_status(chain: list[BaseException], host: str) -> str | None:
    """ "HTTP 404 Not Found from <host>" for the first error that carries a
    response (with when to try again, if a 429/503 says)."""
    for e in chain:
        response = getattr(e, "response", None)
        code = getattr(response, "status_code", None)
        if isinstance(code, int):
            reason = getattr(response, "reason_phrase", None) or getattr(
                response, "reason", ""
            )
            text = f"HTTP {code} {reason or ''}".strip() + f" from {host}"
            wait = retry_after(response.headers) if code in (429, 503) else None
            return text if wait is None else f"{text}; it {wait_text(wait)}"
    return None


def describe_error(exc: BaseException, url: str, timeout: float) -> str:
    """The innermost cause of a failed try in a few words, e.g. "cannot
    resolve huggingface.co", "connection refused by 127.0.0.1:9", "timed out
    after 10 s", "HTTP 404 Not Found", or what a check found wrong."""
    chain = _chain(exc)
    for e in chain:  # our own errors already say it in one line
        if isinstance(e, (IntegrityError, SourceGaveUp)):
            return str(e)
    host = _host(chain, url)
    text = " ".join(str(e) for e in chain)
    errnos = {getattr(e, "errno", None) for e in chain}
    if errnos & {errno.ENOSPC, errno.EDQUOT}:
        return "no space left on the disk"
    if errno.EFBIG in errnos:
        return "file too large for this system's file size limit"
    if any(isinstance(e, socket.gaierror) for e in chain) or re.search(
        r"Name or service not known|nodename nor servname|getaddrinfo failed|"
        r"[Nn]ame resolution|NameResolution",
        text,
    ):
        return f"cannot resolve {host}"
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or (
        "Connection refused" in text or errno.ECONNREFUSED in errnos
    ):
        port = urlsplit(url).port
        return f"connection refused by {host}" + (f":{port}" if port else "")
    if any(isinstance(e, (TimeoutError, socket.timeout)) for e in chain) or any(
        "Timeout" in type(e).__name__ for e in chain
    ):
        return f"timed out after {timeout:g} s (no answer from {host})"
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        return f"the TLS certificate of {host} is not trusted (see the CA hint below)"
    status = _http_status(chain, host)
    if status:
        return status
    if any(isinstance(e, ConnectionResetError) for e in chain):
        return f"connection reset by {host}"
    inner = chain[-1] if chain else exc
    words = f"{type(inner).__name__}: {str(inner).strip()}".split()
    short = " ".join(words)
    return short if len(short) <= 120 else short[:117].rsplit(" ", 1)[0] + " ..."


_DISK_REASONS = {
    errno.ENOSPC: "no space left on the disk",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "a file is in the way",
    errno.EEXIST: "a file is in the way",
}


def disk_reason(exc: BaseException) -> str | None:
    """In a few words, why the local disk refused a write that `exc` (or,
    for a `DownloadError`, any source's failure) reports: full, over quota,
    read-only, not ours, a file where a folder should be. None for any
    other failure (the network, a bad download)."""
    errors = getattr(exc, "causes", None) or [exc]
    for error in errors:
        for e in _chain(error):
            reason = _DISK_REASONS.get(getattr(e, "errno", None))  # type: ignore[arg-type]
            if reason is not None:
                return reason
    return None
