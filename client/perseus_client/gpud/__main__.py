"""``python -m perseus_client.gpud ...``: the same as ``perseus gpud ...``."""

import sys

from perseus_client.gpud.cli import main

sys.exit(main(sys.argv[1:]))
