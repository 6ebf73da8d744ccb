"""``python -m perseus_demo``: the same as ``perseus demo``."""

import sys

from perseus_demo.cli import main

sys.exit(main())
