"""specviz: see speculative decoding happen, round by round, on real models."""

__version__ = "0.1.0"
