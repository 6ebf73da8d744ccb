"""The core library on its own: a frontier from a profile, without the server.

Run from the repository root: ``python examples/core_api.py``. This is the README's "Python API"
example, verbatim (tests/test_examples.py keeps them equal); docs/solver.md explains each call.
"""

import perseus

profile = perseus.load_profile("profiles/gpt3-175b_a100-sxm_8stage.csv")
schedule = perseus.one_f_one_b(8, 12)  # 8 stages, 12 microbatches
frontier = perseus.solve_frontier(profile, schedule, blocking_power=83.64)  # A100 SXM, watts
t0, e0 = frontier.max_frequency_time, frontier.max_frequency_energy  # everything at max clocks

fastest = frontier.points[0]  # the zero-slowdown plan
print(f"T0 {t0:.4f} s, {e0:.0f} J -> fastest plan {fastest.time:.4f} s, {fastest.energy:.0f} J")
i = frontier.index_for_deadline(1.1 * t0)  # the least-energy plan within 10 % of T0
print(frontier.points[i], frontier.plan_steps(i)[0][:2])  # its (T, E, bound), rank 0's first steps
