"""How an integration times a P2P transfer: on the CPU, or with CUDA events where the data moves.

On gloo a P2P op's wait returns when the data has arrived, so the CPU time from posting the op to
the end of its wait is the transfer (plus the other end's lateness). On NCCL the wait only makes
the current CUDA stream wait for NCCL's stream and returns at once: the CPU time says nothing.
There each transfer is timed by two CUDA events with timing enabled on the current stream: one
recorded before the op is posted (NCCL's stream starts the op after the work already queued on
that stream, the producer's compute), one after the wait (it completes when the transfer has,
since the stream waits for it). The pair is recorded as an :class:`EventTiming` and resolved off
the training thread, when the report is built (:meth:`IterationMeasurement.resolved`); the
training thread never synchronises with the GPU.

The choice follows the process group's backend (:func:`event_factory`, mode ``"auto"``): events
for NCCL, the CPU for anything else; ``"events"`` and ``"cpu"`` force one (tests, or a backend
this module does not know).
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

from perseus_client.measurements import EventTiming

__all__ = ["TIMING_MODES", "EventTiming", "check_mode", "event_factory", "timed_call"]

TIMING_MODES = ("auto", "cpu", "events")


def _backend(group: Any) -> str:
    try:
        import torch.distributed as dist

        return str(dist.get_backend(group)).lower()
    except Exception:  # noqa: BLE001 - not initialised, or a group torch does not know
        return ""


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`TIMING_MODES`, else a ``ValueError`` naming the field."""
    if mode not in TIMING_MODES:
        raise ValueError(
            f"transfer_timing: expected one of {', '.join(TIMING_MODES)}, got {mode!r}"
        )
    return mode


def event_factory(group: Any = None, mode: str = "auto") -> Callable[[], Any] | None:
    """A maker of timing CUDA events for the P2P ops of ``group`` (``None``: the default group).

    ``None`` when they are timed on the CPU (see the module docstring).
    """
    if check_mode(mode) == "cpu" or (mode == "auto" and "nccl" not in _backend(group)):
        return None
    import torch

    cuda_event = torch.cuda.Event

    def make() -> Any:
        return cuda_event(enable_timing=True)

    return make


def timed_call(
    make_event: Callable[[], Any] | None, call: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> tuple[Any, Any]:
    """``call(*args, **kwargs)``'s result and how long it took.

    The time is an :class:`EventTiming` where ``make_event`` makes CUDA events, else the CPU's
    seconds (see the module docstring). An exception from ``call`` goes on, with no time.
    """
    if make_event is None:
        t0 = perf_counter()
        result = call(*args, **kwargs)
        return result, perf_counter() - t0
    start = make_event()
    start.record()
    result = call(*args, **kwargs)
    end = make_event()
    end.record()
    return result, EventTiming(start, end)
