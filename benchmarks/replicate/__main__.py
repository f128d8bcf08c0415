"""`python -m benchmarks.replicate [--budget B | --smoke] [--only SECTIONS]`: see `run.py`."""

import sys

from .run import main

sys.exit(main())
