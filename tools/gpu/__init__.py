"""The GPU check (``python tools/gpu/check.py``): ``check`` runs the steps, ``install`` what is missing, ``pytest_runs``
the tests on CUDA, ``near_ties`` the bf16 flips, ``tiny_target`` the dry run's model, ``report`` its two files.
``prepare.sh`` and ``phase.sh`` carry it to a lent machine that reaches no package index (docs/gpu.md)."""
