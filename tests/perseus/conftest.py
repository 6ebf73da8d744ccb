"""The core's tests; ``solver/``, ``kernels/`` and ``power/`` mirror the core's subpackages.

pytest puts this folder on ``sys.path`` when it loads this file, before it collects the
subfolders, so their tests import the helpers beside it: ``lp_reference`` (the independent LP),
``solver_instances`` (shared instances and checks) and the instance builders of
``test_problem_communication``.
"""
