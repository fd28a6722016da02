"""`python -m utils.cli generate|chat`: see `utils.cli.commands`."""

import sys

from utils.cli.commands import main

sys.exit(main())
