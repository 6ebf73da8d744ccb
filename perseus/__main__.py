"""``python -m perseus``: the ``perseus`` command."""

import sys

from perseus.cli import main

sys.exit(main())
