"""The rank's *watcher*: registration, the ``WatchPlan`` stream, and following the leader.

The part of :class:`~perseus_client.transport.ServerLink` that runs on its ``perseus-watch``
thread: it registers the rank (``RegisterRank``), then holds ``WatchPlan`` open and hands every
:class:`~perseus_common.wire.values.PlanUpdate` to a callback, never one older than a version it
handed on already. When the stream breaks (server down or restarting) it re-registers and
re-subscribes with exponential backoff and jitter (``backoff_initial`` doubling up to
``backoff_max``). Given several addresses it **follows the leader**: when the server it uses is
unreachable, hangs past the RPC timeout, or answers as a standby (``UNAVAILABLE`` with the
leader's address in the trailing metadata :data:`LEADER_METADATA`), it moves to the leader the
standby named, else to the next address, at once; after a whole round without a leader it waits
the backoff (at most 1 s while a standby says the leader is being replaced).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import grpc

from perseus_client.addresses import Endpoint, Route
from perseus_client.plan import received_plan
from perseus_common.wire.codec import (
    decode_plan,
    decode_registered,
    encode_plan_request,
    encode_registration,
)
from perseus_common.wire.values import PlanRequest, PlanUpdate, RankRegistration

__all__ = ["LEADER_METADATA", "PlanWatcher", "leader_hint"]

log = logging.getLogger("perseus_client.transport")

#: What the leader answers when it will not serve this rank: retrying elsewhere would not help.
_REFUSALS = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
)
#: The longest wait between two rounds while a standby says the leader is being replaced (s).
_STANDBY_RETRY = 1.0
#: The trailing metadata key in which a standby names the leader's gRPC address.
LEADER_METADATA = "perseus-leader"


def leader_hint(exc: grpc.RpcError) -> str | None:
    """The leader's address a standby named in its answer's trailing metadata.

    ``None`` when the answer is not a standby's; ``""`` for a standby that knows no leader yet.
    """
    try:
        trailing: Any = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    except Exception:  # noqa: BLE001 - an answer without metadata
        return None
    for item in trailing or ():
        key, value = item[0], item[1]
        if key == LEADER_METADATA:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


class PlanWatcher:
    """The watcher's calls and loop (see the module docstring); its state is the link's."""

    identity: RankRegistration
    route: Route
    rank_id: str | None
    known_version: int
    rpc_timeout: float
    backoff_initial: float
    backoff_max: float
    last_error: str | None
    leader_hint: str | None
    reconnects: int
    _on_plan: Callable[[PlanUpdate], None]
    _stub: Any
    _metadata: tuple[tuple[str, str], ...]
    _endpoint: Endpoint
    _lock: threading.Lock
    _call: Any
    _stop: threading.Event
    _reregister: threading.Event
    _registered: threading.Event
    _replaced_logged: bool
    _subscribed: bool
    _ever_up: bool

    def _use(self, endpoint: Endpoint) -> None:
        raise NotImplementedError

    def _set_up(self) -> None:
        raise NotImplementedError

    def _set_down(self, why: str) -> None:
        raise NotImplementedError

    def _register(self) -> None:
        self._reregister.clear()  # this registration carries the identity as it is now
        resp = self._stub.RegisterRank(
            encode_registration(self.identity), timeout=self.rpc_timeout, metadata=self._metadata
        )
        rank_id = decode_registered(resp).rank_id
        if self.rank_id is not None and rank_id != self.rank_id:
            # The server no longer knew this rank (its job was created again): versions
            # start over with the rank's new registration.
            self.known_version = 0
        self.rank_id = rank_id
        self._registered.set()

    def set_clock_control(
        self, state: str, reason: str, *, gpu_name: str, supported_clocks: tuple[int, ...]
    ) -> None:
        """The rank's clock control changed (any thread): reports carry it from now on.

        The rank registers again when its GPU's name or clocks became known.
        """
        self.identity = dataclasses.replace(
            self.identity,
            gpu_name=gpu_name,
            supported_clocks_mhz=supported_clocks,
            clock_control="active" if state == "active" else "unavailable",
            clock_control_reason=reason[:256],
        )
        self._reregister.set()

    def _stream(self) -> None:
        """Register, subscribe, and hand on every plan until the stream ends (or raise)."""
        self._register()
        call = self._stub.WatchPlan(
            encode_plan_request(
                PlanRequest(self.identity.job_id, self.rank_id or "", self.known_version)
            ),
            metadata=self._metadata,
        )
        with self._lock:
            self._call = call
        if self._stop.is_set():
            call.cancel()
            return
        self._subscribed = True
        if self._ever_up:
            self.reconnects += 1
        self._ever_up = True
        self._set_up()
        for update in call:
            plan = received_plan(decode_plan(update))
            if plan.version < self.known_version:
                # A server behind the one that sent the newer version: never go back.
                log.warning(
                    "perseus: %s sent plan version %d after version %d; ignored",
                    self._endpoint,
                    plan.version,
                    self.known_version,
                )
                continue
            self.known_version = plan.version
            self._on_plan(plan)
        self._set_down("the server closed the stream")

    def _failed(self, exc: grpc.RpcError) -> str:
        """What a failed call means for the watcher.

        Returns:
            ``"refused"`` (stay: the leader said no), ``"replaced"`` (stay, slowly) or
            ``"move"`` (the next address: unreachable, hung, or a standby).
        """
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        self.last_error = f"{getattr(code, 'name', code)}: {details}"
        self._set_down(self.last_error)
        if code in _REFUSALS:
            log.error(
                "perseus: the server refused rank %s: %s",
                self.identity.global_rank,
                self.last_error,
            )
            return "refused"
        if code == grpc.StatusCode.ABORTED and "replaced" in str(details):
            # Another stream for this rank took our place: another process runs this rank, or
            # the server saw our reconnect first. Retry, slowly, and say so.
            if not self._replaced_logged:
                self._replaced_logged = True
                log.warning(
                    "perseus: the plan stream of rank %s was replaced by a newer one "
                    "(is another process running this rank?); reconnecting",
                    self.identity.global_rank,
                )
            return "replaced"
        return "move"

    def _watch_loop(self) -> None:
        backoff = self.backoff_initial
        tried = 0  # addresses tried since one served
        standby = False  # a standby answered in this round: the leader is being replaced
        while not self._stop.is_set():
            self._subscribed = False
            action, hint = "stay", None
            try:
                self._stream()
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    break
                action = self._failed(exc)
                hint = leader_hint(exc)
            except Exception as exc:  # noqa: BLE001 - the watcher must survive anything
                self.last_error = repr(exc)
                log.exception("perseus: plan watcher error")
                self._set_down(self.last_error)
            finally:
                with self._lock:
                    self._call = None
            if self._subscribed:
                backoff, tried, standby = self.backoff_initial, 0, False
            wait, grow = backoff, True
            if action == "replaced":
                wait = self.backoff_max
            elif action == "move":
                if hint is not None:
                    standby = True
                    self.leader_hint = hint or self.leader_hint
                self._use(self.route.advance(hint or None))
                tried += 1
                if tried < self.route.size:
                    wait, grow = self.backoff_initial, False  # the rest of the round, at once
                else:
                    wait = min(backoff, _STANDBY_RETRY) if standby else backoff
                    tried, standby = 0, False
            if self._stop.wait(wait * random.uniform(0.5, 1.0)):
                break
            if grow:
                backoff = min(backoff * 2.0, self.backoff_max)
