"""tests/sigint_guard.py: a test that leaves SIGINT ignored fails and the
handler is put back; a test that restores it passes."""

import signal

LEAVES_AND_RESTORES = """
import signal

def test_leaves_it_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)

def test_finds_it_restored_and_restores_its_own():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGINT, previous)
"""


def test_the_test_that_leaves_sigint_changed_fails(pytester):
    pytester.makepyfile(test_inner=LEAVES_AND_RESTORES)
    # Python's own handler for the inner session, whatever this run started
    # with (a background launch starts it ignored).
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = pytester.runpytest_inprocess(
            "-p", "tests.sigint_guard", "-p", "no:cacheprovider"
        )
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, outer)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*test_inner.py::test_leaves_it_ignored left SIGINT's handler *SIG_IGN*"]
    )
    assert after is signal.default_int_handler


def test_a_notebook_run_keeps_an_ignored_sigint_ignored():
    """nbclient's run ends with asyncio putting Python's default handler
    back; `execute_notebook` keeps the one it found (here: ignored, as in a
    suite started in the background)."""
    import nbformat
    from nbclient import NotebookClient

    from tests.sigint_guard import execute_notebook

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("1 + 1")]
    outer = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        execute_notebook(NotebookClient(nb, timeout=120, kernel_name="python3"))
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, outer)
    assert nb.cells[0].outputs[0].data["text/plain"] == "2"
    assert after is signal.SIG_IGN
