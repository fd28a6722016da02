"""A loopback HTTP server that plays the Hugging Face Hub, its CDN and the
Backblaze mirror in download tests: programmable files and faults, and a log
of every request it saw."""

from __future__ import annotations

import functools
import hashlib
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Resource:
    """What the server answers for one path.

    status: answer this status with an empty body instead of the data.
    redirect: answer 302 to this URL (with `headers`, like the Hub's /resolve).
    drop_after: for the n-th GET (in order), close the connection after sending
        this many body bytes; None entries serve normally.
    honour_range: answer Range requests with 206 (else always 200, full body).
    body: bytes actually sent (defaults to `data`), to play a lying server.
    delay: seconds to pause after each 64 kB of body (a slow link).
    statuses: for the n-th GET (in order), answer this status with an empty
        body (and `headers`); None entries, and GETs after the list, serve.
    trickle: for the first `trickle_gets` GETs, send one byte every `trickle`
        seconds (slow-loris), the headers too if `trickle_headers`; after
        `trickle_for` seconds the connection is closed.
    length: the Content-Length to announce instead of the true one (a CDN
        that lies about it); the connection closes after the body.
    """

    data: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200
    redirect: str | None = None
    drop_after: list[int | None] = field(default_factory=list)
    honour_range: bool = True
    body: bytes | None = None
    delay: float = 0.0
    statuses: list[int | None] = field(default_factory=list)
    trickle: float = 0.0
    trickle_headers: bool = False
    trickle_gets: int = 1
    trickle_for: float = 10.0
    length: int | None = None


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


