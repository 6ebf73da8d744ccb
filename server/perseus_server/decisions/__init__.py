"""Pure decisions, with no I/O and no state of the server's.

Which frontier point each pipeline runs (the planner), who straggles and which stage is slow (the
detectors), and online profiling's scan over clocks with its fits and re-measurements. They import
only the core and the domain, so each is unit-tested on plain values.
"""
