"""The Perseus service: jobs, profiles, frontiers, plan deployment, ranks and reports.

Jobs, profiles, frontier computations, plan deployment, ranks and iteration reports. REST and gRPC
are thin adapters over :class:`PerseusService` and its parts.

One module per concern: :mod:`.state` (the jobs' in-memory state, in parts),
:mod:`.persistence` (to and from the :class:`~perseus_server.domain.store.Store`),
:mod:`.job_profiles`, :mod:`.solves` (frontier computations), :mod:`.plans` (plan queries),
:mod:`.deployment` (deciding, publishing and building each rank's plan), :mod:`.reports`
(iteration reports), :mod:`.stragglers` and :mod:`.slow_stages`, :mod:`.registration`,
:mod:`.online_profiling`, :mod:`.views`; the facade :mod:`.facade` builds them, each given what
it calls. :mod:`perseus_common.wire.values` holds the plain values exchanged with the ranks
(only the gRPC adapter speaks protobuf).
"""

from perseus_server.service.facade import PerseusService

__all__ = ["PerseusService"]
