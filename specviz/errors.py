"""User-facing errors: one clear line, never a traceback.

Anything the user can get wrong (a setting, a model name, a file) raises ``SpecvizError``; the CLI prints
``str(error)`` on stderr and exits 2, the UI turns it into ``gr.Error``.
"""


class SpecvizError(ValueError):
    """A problem with the user's input or environment, explained in one line."""


class UnsupportedModelError(SpecvizError):
    """The model cannot be used for speculative decoding (for example its cache cannot roll back)."""
