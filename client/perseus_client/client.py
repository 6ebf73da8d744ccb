"""``PerseusClient``: one per training rank.

It registers the rank with the Perseus server, keeps the rank's frequency plan up to date in the
background, locks the SM clock the plan gives before every instruction, and reports iteration
times. The training loop marks iterations and instructions with two context managers::

    from perseus_client import PerseusClient, RankPosition, SimulatedGpu

    gpu = SimulatedGpu.from_profile_csv("profiles/gpt3-175b_a100-sxm_8stage.csv", stage=0,
                                        blocking_power=83.64, time_scale=0.05)
    with PerseusClient("localhost:50051", job="my-job", gpu=gpu,
                       rank=RankPosition(global_rank=0, pipeline_rank=0)) as client:
        for step in range(100):
            with client.iteration():
                for mb in range(4):
                    with client.instruction("forward", microbatch=mb):
                        ...  # forward pass of microbatch mb
                for mb in range(4):
                    with client.instruction("backward", microbatch=mb):
                        ...  # backward pass of microbatch mb

Guarantees:

- **Plan versions swap only at iteration boundaries.** A new plan received mid-iteration is used
  from the next ``iteration()`` on.
- **The executed order is checked.** An instruction that is not the plan's next one raises
  :class:`~perseus_client.errors.PlanMismatchError` naming both (``strict=False``: logged once,
  and the rest of that iteration runs at the maximum clock).
- **Training never waits for the network.** Registration, the ``WatchPlan`` stream (reconnected
  with exponential backoff) and ``ReportIterations`` run in daemon threads. If the server has been
  unreachable for longer than ``FailOpen.server_timeout`` seconds, iterations run at the maximum clock
  until it is back.
- **Clocks are always reset**: on ``close()`` / leaving the ``with`` block, on an exception
  escaping an iteration, on SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGABRT and SIGUSR1/SIGUSR2 (see
  :mod:`perseus_client.safety`), and at interpreter exit, without waiting for a clock thread stuck
  on a hung GPU. A refused clock falls back to the maximum clock.
- **Applied clocks are verified**: a thread of the client's own samples the clock the GPU runs at
  (and NVML's throttle reasons); each report names the instructions that ran off-plan (see
  :mod:`perseus_client.gpu.applied`).
- **Online profiling**: while the server sends a ``ProfilingTask``, every instruction runs at the
  task's clock; after the task's first ``warmup_iterations`` iterations, every iteration reports
  each instruction's time and energy (energy-counter difference, with the device synchronised
  around the instruction) until the server sends the next task.

- **Clock control that cannot be had never stops training** (the default backend): no node
  daemon, a socket refused or not permitted, the GPU's lease held, NVML missing or not permitted.
  The client warns once, runs at the GPU's current clocks, retries in the background, takes
  control when it can, and reports :attr:`PerseusClient.clock_control` to the server (see
  :mod:`perseus_client.clock_control`). Only configuration errors raise.
- **Reports of a restarted rank are never muted**: each carries this process's random
  incarnation, and the server compares sequences within one incarnation only.

Configuration comes from the arguments or the environment: ``PERSEUS_SERVER`` (``host:port``, or
``grpcs://host:port`` for TLS; several, comma-separated, for an active/standby pair),
``PERSEUS_TOKEN`` (bearer token), ``PERSEUS_JOB`` (job id), ``PERSEUS_TLS_CA`` (PEM file of a
private CA; implies TLS), ``RANK`` (global rank) and ``LOCAL_RANK`` (NVML index of the default GPU
backend). The default backend is :class:`DaemonGpu` (through the node daemon ``perseus gpud``, no
privileges needed) when ``PERSEUS_GPUD_SOCKET`` is set or the default socket
``/run/perseus/gpud.sock`` exists, else the GPU of the vendor the availability probe finds
(:mod:`perseus_client.gpu.vendors`; :class:`NvmlGpu`); ``PERSEUS_DRY_RUN=1`` opens it in
``dry_run``, which records clock requests without applying them. It is built behind
:class:`FailOpenGpu`. The environment is read in one place
(:class:`perseus_client.defaults.Environment`); the tuning options come grouped
(:mod:`perseus_client.options`).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from perseus_client.clock_control import ACTIVE, FailOpenGpu
from perseus_client.connect import open_link, rank_registration, server_addresses
from perseus_client.controller import FrequencyController
from perseus_client.defaults import Environment, default_gpu
from perseus_client.errors import ClientError, ConfigError
from perseus_client.gpu.applied import ClockSampler
from perseus_client.gpu.base import GpuBackend
from perseus_client.gpu.floors import FloorPlayer, floor_state, floor_status
from perseus_client.hot_path import InstructionPath
from perseus_client.measurements import EventTiming, IterationMeasurement
from perseus_client.options import Connection, FailOpen, RankPosition, Reporting
from perseus_client.plan_choice import PlanChoice
from perseus_client.reports import IterationRecorder
from perseus_client.safety import ResetGuard
from perseus_client.scopes import InstructionScope, IterationScope
from perseus_common.kinds import INSTRUCTION_KINDS
from perseus_common.wire.values import PlanUpdate

if TYPE_CHECKING:
    from perseus_client.addresses import ServerAddress

__all__ = ["PerseusClient"]

log = logging.getLogger("perseus_client")
_KINDS = frozenset(INSTRUCTION_KINDS)


class PerseusClient(PlanChoice):
    """The Perseus client of one training rank (see the module docstring).

    Args:
        server: gRPC address ``host:port`` (``grpcs://`` for TLS), or several (a list, or one
            comma-separated string: the servers of an active/standby pair, followed to the
            leader; see :mod:`perseus_client.addresses`); default ``$PERSEUS_SERVER``.
        job: job id; default ``$PERSEUS_JOB``.
        token: bearer token; default ``$PERSEUS_TOKEN`` (none when unset).
        gpu: the GPU backend; default ``DaemonGpu($LOCAL_RANK)`` when a node daemon socket is
            configured or exists, else the GPU of the vendor the availability probe finds
            (``NvmlGpu($LOCAL_RANK, dry_run=$PERSEUS_DRY_RUN)``), behind :class:`FailOpenGpu`
            (never raises because clock control is unavailable).
        rank: where the rank sits in its job (:class:`~perseus_client.options.RankPosition`;
            default: global rank ``$RANK`` or 0, pipeline, data and tensor rank 0).
        strict: raise on a plan mismatch (else log once and run at max clock).
        offline: no server at all; plans come from :meth:`use_plan` (tests, benchmarks, replay).
        handle_signals: install the clock-reset signal handlers (main thread only; see
            :mod:`perseus_client.safety`).
        connection: TLS trust, RPC timeout, reconnection backoff
            (:class:`~perseus_client.options.Connection`).
        fail_open: when to run at the maximum clock without the server, and how to retry clock
            control (:class:`~perseus_client.options.FailOpen`).
        reporting: report interval, per-instruction measurements, CUDA events, applied-clock
            sampling (:class:`~perseus_client.options.Reporting`).
    """

    def __init__(
        self,
        server: str | Sequence[str] | None = None,
        job: str | None = None,
        *,
        token: str | None = None,
        gpu: GpuBackend | None = None,
        rank: RankPosition | None = None,
        strict: bool = True,
        offline: bool = False,
        handle_signals: bool = True,
        connection: Connection | None = None,
        fail_open: FailOpen | None = None,
        reporting: Reporting | None = None,
    ) -> None:
        env = Environment.read()
        rank = rank or RankPosition()
        connection = connection or Connection()
        fail_open = fail_open or FailOpen()
        reporting = reporting or Reporting()
        server = server if server is not None else env.server
        job = job if job is not None else env.job
        token = token if token is not None else env.token
        addresses: tuple[ServerAddress, ...] = ()
        roots: bytes | None = None
        if not offline:
            if not server:
                raise ConfigError("server", "pass server='host:port' or set PERSEUS_SERVER")
            if not job:
                raise ConfigError("job", "pass job='<job id>' or set PERSEUS_JOB")
            # Configuration errors raise here, before anything starts (a GPU lease included).
            addresses, roots = server_addresses(server, connection, env)
        self.global_rank = env.integer("RANK", rank.global_rank, 0)
        self.pipeline_rank = rank.pipeline_rank
        self.data_rank = rank.data_rank
        self.tensor_rank = rank.tensor_rank
        self.job = job
        self.strict = strict
        #: The options it runs with (:mod:`perseus_client.options`).
        self.fail_open, self.reporting, self.connection = fail_open, reporting, connection
        self.measure_instructions = reporting.measure_instructions

        self._owns_gpu = gpu is None
        if gpu is None:
            gpu = default_gpu(fail_open.clock_retry_initial, fail_open.clock_retry_max, env)
        self.gpu = gpu
        #: The fail-open wrapper of the default backend (``None`` for a backend passed in).
        self._failopen = gpu if isinstance(gpu, FailOpenGpu) else None
        self._clock_changed = False
        self._told_clock_control: tuple[str, str | None] = (ACTIVE, None)
        self.max_clock = gpu.max_clock
        self._sync_clocks = gpu.synchronous_clocks
        self._torch: Any = None
        cuda_events = reporting.cuda_events
        if cuda_events is None:
            torch = sys.modules.get("torch")
            cuda_events = bool(
                not gpu.synchronous_clocks and torch is not None and torch.cuda.is_available()
            )
        if cuda_events:
            import torch

            self._torch = torch
        self._cuda_events = bool(cuda_events)

        self.controller = FrequencyController(gpu)
        #: Samples the applied clock (``None``: the backend samples itself, or nobody can).
        self.clock_sampler = ClockSampler.for_backend(
            gpu, self.controller.lock_state, reporting.clock_sample_interval
        )
        self._init_state()
        self.link: Any = None
        if not offline:
            registration = rank_registration(str(job), self, gpu)
            self.link = open_link(
                addresses, registration, self._receive_plan, token, roots, connection, reporting
            )
        if self._failopen is not None:
            self._failopen.add_listener(self._on_clock_control)
            self._on_clock_control()
        self._guard = ResetGuard(
            self._emergency_reset, resume=self._resume_after_signal, signals=handle_signals
        )
        if self.link is not None:
            self.link.start()

    def _init_state(self) -> None:
        """The per-iteration state the training thread walks (nothing runs yet)."""
        self._mismatch_logged = False
        self._path = InstructionPath(
            self.gpu,
            self.controller,
            self.max_clock,
            pipeline_rank=self.pipeline_rank,
            strict=self.strict,
            on_mismatch=self._log_mismatch,
            torch=self._torch,
        )
        #: The instruction edges the integrations call (the hot path, no context manager):
        #: ``begin(kind, microbatch, stage)`` before the instruction's body, ``end()`` after it
        #: returned, ``abort()`` when it raised (see :mod:`perseus_client.hot_path`).
        self.begin = self._path.begin
        self.end = self._path.end
        self.abort = self._path.abort
        self._iteration_scope = IterationScope(self)
        self._instruction_scope = InstructionScope(self)

        self._latest: PlanUpdate | None = None  # newest plan received (swapped in at a boundary)
        self._plan: PlanUpdate | None = None  # plan of the current / last iteration
        self._plan_lock = threading.Lock()
        self.failed_open = False
        self.iterations = 0
        self._in_iteration = False
        self._profile_iter = 0
        self._iter_t0 = 0.0
        self._iter_e0 = 0
        self._rec = IterationRecorder()
        #: Plays the plan's power floors on the GPU, restarted at every iteration boundary.
        self.floors = FloorPlayer(self.gpu)
        #: The last iteration's measurement (also what was queued for the server).
        self.last_report: IterationMeasurement | None = None
        self._closed = False

    # -- clock control ----------------------------------------------------------------------------

    @property
    def clock_control(self) -> str:
        """``"active"`` while this rank controls its GPU's clocks, else ``"unavailable"``.

        ``"unavailable"``: the default backend could not be had (see
        :mod:`perseus_client.clock_control`).
        """
        return self._failopen.state if self._failopen is not None else ACTIVE

    @property
    def floor_status(self) -> str | None:
        """None without floors to hold; else whether this GPU holds them (and if not, why)."""
        return floor_status(self.gpu, self._plan, self.floors)

    @property
    def clock_control_reason(self) -> str | None:
        """Why clock control is unavailable (``None`` while it is active)."""
        return self._failopen.reason if self._failopen is not None else None

    def _on_clock_control(self) -> None:
        """Clock control may have changed: refresh the maximum clock, and tell the server.

        Called from a background thread; the maximum clock is refreshed at the next
        iteration boundary.
        """
        self._clock_changed = True
        state, reason = self.clock_control, self.clock_control_reason
        self._told_clock_control = (state, reason)
        link = self.link
        if link is not None:
            gpu = self.gpu
            link.set_clock_control(
                state,
                reason or "",
                gpu_name=gpu.name,
                supported_clocks=tuple(gpu.supported_clocks()),
            )

    def _refresh_max_clock(self) -> None:
        self._clock_changed = False
        mhz = self.gpu.max_clock
        if mhz != self.max_clock:
            self.max_clock = mhz
            self._path.max_clock = mhz
            self.controller.set_max_clock(mhz)

    # -- iterations -------------------------------------------------------------------------------

    def iteration(self) -> IterationScope:
        """Context manager marking one training iteration."""
        return self._iteration_scope

    def _begin_iteration(self) -> None:
        if self._in_iteration:
            raise ClientError("iteration() blocks do not nest")
        if self._closed:
            raise ClientError("the client is closed")
        if self._clock_changed:
            self._refresh_max_clock()
        plan = self._select_plan()
        if plan is not self._plan:
            self._plan = plan
            self._profile_iter = 0
        task = plan.profiling if plan is not None else None
        if task is not None:
            k = self._profile_iter
            self._profile_iter = k + 1
            # Measure every iteration after the warm-up: the server keeps as many as it needs
            # (``task.iterations``) and moves on to the next clock when it has them.
            measure_energy = record = k >= task.warmup_iterations
        else:
            measure_energy, record = False, self.measure_instructions
        self._path.start(plan, measure_energy=measure_energy, record=record)
        self._rec.start()
        self._in_iteration = True
        gpu = self.gpu
        self._iter_e0 = gpu.energy_mj()
        self._iter_t0 = gpu.timestamp()
        if plan is not None:
            self.floors.start_iteration(plan.power_floors, plan.ramp_w_per_s)
        else:
            self.floors.start_iteration(())

    def _end_iteration(self, exc: BaseException | None) -> None:
        gpu = self.gpu
        t1 = gpu.timestamp()
        e1 = gpu.energy_mj()
        self._in_iteration = False
        if exc is not None:
            self._path.finish()
            # Training hit an exception: never leave the GPU locked while it unwinds, and never
            # wait for the clock thread (the exception may come from a hung collective).
            self.controller.reset_now(close=False)
            # Drop this iteration's applied-clock samples: they must not leak into the next report.
            if self.clock_sampler is not None:
                self.clock_sampler.take()
            else:
                gpu.take_applied_clocks()
            return
        index = self.iterations
        self.iterations = index + 1
        plan = self._plan
        sampler = self.clock_sampler
        rec = self._rec
        build, rec.events = self._path.finish()
        rec.instructions = build if build is not None else []
        record = rec.finish(
            index,
            t1 - self._iter_t0,
            plan.version if plan is not None else 0,
            (e1 - self._iter_e0) / 1000.0,
            sampler.take() if sampler is not None else gpu.take_applied_clocks(),
        )
        self.last_report = record
        if self.link is not None:
            failopen = self._failopen
            if failopen is not None and failopen.state != self._told_clock_control[0]:
                self._on_clock_control()  # e.g. the node daemon went away mid-run, or came back
            self.link.set_power_floor(floor_state(gpu, plan, self.floors))
            self.link.submit(record)
        self._path.check_complete()

    # -- instructions -----------------------------------------------------------------------------

    def instruction(
        self, kind: str, microbatch: int = 0, stage: int | None = None
    ) -> InstructionScope:
        """Context manager around one instruction of ``microbatch``.

        The instruction is ``forward``, ``backward``, ``backward_input`` or
        ``backward_weight``; ``stage`` is the model stage with virtual stages.
        """
        if kind not in _KINDS:
            raise ConfigError(
                "kind", f"unknown instruction kind {kind!r} (one of {', '.join(INSTRUCTION_KINDS)})"
            )
        scope = self._instruction_scope
        scope.kind = kind
        scope.microbatch = microbatch
        scope.stage = stage
        return scope

    # -- transfers --------------------------------------------------------------------------------

    def record_transfer(
        self, boundary: int, direction: str, microbatch: int, seconds: float | EventTiming
    ) -> None:
        """Record one timed P2P transfer of the current iteration.

        The transfer is ``microbatch``'s activations (``direction="forward"``, stage
        ``boundary`` to ``boundary + 1``) or gradients (``"backward"``, ``boundary + 1`` to
        ``boundary``), which took ``seconds`` (or the
        :class:`~perseus_client.measurements.EventTiming` of the CUDA events around it on
        NCCL, resolved when the report is built, off the training thread).

        Cheap enough for the hot path: one append, no lock, no check (a transfer the server
        would refuse is dropped when the report is built, off the training thread). Outside an
        ``iteration()`` block it does nothing. The iteration's report carries them; the server's
        online profiling fits the profile's transfer times from them and detects slow links.
        """
        if self._in_iteration:
            # An EventTiming stands in for the seconds until the record is resolved.
            self._rec.transfers.append((boundary, direction, microbatch, seconds))  # type: ignore[arg-type]

    # -- shutdown ---------------------------------------------------------------------------------

    def _emergency_reset(self) -> None:
        self.controller.reset_now()

    def _resume_after_signal(self) -> None:
        if not self._closed:
            self.controller.reopen()

    def close(self, *, finished: bool = False) -> None:
        """Reset the clocks, send queued reports (bounded wait), stop the background threads.

        ``finished``: the training ended cleanly; the server hears it (``FinishRank``) and
        marks the job finished once every rank said so (a ``with`` block that ends without
        an exception says so).
        """
        if self._closed:
            return
        self._closed = True
        self._guard.uninstall()
        self.controller.close(reset=True)
        self.floors.close()
        if self.clock_sampler is not None:
            self.clock_sampler.close()
        if self.link is not None:
            if finished:
                self.link.finish()
            self.link.close()
        if self._owns_gpu:
            self.gpu.close()

    def __enter__(self) -> PerseusClient:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(finished=et is None)
