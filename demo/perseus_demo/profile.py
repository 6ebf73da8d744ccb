"""The demo's profile: the sample shipped with it, the stages a run uses, its blocking power.

The sample profiles live in the repository's ``profiles/`` directory and are shipped inside
this package as ``perseus_demo/profiles/`` (package data), so that the default resolves through
:mod:`importlib.resources` in an installed package as well as in a checkout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from perseus_common.gpus import known_gpu_for
from perseus_demo.errors import DemoError

__all__ = [
    "DEFAULT_PROFILE",
    "sample_profile",
    "profile_path",
    "blocking_power_for",
    "slice_profile",
]

#: The file name of the sample profile the demo runs by default (GPT-3 175B on A100 SXM).
DEFAULT_PROFILE = "gpt3-175b_a100-sxm_8stage.csv"


def sample_profile(name: str = DEFAULT_PROFILE) -> Traversable:
    """A sample profile shipped with the demo, by file name (see ``profiles/README.md``)."""
    return resources.files("perseus_demo").joinpath("profiles", name)


@contextlib.contextmanager
def profile_path(given: Path | None) -> Iterator[Path]:
    """The file system path of the profile to run: ``given``, or the sample profile.

    The sample profile is extracted to a temporary file for as long as the context lasts, should
    the package be zipped.
    """
    if given is not None:
        if not given.is_file():
            raise DemoError(f"--profile: {given} is not a file")
        yield given
        return
    sample = sample_profile()
    if not sample.is_file():
        raise DemoError(f"--profile: the sample profile {DEFAULT_PROFILE} is not installed")
    with resources.as_file(sample) as path:
        yield path


def blocking_power_for(profile_name: str, given: float | None) -> float:
    """The watts a waiting GPU draws: ``given``, else the known GPU's measured value.

    The known GPU is the one the profile's file name names
    (:func:`perseus_common.gpus.known_gpu_for`, the lookup the ``perseus`` CLI uses too).
    """
    if given is not None:
        if not (given >= 0):
            raise DemoError("--blocking-power: must be >= 0 watts")
        return float(given)
    gpu = known_gpu_for(profile_name)
    if gpu is not None:
        return gpu.blocking_power
    raise DemoError("--blocking-power: required for this profile (watts a waiting GPU draws)")


def slice_profile(path: Path, stages: int) -> tuple[str, int]:
    """CSV text of the first ``stages`` stages of the profile, and how many stages it has.

    All of them when it has fewer (the caller checks);
    :meth:`perseus.profiles.Profile.select_stages` does the selecting, as ``perseus frontier
    --profile-stages`` does.
    """
    from perseus.profiles import load_profile

    prof = load_profile(path)
    return prof.select_stages(range(min(stages, prof.stages))).to_csv(), prof.stages
