"""What the user allows us to load: the optional allowlist and the trust_remote_code switch.

Both are environment variables so a shared deployment (a Space, a lab server) can lock them down without code.
"""

from __future__ import annotations

import fnmatch
import os

from specviz.errors import SpecvizError

ALLOWLIST_ENV = "SPECVIZ_MODEL_ALLOWLIST"
TRUST_REMOTE_CODE_ENV = "SPECVIZ_TRUST_REMOTE_CODE"


def trust_remote_code() -> bool:
    """Remote modelling code runs only when ``SPECVIZ_TRUST_REMOTE_CODE=1`` (it is arbitrary code from the hub)."""
    return os.environ.get(TRUST_REMOTE_CODE_ENV, "").strip().lower() in {"1", "true", "yes"}


def allowlist() -> list[str] | None:
    """The allowlist patterns (names, ids, paths or globs), or None when every model is allowed."""
    raw = os.environ.get(ALLOWLIST_ENV, "").strip()
    if not raw:
        return None
    return [item.strip() for item in raw.split(",") if item.strip()]


def check_allowed(spec: str, *aliases: str) -> None:
    """Raise a one-line error unless ``spec`` (or one of its aliases, such as a resolved path) is allowlisted."""
    patterns = allowlist()
    if patterns is None:
        return
    names = [spec, *[alias for alias in aliases if alias]]
    for name in names:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return
    raise SpecvizError(f"model {spec!r} is not allowed here ({ALLOWLIST_ENV}={','.join(patterns)})")
