"""The demo's one error type."""

from __future__ import annotations

__all__ = ["DemoError"]


class DemoError(RuntimeError):
    """The demo could not run (a bad option, or a rank or the server failed)."""
