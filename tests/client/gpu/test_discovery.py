"""Which GPU a process asks the daemon for, from what the runtime gave it.

See :func:`perseus_client.gpu.discovery.discover_gpu`.
"""

from __future__ import annotations

import pytest

from perseus_client.gpu.discovery import DiscoveryError, GpuSelector, discover_gpu

A = "GPU-d569c610-692e-515d-8006-62524f79e823"
B = "GPU-a313d9f9-86fe-5206-be51-a6ff4ead5c64"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, GpuSelector(index=0, source="default")),
        ({"LOCAL_RANK": "3"}, GpuSelector(index=3, source="LOCAL_RANK")),
        # Slurm / a plain host: the task's list, indexed by local rank.
        ({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,6"}, GpuSelector(index=6, source="CUDA_VISIBLE_DEVICES")),
        # One GPU given: it is this process's, whatever its rank.
        ({"LOCAL_RANK": "5", "CUDA_VISIBLE_DEVICES": "2"}, GpuSelector(index=2, source="CUDA_VISIBLE_DEVICES")),
        # Kubernetes: the device plugin's UUIDs; the container sees them as 0..n-1.
        ({"LOCAL_RANK": "1", "NVIDIA_VISIBLE_DEVICES": f"{A},{B}"}, GpuSelector(uuid=B, source="NVIDIA_VISIBLE_DEVICES")),
        ({"NVIDIA_VISIBLE_DEVICES": B}, GpuSelector(uuid=B, source="NVIDIA_VISIBLE_DEVICES")),
        # CUDA's list wins over the runtime's; "all" is no list.
        ({"CUDA_VISIBLE_DEVICES": A, "NVIDIA_VISIBLE_DEVICES": B}, GpuSelector(uuid=A, source="CUDA_VISIBLE_DEVICES")),
        ({"LOCAL_RANK": "2", "NVIDIA_VISIBLE_DEVICES": "all"}, GpuSelector(index=2, source="LOCAL_RANK")),
        ({"CUDA_VISIBLE_DEVICES": " GPU-d569c610 "}, GpuSelector(uuid="GPU-d569c610", source="CUDA_VISIBLE_DEVICES")),
        # In a container, CUDA's index counts the runtime's devices: the second is B.
        ({"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": f"{A},{B}"}, GpuSelector(uuid=B, source="CUDA_VISIBLE_DEVICES+NVIDIA_VISIBLE_DEVICES")),
        ({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1", "NVIDIA_VISIBLE_DEVICES": "3,5"}, GpuSelector(index=5, source="CUDA_VISIBLE_DEVICES+NVIDIA_VISIBLE_DEVICES")),
    ],
)  # fmt: skip
def test_discovery(env: dict[str, str], expected: GpuSelector) -> None:
    assert discover_gpu(env) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "0,1"}, "LOCAL_RANK 2 but CUDA_VISIBLE_DEVICES lists 2"),
        ({"CUDA_VISIBLE_DEVICES": ""}, "CUDA_VISIBLE_DEVICES: empty"),
        ({"CUDA_VISIBLE_DEVICES": "MIG-4f1e1a8c-0000-0000-0000-000000000000"}, "MIG device"),
        ({"CUDA_VISIBLE_DEVICES": "fast"}, "neither a GPU index nor"),
        ({"LOCAL_RANK": "one"}, "LOCAL_RANK: expected an integer"),
        ({"LOCAL_RANK": "-1"}, "LOCAL_RANK: must be >= 0"),
        ({"CUDA_VISIBLE_DEVICES": "2", "NVIDIA_VISIBLE_DEVICES": f"{A},{B}"}, "index 2 but NVIDIA_VISIBLE_DEVICES lists 2"),
    ],
)  # fmt: skip
def test_discovery_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(DiscoveryError, match=message):
        discover_gpu(env)
