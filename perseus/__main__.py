import sys

from perseus.cli import main

sys.exit(main())
