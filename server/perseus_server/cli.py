"""Command line of the server: ``perseus serve ...`` (also ``python -m perseus_server ...``)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from perseus_server.config import Limits, ServerConfig, ZeusConfig
from perseus_server.config import read_token as read_token_file
from perseus_server.domain.store import StoreError
from perseus_server.runtime.logs import install_rate_limit
from perseus_server.runtime.stores import is_postgres, sqlite_path
from perseus_server.standby import advertise_problem

__all__ = ["main", "build_parser", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback one."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    addrs = {str(info[4][0]) for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def _add_leadership_options(p: argparse.ArgumentParser) -> None:
    """The options of an active/standby pair on PostgreSQL."""
    p.add_argument(
        "--leader-lease",
        type=float,
        default=ServerConfig().leader_lease,
        help="with PostgreSQL: seconds the leader's lease lasts unrenewed, after which a standby "
        "sharing the database takes over (default %(default)s)",
    )
    p.add_argument(
        "--advertise",
        metavar="HOST",
        help="with PostgreSQL: the host name or address ranks and clients reach this server at "
        "when it leads, which a standby names in its answers (default: --host, or this "
        "machine's host name when --host is every address)",
    )


def build_parser(prog: str = "perseus serve") -> argparse.ArgumentParser:
    """The ``perseus serve`` command line: its options and their help."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve the Perseus REST API and the gRPC plan push from one process. "
        "Port 0 picks a free port; the addresses are printed once listening.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--http-port", type=int, default=8000, help="REST port (default 8000; 0 = any free port)"
    )
    p.add_argument(
        "--grpc-port", type=int, default=50051, help="gRPC port (default 50051; 0 = any free port)"
    )
    p.add_argument(
        "--db",
        default="perseus.db",
        help="the store: a SQLite file (default ./perseus.db; also sqlite:///PATH) or a "
        "PostgreSQL URL (postgresql://USER@HOST/DB)",
    )
    _add_leadership_options(p)
    _add_tenancy_options(p)
    p.add_argument(
        "--token-file", type=Path, help="file holding the bearer token every call must carry"
    )
    p.add_argument(
        "--read-token-file",
        type=Path,
        help="file holding a read-only bearer token (REST GET routes only; needs --token-file)",
    )
    p.add_argument(
        "--tls-cert", type=Path, help="PEM certificate (TLS for REST and gRPC; needs --tls-key)"
    )
    p.add_argument("--tls-key", type=Path, help="PEM private key")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow listening on a non-loopback address without --token-file",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    d = Limits()
    p.add_argument(
        "--solve-memory-mib",
        type=int,
        default=d.solve_memory_bytes // 2**20,
        help="resident memory one frontier computation may use (MiB; default %(default)s)",
    )
    p.add_argument(
        "--solve-time-limit",
        type=float,
        default=d.solve_seconds,
        help="wall time one frontier computation may take (s; default %(default)s)",
    )
    p.add_argument(
        "--max-queued-solves",
        type=int,
        default=d.max_queued_solves,
        help="frontier computations waiting for a worker at once (default %(default)s)",
    )
    p.add_argument(
        "--idle-after",
        type=float,
        default=d.idle_after_seconds,
        help="seconds without a connected rank after which a job is idle and leaves the power "
        "budget (default %(default)s)",
    )
    p.add_argument(
        "--replan-dwell",
        type=float,
        default=d.replan_dwell_seconds,
        help="least seconds between two replans of one pipeline caused by its reported "
        "iteration times (default %(default)s; 0: none)",
    )
    p.add_argument(
        "--profile-mismatch-band",
        default=",".join(f"{x:g}" for x in d.profile_mismatch_band),
        metavar="LOW,HIGH",
        help="measured / planned iteration time outside this band marks a job profile_mismatch "
        "(default %(default)s)",
    )
    p.add_argument(
        "--max-streams-per-credential",
        type=int,
        default=d.max_streams_per_credential,
        help="WatchPlan streams one credential may hold at once (default %(default)s; a rank "
        "holds one, a new stream for it replaces the old)",
    )
    c = ServerConfig()
    p.add_argument(
        "--header-timeout",
        type=float,
        default=c.header_timeout,
        help="seconds a connection may take to send a request's headers (default %(default)s)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=c.body_timeout,
        help="seconds a request's body may take to arrive after its headers (default %(default)s)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the server answers without a token besides loopback ones (repeat "
        "for several; e.g. the name a proxy or tunnel uses)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=c.max_connections,
        help="open connections per protocol at most (default %(default)s; also bounded by "
        "the file-descriptor limit)",
    )
    _add_zeus_options(p)
    return p


