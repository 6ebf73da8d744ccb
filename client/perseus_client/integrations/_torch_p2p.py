"""Transfer timing for ``torch.distributed.pipelining``: every schedule posts its P2P ops through
the module function ``schedules._batch_p2p`` and waits on them through ``_wait_batch_p2p`` (both
looked up by name at call time, from the single-stage loops and from the multi-stage runtime).

An instrumented stage tags the ``P2POp`` objects its ``get_{fwd,bwd}_{send,recv}_ops`` return with
``(record, boundary, direction, microbatch, make_event)``. While at least one schedule is instrumented,
:func:`acquire` has replaced the two module functions: ``_batch_p2p`` notes the time the tagged ops
were posted (keyed by the list of works it returns, which the schedules hand to
``_wait_batch_p2p`` unchanged), and ``_wait_batch_p2p`` calls ``record(boundary, direction,
microbatch, seconds)`` for each tagged op once the wait returns, ``seconds`` being the time from
posting to the end of that wait. With ``make_event`` (the stage's process group is NCCL, see
:mod:`perseus_client.integrations._timing`) a CUDA event is recorded before the ops are posted
and another after the wait, and ``seconds`` is their :class:`EventTiming`, resolved when the
report is built. Untagged ops (another pipeline's, torch's own warm-up exchange)
pass through with one ``getattr`` per op.

What the time means: gloo's and NCCL's P2P works complete only when both ends have posted, so each
end measures ``max(0, other end's post - own post) + transfer``; the smaller of the two ends'
values of one transfer is the transfer itself. A send that the schedule waits on late (the
multi-stage runtime waits on its sends at the end of ``step``) gives a larger value on that end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from time import perf_counter
from typing import Any

from perseus_client.measurements import EventTiming

__all__ = ["acquire", "release", "TAG"]

#: Attribute set on a tagged ``P2POp``: ``(record, boundary, direction, microbatch)``.
TAG = "_perseus_transfer"

_MODULE = "torch.distributed.pipelining.schedules"

_MAX_POSTED = 4096
_lock = threading.Lock()
_users = 0
_originals: dict[str, Any] = {}
Tag = tuple[Callable[..., Any], int, str, int, Callable[[], Any] | None]
# id(list of works) -> (works, post time or start event, tags); the works are kept so the id stays
# theirs.
_posted: dict[int, tuple[Any, Any, list[Tag]]] = {}


def _make_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    posted = _posted

    def _batch_p2p(p2p_ops: Any, *args: Any, **kwargs: Any) -> Any:
        if len(p2p_ops) == 1:  # the common case: one op, one tag at most (no list built)
            tag = getattr(p2p_ops[0], TAG, None)
            if tag is None:
                return original(p2p_ops, *args, **kwargs)
            tags: Any = (tag,)
        else:
            tags = [tag for op in p2p_ops if (tag := getattr(op, TAG, None)) is not None]
            if not tags:
                return original(p2p_ops, *args, **kwargs)
            # A stage with several output tensors sends one op per tensor: one transfer.
            tags = list(dict.fromkeys(tags))
        make_event = tags[0][4]
        if make_event is not None:
            t0: Any = make_event()
            t0.record()
        else:
            t0 = perf_counter()
        works = original(p2p_ops, *args, **kwargs)
        if works:
            if len(posted) > _MAX_POSTED:  # works never waited on (an iteration that raised)
                posted.clear()
            posted[id(works)] = (works, t0, tags)
        return works

    _batch_p2p._perseus_hook = True  # type: ignore[attr-defined]
    return _batch_p2p


def _make_wait(original: Callable[..., Any]) -> Callable[..., Any]:
    posted_works = _posted

    def _wait_batch_p2p(work: Any, *args: Any, **kwargs: Any) -> Any:
        if not posted_works:
            return original(work, *args, **kwargs)
        posted = posted_works.pop(id(work), None)
        result = original(work, *args, **kwargs)
        if posted is not None and posted[0] is work:
            start, tags = posted[1], posted[2]
            if tags[0][4] is None:
                seconds: Any = perf_counter() - start
            else:
                end = tags[0][4]()
                end.record()
                seconds = EventTiming(start, end)
            for record, boundary, direction, microbatch, _ in tags:
                record(boundary, direction, microbatch, seconds)
        return result

    _wait_batch_p2p._perseus_hook = True  # type: ignore[attr-defined]
    return _wait_batch_p2p


def acquire() -> None:
    """Install the two module functions (once, however many schedules are instrumented)."""
    global _users
    import importlib

    with _lock:
        if _users == 0:
            module: Any = importlib.import_module(_MODULE)
            _originals["_batch_p2p"] = module._batch_p2p
            _originals["_wait_batch_p2p"] = module._wait_batch_p2p
            module._batch_p2p = _make_batch(module._batch_p2p)
            module._wait_batch_p2p = _make_wait(module._wait_batch_p2p)
        _users += 1


def release() -> None:
    """Undo one :func:`acquire`; the last one puts torch's functions back."""
    global _users
    import importlib

    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            module: Any = importlib.import_module(_MODULE)
            for name, original in _originals.items():
                if getattr(getattr(module, name), "_perseus_hook", False):
                    setattr(module, name, original)
            _originals.clear()
            _posted.clear()
