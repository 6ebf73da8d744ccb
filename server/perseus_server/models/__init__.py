"""Pydantic models of the frontier and plan routes, and what every model shares.

The frontier and plan routes are :mod:`perseus_server.rest.plans`; what every model shares is
:mod:`perseus_server.models.base`.

The other features' request and response models sit next to their routers in
:mod:`perseus_server.rest` (``jobs.py``, ``job_status.py``, ``profiles.py``, ...); the problem
document of errors in :mod:`perseus_server.rest.problems`.
"""

from perseus_server.models.requests import PlanSelect
from perseus_server.models.responses import (
    DeploymentView,
    FrontierPoint,
    FrontierState,
    FrontierStatus,
    FrontierSummary,
    MaxClockDeployment,
    PipelineDeployment,
    PlanDeployment,
    PlanDoc,
    PlanPolicyView,
    PlanStep,
    ProfilingDeployment,
    ProfilingStepView,
)

__all__ = [
    "DeploymentView",
    "FrontierPoint",
    "FrontierState",
    "FrontierStatus",
    "FrontierSummary",
    "MaxClockDeployment",
    "PipelineDeployment",
    "PlanDeployment",
    "PlanDoc",
    "PlanPolicyView",
    "PlanSelect",
    "PlanStep",
    "ProfilingDeployment",
    "ProfilingStepView",
]
