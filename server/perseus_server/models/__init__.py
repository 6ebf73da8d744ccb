"""Pydantic models of the frontier and plan routes, and what every model shares.

The frontier and plan routes are :mod:`perseus_server.rest.plans`; what every model shares is
:mod:`perseus_server.models.base`.

Import each model from its module (:mod:`.requests`, :mod:`.responses`; this package
re-exports nothing). The other features' request and response models sit next to their routers in
:mod:`perseus_server.rest` (``jobs.py``, ``job_status.py``, ``profiles.py``, ...); the problem
document of errors in :mod:`perseus_server.rest.problems`.
"""
