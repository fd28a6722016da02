"""Weights on 2 MB pages (Linux transparent huge pages) for the native step.

A decode step streams every weight once per token, and on some CPUs 2 MB
pages stream much faster than the 4 KB ones PyTorch and memory maps hand
out (ch02/03_fast-decoding/README.md). So the weights get memory of their
own on a 2 MB boundary, advised `MADV_HUGEPAGE` before it is written. Off
Linux, or where huge pages are set to `never`, nothing moves.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from pathlib import Path

import torch
import torch.nn as nn

HUGE_PAGE = 2 << 20  # a transparent huge page (x86-64; arm64 with 4 KB pages)
MADV_HUGEPAGE, MADV_PAGEOUT = 14, 21
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
COPY_CHUNK = 32 << 20  # bytes copied before the source's pages are dropped


def madvise(start: int, length: int, advice: int) -> None:
    """madvise(2) on Linux, a hint that never changes contents; a no-op
    elsewhere or where the kernel refuses it."""
    if not sys.platform.startswith("linux") or length <= 0:
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), advice)


def huge_pages_enabled() -> bool:
    """Whether this Linux kernel gives huge pages to memory advised so
    (`always` or `madvise`); False off Linux."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        setting = THP_SETTING.read_text()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


def page_out(t: torch.Tensor) -> None:
    """Drop the pages of `t`'s storage from this process (MADV_PAGEOUT), for
    checkpoint weights already copied (clean file pages, read again if used)."""
    if t.device.type != "cpu":
        return
    storage = t.untyped_storage()
    _page_out_bytes(storage.data_ptr(), storage.nbytes())


def _page_out_bytes(address: int, nbytes: int) -> None:
    """MADV_PAGEOUT on the 4 KB pages holding [address, address + nbytes)."""
    start = address // 4096 * 4096
    madvise(start, address + nbytes - start, MADV_PAGEOUT)


def huge_page_empty(nbytes: int) -> torch.Tensor:
    """An empty uint8 CPU tensor of `nbytes` that starts on a 2 MB boundary;
    its whole 2 MB pages are advised as huge pages, the partial last one is
    left on 4 KB pages (no memory added: the padding is never touched)."""
    memory = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    lead = -memory.data_ptr() % HUGE_PAGE
    block = memory[lead : lead + nbytes]
    madvise(block.data_ptr(), nbytes // HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE)
    return block


def _file_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's file-backed mappings."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    spans = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[4] != "0":  # an inode: a file
            low, high = (int(x, 16) for x in fields[0].split("-"))
            spans.append((low, high))
    return spans


def _copy(new: torch.Tensor, old: torch.Tensor, mapped: bool) -> None:
    """new[:] = old; a file-mapped old is copied in chunks of rows, each
    chunk's pages dropped after it, so both are never resident whole."""
    if not mapped or not old.is_contiguous():
        new.copy_(old)
        if mapped:
            page_out(old)
        return
    rows = max(1, COPY_CHUNK // max(1, old[0].numel() * old.element_size()))
    for r in range(0, old.shape[0], rows):
        part = old[r : r + rows]
        new[r : r + rows].copy_(part)
        _page_out_bytes(part.data_ptr(), part.numel() * part.element_size())


def move_weights_to_huge_pages(model: nn.Module) -> int:
    """Give each CPU `nn.Linear` weight of `model` of 2 MB or more memory of
    its own on huge pages, in place (the same Parameter: a model sharing it
    reads the new memory too), paging out a checkpoint's mapped pages as
    they are copied. Returns the bytes moved (0 where huge pages are off)."""
    if not huge_pages_enabled():
        return 0
    files, moved, seen = _file_mappings(), 0, set()
    # normal tensors even in inference mode: the Parameters stay usable
    with torch.inference_mode(False), torch.no_grad():
        for module in model.modules():
            weight = module.weight if isinstance(module, nn.Linear) else None
            if not isinstance(weight, nn.Parameter) or id(weight) in seen:
                continue
            seen.add(id(weight))
            nbytes = weight.numel() * weight.element_size()
            if (weight.device.type != "cpu" or nbytes < HUGE_PAGE
                    or weight.data_ptr() % HUGE_PAGE == 0):  # fmt: skip
                continue
            new = huge_page_empty(nbytes).view(weight.dtype).view(weight.shape)
            address = weight.data_ptr()
            _copy(new, weight.data, any(lo <= address < hi for lo, hi in files))
            weight.data = new
            moved += nbytes
    return moved
