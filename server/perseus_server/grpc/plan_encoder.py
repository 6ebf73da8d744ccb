"""A plan's ``PlanUpdate`` message, serialized once per plan object (:class:`PlanEncoder`).

The encoding itself is the shared codec's (:func:`perseus_common.wire.codec.encode_plan`).
"""

from __future__ import annotations

from collections import OrderedDict

from perseus_common.wire.codec import encode_plan
from perseus_common.wire.values import PlanUpdate

__all__ = ["PlanEncoder"]


class PlanEncoder:
    """The serialized ``PlanUpdate`` message of a plan, with a bounded cache per plan object.

    The service hands one object to every stream of the same plan (per version, pipeline plan
    and stage), so a push serializes each distinct message once, not once per stream: the
    ``WatchPlan`` handler writes these bytes as they are (see
    :func:`perseus_server.grpc.service.add_to_server`).
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        # id -> (the value, kept alive so that its id stays its own; its serialized message)
        self._cache: OrderedDict[int, tuple[PlanUpdate, bytes]] = OrderedDict()

    def __call__(self, update: PlanUpdate) -> bytes:
        """:func:`encode_plan` of ``update``, serialized: once per object (while cached)."""
        key = id(update)
        hit = self._cache.get(key)
        if hit is not None and hit[0] is update:
            self._cache.move_to_end(key)
            return hit[1]
        data = encode_plan(update).SerializeToString()
        self._cache[key] = (update, data)
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return data
