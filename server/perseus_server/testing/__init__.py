"""Support for tests, benchmarks and the demo, kept apart from the service.

The server as a real subprocess (:class:`~perseus_server.testing.process.ServerProcess`) and the
hooks tests install in the server's fault points (:mod:`~perseus_server.testing.fault_hooks`; the
points are production's seam, :mod:`perseus_server.runtime.faults`, inert until hooks are
installed). Production code imports nothing of the fault hooks.
"""
