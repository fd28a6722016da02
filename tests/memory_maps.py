"""What Linux reports about this process's memory (for the huge-page
tests): the VmFlags of the mapping that holds an address."""

from __future__ import annotations

from pathlib import Path


def vm_flags(address: int) -> list[str] | None:
    """The VmFlags of the mapping holding `address` in /proc/self/smaps
    ("hg": advised MADV_HUGEPAGE), or None if no mapping holds it."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return None
