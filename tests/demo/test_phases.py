"""The demo's phases (``perseus_demo.phases``): their order, titles and reference labels."""

from __future__ import annotations

from perseus_demo.phases import PHASE_TITLES, PHASES, REFERENCE, REFERENCES


def test_every_phase_has_a_title_in_order() -> None:
    assert PHASES[0] == "max-clocks" and PHASES[-1] == "power-budget"
    assert list(PHASE_TITLES) == list(PHASES)
    assert [t.split(":")[0] for t in PHASE_TITLES.values()] == [
        f"Phase {i}" for i in range(1, len(PHASES) + 1)
    ]


def test_the_interleaved_steps_have_labels_of_their_own() -> None:
    """A label shared with a phase, or between two phases, would mix their steps in the analysis."""
    assert set(REFERENCES) == {"perseus", "power-budget"} <= set(PHASES)
    labels = list(REFERENCES.values())
    assert len(set(labels)) == len(labels) and not set(labels) & set(PHASES)
    assert REFERENCES["perseus"] == REFERENCE == "max-clocks-interleaved"  # older records' label
