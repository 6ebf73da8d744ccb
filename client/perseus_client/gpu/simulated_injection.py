"""What tests and demos inject into a simulated GPU: a straggler's time factor, slow links.

A straggler is injected at runtime with :meth:`set_time_factor` (thread-safe), e.g.
``gpu.set_time_factor(1.2)`` makes every following instruction take 1.2 times as long (20 %
slower). Throughout Perseus a *slowdown* is a fraction (``0.2`` = 20 % slower, as in the REST
API); a factor is called a *time factor*. ``set_slowdown(factor)`` and the ``slowdown=``
argument, which took a factor, still work and warn that they are deprecated.

Links: ``transfer_times={(boundary, direction): seconds}`` (or :meth:`set_transfer_time`, also
at runtime: a link slowed mid-run) injects a P2P transfer latency per stage boundary and
direction; :meth:`transfer` occupies it (simulated seconds, scaled like an instruction; the GPU
idles at ``blocking_power`` meanwhile). A training loop calls it where it sends that link's
activations or gradients, and times the whole transfer (the latency and the real send) for
:meth:`PerseusClient.record_transfer <perseus_client.PerseusClient.record_transfer>`.

:class:`Injection` is the part of :class:`~perseus_client.gpu.simulated.SimulatedGpu` that does
both; the GPU's time accounting (``_sim_base``, ``_wall_base``, ``_virtual``) is the GPU's.
"""

from __future__ import annotations

import math
import time
import warnings

from perseus_client.errors import ConfigError

__all__ = ["Injection", "deprecated_slowdown"]


def deprecated_slowdown() -> None:
    """Warn that ``slowdown`` (a factor) is deprecated."""
    warnings.warn(
        "SimulatedGpu's slowdown (a factor) is deprecated: use time_factor / set_time_factor; "
        "elsewhere in Perseus a slowdown is a fraction (0.2 = 20 % slower)",
        DeprecationWarning,
        stacklevel=3,
    )


class Injection:
    """A straggler's time factor and link latencies (see the module docstring)."""

    time_scale: float
    _time_factor: float
    _transfers: dict[tuple[int, str], float]
    _sim_base: float
    _wall_base: float
    _virtual: float

    @property
    def time_factor(self) -> float:
        """How many times longer than profiled each instruction takes now (1.0 = as profiled)."""
        return self._time_factor

    def set_time_factor(self, factor: float) -> None:
        """Make every following instruction take ``factor`` times its profiled time and energy.

        Straggler injection; ``1.2`` is 20 % slower.
        """
        if not (math.isfinite(factor) and factor > 0):
            raise ConfigError("time_factor", f"must be a positive finite factor, got {factor}")
        self._time_factor = float(factor)

    def set_transfer_time(self, boundary: int, direction: str, seconds: float) -> None:
        """Inject ``seconds`` of latency into every following transfer of ``boundary``.

        Only transfers in ``direction`` (``forward``/``backward``).

        The seconds are simulated; 0 removes it.
        """
        if direction not in ("forward", "backward"):
            raise ConfigError("direction", f"must be forward or backward, got {direction!r}")
        if not (isinstance(boundary, int) and boundary >= 0):
            raise ConfigError("boundary", f"must be an integer >= 0, got {boundary!r}")
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ConfigError("transfer_time", f"must be >= 0 seconds, got {seconds}")
        self._transfers[(boundary, direction)] = float(seconds)

    def transfer_time(self, boundary: int, direction: str) -> float:
        """The latency injected into a link's transfers (simulated seconds; 0: none)."""
        return self._transfers.get((boundary, direction), 0.0)

    def transfer(self, boundary: int, direction: str) -> float:
        """Occupy one transfer's injected latency on ``(boundary, direction)``.

        ``time_scale`` times it in wall time (its sleep's overshoot not counted, as for an
        instruction), the GPU idle meanwhile. Returns the simulated seconds injected.
        """
        t = self._transfers.get((boundary, direction), 0.0)
        if t <= 0:
            return 0.0
        if self.time_scale > 0:
            start_wall = time.perf_counter()
            start_sim = self._sim_base + (start_wall - self._wall_base) / self.time_scale
            time.sleep(t * self.time_scale)
            self._sim_base = start_sim + t
            self._wall_base = time.perf_counter()
        else:
            self._virtual += t
        return t

    @property
    def slowdown(self) -> float:
        """Deprecated: the :attr:`time_factor`.

        A factor, not the fraction "slowdown" means elsewhere in Perseus.
        """
        deprecated_slowdown()
        return self._time_factor

    def set_slowdown(self, factor: float) -> None:
        """Deprecated: :meth:`set_time_factor` (it takes the same factor)."""
        deprecated_slowdown()
        if not (math.isfinite(factor) and factor > 0):
            raise ConfigError("slowdown", f"must be a positive finite factor, got {factor}")
        self.set_time_factor(factor)
