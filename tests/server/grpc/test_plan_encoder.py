"""``grpc/plan_encoder.py``: a plan's ``PlanUpdate`` serialized once per plan object.

Every ``WatchPlan`` stream of one plan writes the same bytes; the cache holding them is bounded.
"""

from __future__ import annotations

from perseus_common.proto import perseus_pb2 as pb
from perseus_common.wire.codec import encode_plan
from perseus_common.wire.values import PlanStep, PlanUpdate
from perseus_server.grpc.plan_encoder import PlanEncoder


def test_plan_encoder_serializes_once_per_object() -> None:
    enc = PlanEncoder(size=2)
    a = PlanUpdate(1, (PlanStep("forward", 0, 1410, 0),), "a")
    b = PlanUpdate(1, (PlanStep("forward", 0, 1410, 0),), "a")  # equal fields, another object
    assert enc(a) is enc(a)
    assert enc(a) == encode_plan(a).SerializeToString()
    assert enc(b) is not enc(a) and enc(b) == enc(a)
    c = PlanUpdate(2, (), "c")
    enc(c)
    first = enc(a)  # evicted by the bounded cache, then encoded again
    assert pb.PlanUpdate.FromString(first).version == 1
