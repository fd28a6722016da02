"""`python -m utils.benchmark`: see `utils.benchmark.runner`.

The runner, and torch with it, is imported inside `run_command` with
Ctrl-C held until the import is done (`utils.errors.ctrl_c_held`), so
Ctrl-C in the command's first seconds ends it as it does later: one line,
exit status 130, no traceback.
"""

import sys

from utils.benchmark import PROG
from utils.errors import ctrl_c_held, run_command


def _main() -> int:
    with ctrl_c_held():
        from utils.benchmark.runner import main
    return main()


sys.exit(run_command(PROG, _main))
