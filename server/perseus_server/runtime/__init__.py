"""What the service runs on: the store, solves, the plan hub, worker pools and limits.

The store and its migrations, frontier solves in worker processes and the kernels warmed at start,
the plan hub, the parse and report worker pools, connection limits, rate-limited logs and a
byte-bounded cache. Imports the domain, never the service or an adapter.
"""
