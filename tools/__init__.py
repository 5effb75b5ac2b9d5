"""Development tooling, kept out of the ``specviz`` package: it measures and checks the project from a checkout.

Run from the repository root, as a file or a module (``python tools/ui_perf.py`` or ``python -m tools.ui_perf``):

- ``gpu/``: the GPU check a session runs when it is lent a GPU (``gpu/check.py``; docs/gpu.md).
- ``draft_forward``: one draft step through transformers' forward vs the lean forward.
- ``exactness``: does the fast target path decode exactly what transformers' ``generate`` decodes?
- ``ui_perf``: the UI's streaming cost (BENCHMARKS.md).
- ``live_speedup``: the page's live speedup against the bench's figure for the same request (BENCHMARKS.md).

The product's own benchmark, ``specviz bench``, stays in the package: it is what a user runs on their machine.
"""