def _add_zeus_options(p: argparse.ArgumentParser) -> None:
    """The options of Zeus's pipeline-frequency-optimizer routes (``docs/zeus.md``)."""
    z = ZeusConfig()
    p.add_argument(
        "--zeus",
        action="store_true",
        help="also answer Zeus's pipeline-frequency-optimizer routes under /zeus on the REST "
        "port (a Zeus client's server_url: http://HOST:PORT/zeus; docs/zeus.md)",
    )
    p.add_argument(
        "--zeus-default-prototype",
        metavar="NAME_OR_ID",
        help="with --zeus: the prototype job of a Zeus run whose job_metadata is empty (a job's "
        "name or id, in the run's tenant; default: such a run is refused)",
    )
    p.add_argument(
        "--zeus-plan-wait",
        type=float,
        default=z.plan_wait,
        metavar="SECONDS",
        help="with --zeus: the longest a Zeus rank waits for its run's plan before it gets the "
        "max-clock schedule (default %(default)s)",
    )


def _zeus_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ZeusConfig | None:
    """The Zeus routes' settings (None without ``--zeus``); refuses options without it."""
    if not args.zeus:
        if args.zeus_default_prototype is not None or args.zeus_plan_wait != ZeusConfig().plan_wait:
            parser.error("--zeus-default-prototype and --zeus-plan-wait need --zeus")
        return None
    if not 0 < args.zeus_plan_wait <= 3600:
        parser.error("--zeus-plan-wait must be between 0 and 3600 seconds")
    default = (args.zeus_default_prototype or "").strip() or None
    return ZeusConfig(default_prototype=default, plan_wait=args.zeus_plan_wait)


def _add_tenancy_options(p: argparse.ArgumentParser) -> None:
    """The caps tenants share and the pace of their writes (``docs/server.md``, *Fairness*)."""
    d = Limits()
    p.add_argument(
        "--max-jobs",
        type=int,
        default=d.max_jobs,
        help="jobs the server holds at once; tenants' default quotas are shares of it "
        "(default %(default)s)",
    )
    p.add_argument(
        "--max-gpus",
        type=int,
        default=d.max_gpus,
        help="GPUs (world sizes summed) the server's jobs hold at once; tenants' default GPU "
        "quotas are shares of it (default %(default)s)",
    )
    p.add_argument(
        "--max-concurrent-solves",
        type=int,
        default=d.max_concurrent_solves,
        help="frontier computations running at once, served to the tenants in turn "
        "(default %(default)s)",
    )
    p.add_argument(
        "--tenant-write-rate",
        type=float,
        default=d.tenant_write_rate,
        help="REST writes per second one tenant's credentials may make, sustained (429 with "
        "Retry-After beyond; default %(default)s; 0: no limit)",
    )
    p.add_argument(
        "--tenant-write-burst",
        type=int,
        default=d.tenant_write_burst,
        help="REST writes one tenant may make at once before the rate applies "
        "(default %(default)s)",
    )


