"""`python -m utils.hf_interop`: see `utils.hf_interop.convert`."""

import sys

from utils.hf_interop.convert import main

sys.exit(main())
