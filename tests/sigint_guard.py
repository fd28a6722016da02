"""A pytest plugin (loaded by the root conftest.py): the test that leaves
SIGINT's handler changed fails, in its teardown, and the handler it found
at the session's start is put back.

Why: children inherit an ignored SIGINT, and the Ctrl-C tests
(tests/test_benchmark.py, tests/test_download_faults.py) need theirs to
stop. A full run once left SIGINT ignored by the time they ran; the
cause was the launch, not a test: a shell without job control starts a
background job (`pytest ... &`) with SIGINT ignored, and Python then
keeps it ignored. This guard makes sure no test or library call adds a
second cause silently. A hook rather than an autouse fixture, so that
nbval's notebook cells (not functions, no fixtures) are watched too.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

_AT_START = pytest.StashKey[object]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.stash[_AT_START] = signal.getsignal(signal.SIGINT)


@pytest.hookimpl(trylast=True)  # after the test's fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item) -> None:
    expected = item.session.stash.get(_AT_START, None)
    found = signal.getsignal(signal.SIGINT)
    if expected is None or found == expected:
        return
    signal.signal(signal.SIGINT, expected)  # the next test starts clean
    pytest.fail(
        f"{item.nodeid} left SIGINT's handler {found!r} (it was {expected!r} "
        "when the session started): restore it where the test, its fixture "
        "or the library call it makes changes it",
        pytrace=False,
    )


def execute_notebook(client: Any) -> Any:
    """`client.execute()` (an nbclient `NotebookClient`) with SIGINT's
    handler kept: nbclient adds an asyncio handler for the run and asyncio's
    `remove_signal_handler` then installs Python's default one, whatever was
    there before (an ignored SIGINT, in a suite started in the background)."""
    before = signal.getsignal(signal.SIGINT)
    try:
        return client.execute()
    finally:
        signal.signal(signal.SIGINT, before)