class FakeHost:
    """Threaded HTTP/1.1 server on 127.0.0.1; use as a context manager."""

    def __init__(self) -> None:
        self.resources: dict[str, Resource] = {}
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        host = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                host._serve(self, head=True)

            def do_GET(self) -> None:
                host._serve(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # a short poll: `shutdown` waits for the loop to see it
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.005,), daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHost:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def seen(self, method: str | None = None, contains: str = "") -> list[Seen]:
        """Requests seen so far, optionally filtered by method and path part."""
        with self._lock:
            return [
                r
                for r in self.requests
                if (method is None or r.method == method) and contains in r.path
            ]

    def _serve(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        with self._lock:
            self.requests.append(
                Seen(h.command, h.path, {k.lower(): v for k, v in h.headers.items()})
            )
            res = self.resources.get(h.path)
            drop = answer = None
            trickle = 0.0
            if res is not None and not head:
                drop = res.drop_after.pop(0) if res.drop_after else None
                answer = res.statuses.pop(0) if res.statuses else None
                if res.trickle and res.trickle_gets > 0:
                    res.trickle_gets -= 1
                    trickle = res.trickle
        if res is None:
            return self._send_empty(h, 404, {})
        if res.redirect is not None:
            return self._send_empty(h, 302, {**res.headers, "Location": res.redirect})
        if answer is not None or res.status != 200:
            return self._send_empty(h, answer or res.status, res.headers)

        body = res.data if res.body is None else res.body
        total = len(res.data)
        status, start = 200, 0
        rng = h.headers.get("Range")
        if rng and res.honour_range:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= total:
                return self._send_empty(h, 416, {"Content-Range": f"bytes */{total}"})
            status = 206
        payload = body[start:]
        headers = {**res.headers, "Accept-Ranges": "bytes"}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{total - 1}/{total}"
        headers["Content-Length"] = str(
            total - start if res.length is None else res.length
        )
        if trickle and res.trickle_headers:
            lines = [f"{k}: {v}" for k, v in headers.items()]
            raw = "\r\n".join([f"HTTP/1.1 {status} OK", *lines, "", ""]).encode()
            return self._dribble(h, raw + payload, trickle, res.trickle_for)
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return
        if trickle:
            return self._dribble(h, payload, trickle, res.trickle_for)
        if drop is not None or res.length is not None:
            h.wfile.write(payload[:drop])
            h.wfile.flush()
            h.close_connection = True
            return
        if not res.delay:
            h.wfile.write(payload)
            return
        for i in range(0, len(payload), 1 << 16):
            h.wfile.write(payload[i : i + (1 << 16)])
            h.wfile.flush()
            time.sleep(res.delay)

    @staticmethod
    def _dribble(
        h: BaseHTTPRequestHandler, data: bytes, every: float, limit: float
    ) -> None:
        """Send `data` one byte every `every` seconds for at most `limit`
        seconds, then close the connection (slow-loris)."""
        h.close_connection = True
        end = time.monotonic() + limit
        try:
            for i in range(len(data)):
                if time.monotonic() > end:
                    return
                h.wfile.write(data[i : i + 1])
                h.wfile.flush()
                time.sleep(every)
        except OSError:  # the client gave up: what the test wants
            return

    @staticmethod
    def _send_empty(h: BaseHTTPRequestHandler, status: int, headers: dict) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", "0")
        h.end_headers()


class SilentHost:
    """A host that accepts TCP connections and never answers (a black hole
    behind a firewall); use as a context manager."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)  # the kernel completes handshakes; nobody reads

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def __enter__(self) -> SilentHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


COMMIT = "0123456789abcdef0123456789abcdef01234567"
HUB_PREFIX = "/rasbt/qwen3-from-scratch/resolve/main/"
MIRROR_PREFIX = "/file/reasoning-from-scratch/qwen3-0.6B/"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def serve_like_hub(hub: FakeHost, cdn: FakeHost, name: str, data: bytes) -> Resource:
    """Publish `data` the way the Hub does: JSON files straight from /resolve
    with the git blob id as ETag; .pth files as LFS, i.e. a 302 to a CDN host
    carrying X-Linked-Etag (sha256) and X-Linked-Size. Returns the resource
    that sends the bytes (to attach faults to)."""
    base = {"X-Repo-Commit": COMMIT}
    if name.endswith(".json"):
        res = Resource(data, {**base, "ETag": f'"{git_blob_sha1(data)}"'})
        hub.resources[HUB_PREFIX + name] = res
        return res
    sha256 = hashlib.sha256(data).hexdigest()
    hub.resources[HUB_PREFIX + name] = Resource(
        headers={
            **base,
            "ETag": '"hub-redirect-etag"',
            "X-Linked-Etag": f'"{sha256}"',
            "X-Linked-Size": str(len(data)),
        },
        redirect=f"{cdn.url}/cdn/{name}",
    )
    res = Resource(data, {"ETag": f'"{sha256}"'})
    cdn.resources[f"/cdn/{name}"] = res
    return res


def serve_like_b2(mirror: FakeHost, name: str, data: bytes, large: bool) -> Resource:
    """Publish `data` the way Backblaze B2 does: small files carry
    x-bz-content-sha1; large ones say "none" and give x-bz-info-large_file_sha1."""
    sha1 = hashlib.sha1(data).hexdigest()
    headers = (
        {"x-bz-content-sha1": "none", "x-bz-info-large_file_sha1": sha1}
        if large
        else {"x-bz-content-sha1": sha1}
    )
    res = Resource(data, headers)
    mirror.resources[MIRROR_PREFIX + name] = res
    return res


@functools.lru_cache(maxsize=8)  # bytes: the tests share them read-only
def fake_tokenizer_json(vocab_size: int, salt: str = "") -> bytes:
    """A tokenizer.json with `vocab_size` BPE entries followed by Qwen3's 26
    added tokens: passes the download's content check when the expected
    vocabulary size is set to `vocab_size`."""
    import json

    from utils.download.provenance import ADDED_TOKENS

    data = {
        "version": "1.0",
        "added_tokens": [
            {"id": vocab_size + i, "content": tok, "special": i < 14}
            for i, tok in enumerate(ADDED_TOKENS)
        ],
        "model": {
            "type": "BPE",
            "vocab": {f"{salt}t{i}": i for i in range(vocab_size)},
            "merges": [],
        },
    }
    return json.dumps(data).encode()


def fake_checkpoint(cfg: dict, seed: int = 0) -> bytes:
    """The bytes of a `torch.save`d random state dict of `Qwen3Model(cfg)`."""
    return _fake_checkpoint(tuple(sorted(cfg.items())), seed)


@functools.lru_cache(maxsize=8)
def _fake_checkpoint(cfg_items: tuple, seed: int) -> bytes:
    import io

    import torch
    from reasoning_from_scratch.qwen3 import Qwen3Model

    torch.manual_seed(seed)
    buf = io.BytesIO()
    torch.save(Qwen3Model(dict(cfg_items)).state_dict(), buf)
    return buf.getvalue()
