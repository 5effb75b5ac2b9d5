"""The benchmark suite (``python -m specviz bench``): acceptance and measured speedup per drafter, chain vs tree,
against plain decoding of the same target and against Hugging Face assisted generation, on Spec-Bench prompts.

Modules, one job each: ``prompts`` (Spec-Bench files), ``configs`` (the table's rows), ``runners`` (one timed run),
``suite`` (the interleaved schedule), ``summary`` (statistics), ``report`` / ``charts`` (outputs), ``machine``.
"""

from specviz.bench.command import add_parser, run

__all__ = ["add_parser", "run"]
