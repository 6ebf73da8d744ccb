"""The daemon's Prometheus metrics.

Per GPU clocks, power, energy, throttle reasons, holder and refusals, served on a loopback port
(``--metrics-port``) and/or written to a file for node-exporter's textfile collector
(``--metrics-textfile``).

Every per-GPU sample carries ``uuid`` and ``index`` and nothing that changes with the holder,
so a GPU's series do not churn as leases come and go; the holder's identity (pid, uid, pod,
namespace, Slurm job, and the Perseus job and tenant its client named) is in one info series per
leased GPU, ``perseus_gpud_lease_holder_info``, to join on ``uuid``. Refusals are counted by the
refused peer's ``uid``. Names follow Prometheus conventions: base units in the name (hertz,
watts, joules, seconds), ``_total`` only on counters.

The textfile is written safely in a directory others may write: a fresh temporary file made
with ``mkstemp`` (``O_CREAT | O_EXCL``: a planted file or link of that name is never opened), then
``os.replace`` onto the target, and a target that is a symbolic link is refused.

==============================================  =======  =====================================
metric                                          type     meaning
==============================================  =======  =====================================
``perseus_gpud_sm_clock_hertz``                 gauge    the SM clock the GPU runs at now
``perseus_gpud_sm_clock_locked_hertz``          gauge    the SM clock the daemon locked (no
                                                         sample: not locked)
``perseus_gpud_power_watts``                    gauge    power draw now
``perseus_gpud_energy_joules_total``            counter  energy since the driver loaded
``perseus_gpud_clock_event_reason_active``      gauge    1 per NVML clock-event (throttle)
                                                         reason in effect, label ``reason``
``perseus_gpud_leased``                         gauge    1 while a process holds the lease
``perseus_gpud_lease_holder_info``              gauge    1, labels ``pid``, ``uid``,
                                                         ``owned_by``, ``pod``, ``namespace``,
                                                         ``slurm_job``, ``perseus_job``, ``tenant``
``perseus_gpud_refusals_total``                 counter  refused requests by ``reason`` (the
                                                         error code), ``uid``, ``uuid`` (absent:
                                                         no GPU named)
``perseus_gpud_connections``                    gauge    open connections
``perseus_gpud_connections_closed_total``       counter  connections refused or closed by the
                                                         limits, by ``reason``
``perseus_gpud_start_time_seconds``             gauge    when the daemon started (Unix time)
==============================================  =======  =====================================
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from perseus_client.gpu.nvml import CLOCK_EVENT_REASONS
from perseus_gpud.files import replace_file

if TYPE_CHECKING:
    from perseus_gpud.server import GpudServer

__all__ = ["render", "serve_http", "write_textfile_forever", "write_textfile"]

log = logging.getLogger("perseus_gpud")

_HELP = {
    "perseus_gpud_sm_clock_hertz": ("gauge", "SM clock the GPU runs at now"),
    "perseus_gpud_sm_clock_locked_hertz": ("gauge", "SM clock locked by gpud (absent: none)"),
    "perseus_gpud_power_watts": ("gauge", "Power draw now"),
    "perseus_gpud_energy_joules_total": ("counter", "Energy consumed since the driver loaded"),
    "perseus_gpud_clock_event_reason_active": (
        "gauge",
        "1 when the NVML clock-event (throttle) reason is in effect",
    ),
    "perseus_gpud_leased": ("gauge", "1 while a process holds the GPU's lease"),
    "perseus_gpud_lease_holder_info": ("gauge", "The process holding the GPU's lease"),
    "perseus_gpud_refusals_total": ("counter", "Requests refused, by error code and peer uid"),
    "perseus_gpud_connections": ("gauge", "Open connections to the daemon"),
    "perseus_gpud_connections_closed_total": (
        "counter",
        "Connections refused or closed by the connection limits, by reason",
    ),
    "perseus_gpud_start_time_seconds": ("gauge", "Start time of the daemon, Unix seconds"),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, Any]) -> str:
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items() if str(v) != "")
    return "{" + inner + "}" if inner else ""


async def _gpu_samples(server: GpudServer) -> list[tuple[str, dict[str, Any], float]]:
    out: list[tuple[str, dict[str, Any], float]] = []
    for index, gpu in server.gpus.items():
        labels: dict[str, Any] = {"uuid": gpu.uuid, "index": index}
        held = server.holder(index)
        try:
            mhz, reasons, _ = await server._run(gpu, gpu.sample)
            power = await server._run(gpu, gpu.power_w)
            energy_mj = await server._run(gpu, gpu.energy_mj)
        except Exception as exc:  # noqa: BLE001 - a GPU that cannot be read is skipped
            log.error("metrics: cannot read GPU %d: %s", index, exc)
            continue
        out.append(("perseus_gpud_sm_clock_hertz", labels, mhz * 1e6))
        if gpu.locked_mhz is not None:
            out.append(("perseus_gpud_sm_clock_locked_hertz", labels, gpu.locked_mhz * 1e6))
        out.append(("perseus_gpud_power_watts", labels, power))
        out.append(("perseus_gpud_energy_joules_total", labels, energy_mj / 1000.0))
        for bit, name in sorted(CLOCK_EVENT_REASONS.items()):
            active = 1.0 if reasons & bit else 0.0
            out.append(
                ("perseus_gpud_clock_event_reason_active", {**labels, "reason": name}, active)
            )
        out.append(("perseus_gpud_leased", labels, 1.0 if held is not None else 0.0))
        if held is not None:
            peer, owner = held
            info = {
                **labels,
                "pid": peer.pid,
                "uid": peer.uid,
                "owned_by": owner.how,
                "pod": owner.pod,
                "namespace": owner.namespace,
                "slurm_job": owner.slurm_job,
                # not `job`: Prometheus's own (the scrape's) would overwrite it
                "perseus_job": owner.job,
                "tenant": owner.tenant,
            }
            out.append(("perseus_gpud_lease_holder_info", info, 1.0))
    return out


async def render(server: GpudServer) -> str:
    """The metrics in Prometheus's text exposition format (version 0.0.4)."""
    samples = await _gpu_samples(server)
    for (uuid, reason, uid), n in sorted(server.refusals.items()):
        labels = {"uuid": uuid, "reason": reason, "uid": uid}
        samples.append(("perseus_gpud_refusals_total", labels, n))
    samples.append(("perseus_gpud_connections", {}, float(server.connection_count())))
    for reason in ("limit", "idle", "frame"):
        n = server.connections_closed[reason]
        samples.append(("perseus_gpud_connections_closed_total", {"reason": reason}, n))
    samples.append(("perseus_gpud_start_time_seconds", {}, server.started))
    return _format(samples)


