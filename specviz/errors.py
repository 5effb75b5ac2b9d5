"""User-facing errors: one clear line, never a traceback.

Anything the user can get wrong (a setting, a model name, a file) raises ``SpecvizError``; the CLI prints
``str(error)`` on stderr and exits 2, the UI turns it into ``gr.Error``.
"""

import sys
from collections.abc import Callable


class SpecvizError(ValueError):
    """A problem with the user's input or environment, explained in one line."""


class UnsupportedModelError(SpecvizError):
    """The model cannot be used for speculative decoding (for example its cache cannot roll back)."""


def exit_status(command: Callable[[], int]) -> int:
    """Run an entry point's body (``command()`` returns the exit status) the way the CLI treats errors: a
    ``SpecvizError`` prints ``error: <line>`` on stderr and exits 2, an interrupt exits 130."""
    try:
        return command()
    except SpecvizError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
