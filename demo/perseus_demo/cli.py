"""``perseus demo``: parse the options, run the demo, print the report (or the JSON)."""

from __future__ import annotations

import contextlib
import json
import sys

from perseus_demo.errors import DemoError
from perseus_demo.options import parse_options
from perseus_demo.orchestration import run
from perseus_demo.report import report

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run ``perseus demo`` with ``argv`` (``None``: ``sys.argv``).

    Exit status: 0 when every promise is kept, 1 when one is missed, 2 when the demo could not
    run, 130 on Ctrl-C.
    """
    opts = parse_options(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        res = run(opts, log)
    except DemoError as e:
        print(f"perseus demo: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if opts.json:
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.write(json.dumps(res, indent=1) + "\n")
    else:
        print(report(res))
    return 0 if res["checks"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
