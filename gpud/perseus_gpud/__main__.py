"""``python -m perseus_gpud ...``: the same as ``perseus gpud ...``."""

import sys

from perseus_gpud.cli import main

sys.exit(main(sys.argv[1:]))