def _tenancy_limits(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`Limits` fields of :func:`_add_tenancy_options`, checked."""
    if min(args.max_jobs, args.max_gpus, args.max_concurrent_solves, args.tenant_write_burst) < 1:
        parser.error(
            "--max-jobs, --max-gpus, --max-concurrent-solves and --tenant-write-burst must be "
            "positive"
        )
    if not 0 <= args.tenant_write_rate < float("inf"):
        parser.error("--tenant-write-rate must be a number >= 0")
    return {
        "max_jobs": args.max_jobs,
        "max_gpus": args.max_gpus,
        "max_concurrent_solves": args.max_concurrent_solves,
        "tenant_write_rate": args.tenant_write_rate,
        "tenant_write_burst": args.tenant_write_burst,
    }


def _read_token(parser: argparse.ArgumentParser, flag: str, path: Path | None) -> str | None:
    """The token in ``path`` (None without one).

    Refuses an empty file, a token with spaces, and a file other users can read.
    """
    if path is None:
        return None
    try:
        return read_token_file(path)
    except ValueError as e:
        parser.error(f"{flag} {path}: {e}")


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the server until SIGTERM/SIGINT; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("http_port", "grpc_port"):
        if not (0 <= getattr(args, name) <= 65535):
            parser.error(f"--{name.replace('_', '-')} must be between 0 and 65535")
    if args.solve_memory_mib < 1 or not args.solve_time_limit > 0 or args.max_queued_solves < 1:
        parser.error(
            "--solve-memory-mib, --solve-time-limit and --max-queued-solves must be positive"
        )
    if not args.header_timeout > 0 or not args.body_timeout > 0 or args.max_connections < 1:
        parser.error("--header-timeout, --body-timeout and --max-connections must be positive")
    if not 0 < args.leader_lease <= 3600:
        parser.error("--leader-lease must be between 0 and 3600 seconds")
    if args.advertise is not None:
        problem = advertise_problem(args.advertise)
        if problem is not None:
            parser.error(f"--advertise {args.advertise!r}: {problem}")
    if args.max_streams_per_credential < 1:
        parser.error("--max-streams-per-credential must be positive")
    if not is_postgres(args.db):
        try:
            sqlite_path(args.db)
        except StoreError as e:
            parser.error(str(e))
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    for path in (args.tls_cert, args.tls_key):
        if path is not None and not path.is_file():
            parser.error(f"no such file: {path}")
    if not args.idle_after > 0 or not args.replan_dwell >= 0:
        parser.error("--idle-after must be positive and --replan-dwell at least 0")
    try:
        low, high = (float(x) for x in args.profile_mismatch_band.split(","))
    except ValueError:
        parser.error("--profile-mismatch-band must be two numbers LOW,HIGH, e.g. 0.5,2")
    if not (0 < low < 1 < high < float("inf")):
        parser.error("--profile-mismatch-band needs 0 < LOW < 1 < HIGH")
    zeus = _zeus_config(parser, args)
    token = _read_token(parser, "--token-file", args.token_file)
    read_token = _read_token(parser, "--read-token-file", args.read_token_file)
    if read_token is not None and token is None:
        parser.error("--read-token-file needs --token-file (the admin token)")
    if read_token is not None and read_token == token:
        parser.error("--read-token-file must hold another token than --token-file")
    if token is None and not args.insecure and not is_loopback(args.host):
        parser.error(
            f"--host {args.host} is not a loopback address: give --token-file "
            "(or --insecure to serve it without authentication)"
        )
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_rate_limit()
    config = ServerConfig(
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        db_path=args.db,
        leader_lease=args.leader_lease,
        advertise=args.advertise,
        token=token,
        read_token=read_token,
        token_file=args.token_file,
        read_token_file=args.read_token_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        max_connections=args.max_connections,
        allowed_hosts=tuple(args.allowed_host),
        zeus=zeus,
        limits=replace(
            Limits(),
            solve_memory_bytes=args.solve_memory_mib * 2**20,
            solve_seconds=args.solve_time_limit,
            max_queued_solves=args.max_queued_solves,
            idle_after_seconds=args.idle_after,
            replan_dwell_seconds=args.replan_dwell,
            profile_mismatch_band=(low, high),
            max_streams_per_credential=args.max_streams_per_credential,
            **_tenancy_limits(parser, args),
        ),
    )
    from perseus_server.server import serve

    try:
        return asyncio.run(serve(config))
    except (OSError, StoreError) as e:
        print(f"perseus serve: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