def _format(samples: Iterable[tuple[str, dict[str, Any], float]]) -> str:
    by_name: dict[str, list[str]] = {}
    for name, labels, value in samples:
        by_name.setdefault(name, []).append(f"{name}{_labels(labels)} {float(value)!r}")
    lines = []
    for name, (kind, text) in _HELP.items():
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines += by_name.get(name, [])
    return "\n".join(lines) + "\n"


async def serve_http(server: GpudServer, port: int, host: str = "127.0.0.1") -> asyncio.Server:
    """Serve ``GET /metrics`` on ``host:port`` (loopback by default); return the server."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            parts = head.split(b"\r\n", 1)[0].split()
            if len(parts) >= 2 and parts[0] == b"GET" and parts[1].split(b"?")[0] == b"/metrics":
                body, status = (await render(server)).encode(), b"200 OK"
                kind = b"text/plain; version=0.0.4; charset=utf-8"
            else:
                body, status, kind = (
                    b"not found: try GET /metrics\n",
                    b"404 Not Found",
                    b"text/plain",
                )
            writer.write(
                b"HTTP/1.1 "
                + status
                + b"\r\nContent-Type: "
                + kind
                + b"\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )
            await asyncio.wait_for(writer.drain(), 5.0)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)


async def write_textfile(server: GpudServer, path: str) -> None:
    """Write the metrics to ``path`` atomically, safely (:func:`replace_file`).

    ``path`` is a ``.prom`` file of the textfile collector.
    """
    replace_file(path, await render(server))


async def write_textfile_forever(server: GpudServer, path: str, interval: float) -> None:
    """Rewrite ``path`` every ``interval`` seconds until cancelled."""
    while True:
        try:
            await write_textfile(server, path)
        except OSError as exc:
            log.error("metrics: cannot write %s: %s", path, exc)
        await asyncio.sleep(interval)
