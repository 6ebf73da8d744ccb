"""The Perseus server: FastAPI REST + gRPC plan push over a SQLite store.

Run it with ``perseus serve`` (or ``python -m perseus_server``); start it as a subprocess from
Python with :class:`ServerProcess`. Importing this package is light: the web stack is imported
by the modules that need it.
"""

from perseus_server.config import Limits, ServerConfig
from perseus_server.testing.process import ServerProcess

__all__ = ["Limits", "ServerConfig", "ServerProcess"]
