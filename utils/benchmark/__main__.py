"""`python -m utils.benchmark`: see `utils.benchmark.runner`."""

import sys

from utils.benchmark.runner import main

sys.exit(main())
