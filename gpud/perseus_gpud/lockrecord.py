"""The daemon's record of the clocks it locked (``--state``).

So that it resets at start only what it set itself, never a clock another tool (``nvidia-smi -lgc``,
DCGM) set.

A JSON file ``{"version": 1, "locked": {"<GPU UUID>": <MHz>, ...}}`` (the MHz of the lease's
first lock, for the log), replaced atomically (and synced) when it changes. A GPU is recorded
*before* NVML applies the first lock of a lease and forgotten *after* NVML reset it at the end
of the lease, so a daemon killed at any moment finds every GPU it may have left locked in the
record; the clock changes in between (many per training iteration) write nothing. A file that
cannot be parsed is an error (:class:`LockRecordError`: the daemon refuses to start, naming the
file and the problem, exit status 2): guessing would either reset another tool's clocks or leave
a trainer's lock in place.

Power floors the daemon holds (``set_power_floor``) are recorded the same way, under
``"floors": {"<GPU UUID>": <W>}`` (absent in records of older daemons): before the first floor
of a lease is applied, forgotten after it was released, so a daemon killed with a floor held
releases it when it starts again.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from perseus_gpud.files import replace_file

__all__ = ["LockRecord", "LockRecordError"]


class LockRecordError(ValueError):
    """The record file exists but is not a lock record."""


class LockRecord:
    """The record at ``path`` (created on the first lock)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._floors: dict[str, float] = {}
        self._locked: dict[str, int] = self._load()

    def _load(self) -> dict[str, int]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise LockRecordError(f"--state {self.path}: cannot read it: {exc}") from exc
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise LockRecordError(
                f"--state {self.path}: not JSON ({exc}); it should be gpud's lock record "
                '{"version": 1, "locked": {"GPU-...": MHz}}: fix it, or remove it after checking '
                "with nvidia-smi that no clock stays locked"
            ) from exc
        locked = doc.get("locked") if isinstance(doc, dict) else None
        if (
            not isinstance(doc, dict)
            or doc.get("version") != 1
            or not isinstance(locked, dict)
            or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                for k, v in locked.items()
            )
        ):
            raise LockRecordError(
                f"--state {self.path}: not a lock record (expected "
                '{"version": 1, "locked": {"GPU-...": MHz}}); fix it, or remove it after '
                "checking with nvidia-smi that no clock stays locked"
            )
        floors = doc.get("floors", {})
        if not isinstance(floors, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            for k, v in floors.items()
        ):
            raise LockRecordError(
                f'--state {self.path}: "floors" is not {{"GPU-...": W}}; fix it, or remove it '
                "after checking with nvidia-smi that no power floor stays set"
            )
        self._floors = {k: float(v) for k, v in floors.items()}
        return dict(locked)

    def locked(self) -> dict[str, int]:
        """UUID → MHz of every lock recorded."""
        with self._lock:
            return dict(self._locked)

    def set(self, uuid: str, mhz: int) -> None:
        """Record that gpud may leave GPU ``uuid`` locked (written only if it was not)."""
        with self._lock:
            if uuid not in self._locked:
                self._locked[uuid] = int(mhz)
                self._write()

    def forget(self, uuid: str) -> None:
        """Drop ``uuid`` from the record (written to disk when it was there)."""
        with self._lock:
            if self._locked.pop(uuid, None) is not None:
                self._write()

    def floors(self) -> dict[str, float]:
        """UUID → W of every power floor recorded."""
        with self._lock:
            return dict(self._floors)

    def set_floor(self, uuid: str, watts: float) -> None:
        """Record that gpud may leave a floor on GPU ``uuid`` (written only if it was not)."""
        with self._lock:
            if uuid not in self._floors:
                self._floors[uuid] = float(watts)
                self._write()

    def forget_floor(self, uuid: str) -> None:
        """Drop ``uuid``'s floor from the record (written to disk when it was there)."""
        with self._lock:
            if self._floors.pop(uuid, None) is not None:
                self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc: dict[str, object] = {"version": 1, "locked": self._locked}
        if self._floors:
            doc["floors"] = self._floors
        replace_file(str(self.path), json.dumps(doc))
