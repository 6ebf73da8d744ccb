"""``python -m perseus_server`` runs the server (same options as ``perseus serve``)."""

import sys

from perseus_server.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
