"""``perseus_gpud.access``: who may lease, see and read which GPU; lease labels; the socket.

The ownership check is the daemon's own (:class:`~perseus_gpud.ownership.Ownership` with the
device-node rule, over this process's real ``/proc``): a process owns a simulated GPU when it
holds a character device of the configured major and the GPU's minor open.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from perseus_common.proto import gpud_pb2
from perseus_gpud.access import (
    MAX_TAG,
    Access,
    GpudStartError,
    Refused,
    error_response,
    lease_tag,
    listen_unix,
)
from perseus_gpud.devices import ManagedGpu, open_gpus
from perseus_gpud.ownership import DeviceNodeOwnership, Owner, Ownership
from perseus_gpud.peers import Peer, PeerPolicy
from perseus_gpud.simnvml import SimulatedNvml

ZERO = os.stat("/dev/zero").st_rdev  # a character device this process can hold open


@pytest.fixture
def gpus() -> Iterator[dict[int, ManagedGpu]]:
    """Simulated GPUs whose minors are those of ``/dev/zero`` (owned) and one nobody has open."""
    opened = open_gpus(SimulatedNvml(2), None, read_only=True)
    for gpu, minor in zip(opened, (os.minor(ZERO), 250), strict=True):
        gpu.minor = minor
    yield {g.index: g for g in opened}
    for g in opened:
        g.close()


@pytest.fixture
def access() -> Iterator[Access]:
    ownership = Ownership(device_node=DeviceNodeOwnership(major=os.major(ZERO)))
    yield Access(PeerPolicy(admin_gids=frozenset({60})), ownership)
    ownership.close()


def me(gid: int | None = None) -> Peer:
    return Peer(os.getpid(), 1000, os.getgid() if gid is None else gid)


def test_a_lease_tag_is_bounded_printable_text() -> None:
    assert lease_tag("job-1", "lease.job") == "job-1"
    assert lease_tag("", "lease.job") == ""
    assert lease_tag("x" * MAX_TAG, "lease.job") == "x" * MAX_TAG
    with pytest.raises(Refused, match=f"lease.job: at most {MAX_TAG} characters, got 129") as e:
        lease_tag("x" * 129, "lease.job")
    assert e.value.code == gpud_pb2.INVALID_ARGUMENT
    with pytest.raises(Refused, match="lease.tenant: must be printable"):
        lease_tag("a\nb", "lease.tenant")


def test_a_refusal_is_an_error_frame() -> None:
    reply = error_response(7, gpud_pb2.NOT_OWNER, "not yours")
    assert reply.id == 7 and reply.HasField("error")
    assert (reply.error.code, reply.error.message) == (gpud_pb2.NOT_OWNER, "not yours")


def test_a_lease_goes_to_the_owner_only(access: Access, gpus: dict[int, ManagedGpu]) -> None:
    with open("/dev/zero", "rb"):
        owner = asyncio.run(access.lease_owner(me(), gpus[0]))
        assert isinstance(owner, Owner) and owner.how == "device-node"
        with pytest.raises(Refused, match=f"GPU 1 \\({gpus[1].uuid}\\) is not pid") as e:
            asyncio.run(access.lease_owner(me(), gpus[1]))
    assert e.value.code == gpud_pb2.NOT_OWNER
    assert "CUDA_VISIBLE_DEVICES" in str(e.value)
    with pytest.raises(Refused, match="hostPID: true"):  # a peer in another pid namespace
        asyncio.run(access.lease_owner(Peer(0, 1000, 1000), gpus[0]))


def test_a_peer_sees_what_it_leases_or_owns_an_admin_sees_all(
    access: Access, gpus: dict[int, ManagedGpu]
) -> None:
    with open("/dev/zero", "rb"):
        assert asyncio.run(access.visible(me(), True, [], gpus)) == {0}
        assert asyncio.run(access.visible(me(), True, [1], gpus)) == {0, 1}
        assert asyncio.run(access.visible(me(), False, [], gpus)) == set()  # not allowed
        assert asyncio.run(access.visible(me(gid=60), False, [], gpus)) is None
        assert asyncio.run(access.visible(Peer(1, 0, 0), False, [], gpus)) is None


def test_a_read_needs_a_lease_ownership_or_an_admin(
    access: Access, gpus: dict[int, ManagedGpu]
) -> None:
    asyncio.run(access.may_read(me(), [1], gpus[1]))  # leased
    asyncio.run(access.may_read(me(gid=60), [], gpus[1]))  # an admin
    with pytest.raises(Refused, match="is not pid"):
        asyncio.run(access.may_read(me(), [], gpus[1]))
    with open("/dev/zero", "rb"):
        asyncio.run(access.may_read(me(), [], gpus[0]))  # owned


async def _listen(path: Path, mode: int = 0o660) -> tuple[int, bool]:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await listen_unix(str(path), handler, None, mode)
    try:
        st = os.lstat(path)
        return stat.S_IMODE(st.st_mode), stat.S_ISSOCK(st.st_mode)
    finally:
        server.close()
        await server.wait_closed()


def test_the_socket_takes_its_mode_and_replaces_a_stale_one(tmp_path: Path) -> None:
    path = tmp_path / "run" / "gpud.sock"
    assert asyncio.run(_listen(path, 0o660)) == (0o660, True)
    stale = socket.socket(socket.AF_UNIX)  # bound, never listening: a dead daemon's socket
    path.unlink(missing_ok=True)
    stale.bind(str(path))
    stale.close()
    assert asyncio.run(_listen(path, 0o666)) == (0o666, True)


def test_a_live_daemon_or_a_file_in_the_way_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "gpud.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(path))
    live.listen()
    try:
        with pytest.raises(GpudStartError, match="another daemon is already serving"):
            asyncio.run(_listen(path))
    finally:
        live.close()
    path.unlink()
    path.write_text("not a socket")
    with pytest.raises(GpudStartError, match="exists and is not a socket"):
        asyncio.run(_listen(path))
    assert path.read_text() == "not a socket"
