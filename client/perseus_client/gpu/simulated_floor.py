"""The simulated GPU's power floor: what a floor lifts above the power the GPU draws on its own.

:class:`~perseus_client.gpu.simulated.SimulatedGpu` draws an instruction's energy over its time
while it runs and the blocking power between instructions; with a floor (``set_power_floor``, as
NVML power smoothing holds one on a real GPU) it draws the higher of that and the floor.
:class:`FloorModel` keeps the joules the floor added, on the simulated time axis: the GPU tells it
when its own power changes (:meth:`FloorModel.switch`) and when the floor does
(:meth:`FloorModel.set`), and its energy counter adds :meth:`FloorModel.joules`. The floor moves
at once (a ramp rate is recorded, not modelled). Thread-safe: the client's floor thread sets the
floor while the training thread runs instructions.
"""

from __future__ import annotations

import threading

__all__ = ["FloorModel"]


class FloorModel:
    """The floor held now and the joules it added (see the module docstring).

    Args:
        power: what the GPU draws on its own at first (W).
    """

    def __init__(self, power: float) -> None:
        self._lock = threading.Lock()
        self._floor = 0.0
        self._extra = 0.0  # joules added up to _mark
        self._mark = 0.0  # simulated seconds
        self._power = power  # what the GPU draws on its own from _mark on
        #: The floor's ramp rate last asked (W/s; 0: none); recorded, not modelled.
        self.ramp_w_per_s = 0.0

    @property
    def level(self) -> float:
        """The floor held now (W; 0: none)."""
        return self._floor

    def _joules(self, now: float) -> float:
        lift = max(0.0, self._floor - self._power)
        return self._extra + lift * max(0.0, now - self._mark)

    def joules(self, now: float) -> float:
        """Joules the floor added up to ``now`` (simulated seconds)."""
        with self._lock:
            return self._joules(now)

    def set(self, now: float, watts: float, ramp_w_per_s: float = 0.0) -> None:
        """From ``now`` on, hold at least ``watts`` (0: no floor)."""
        with self._lock:
            self._extra = self._joules(now)
            self._mark, self._floor = now, float(watts)
            self.ramp_w_per_s = float(ramp_w_per_s)

    def switch(self, at: float, power: float) -> None:
        """From simulated time ``at`` on, the GPU draws ``power`` on its own."""
        with self._lock:
            self._extra = self._joules(at)
            self._mark, self._power = at, power
