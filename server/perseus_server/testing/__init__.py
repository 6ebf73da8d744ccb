"""Support for tests, benchmarks and the demo, kept apart from the service.

The server as a real subprocess (:class:`~perseus_server.testing.process.ServerProcess`) and named
crash points (:func:`~perseus_server.testing.faults.fault_point`, inert unless ``PERSEUS_FAULT``
names one).
"""
