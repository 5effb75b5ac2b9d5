"""What the user allows us to load: the optional allowlist and the trust_remote_code switch.

Both are environment variables so a shared deployment (a Space, a lab server) can lock them down without code.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from specviz.errors import SpecvizError

ALLOWLIST_ENV = "SPECVIZ_MODEL_ALLOWLIST"
TRUST_REMOTE_CODE_ENV = "SPECVIZ_TRUST_REMOTE_CODE"
SERVED_ENV = "SPECVIZ_SERVED_TARGETS"


def trust_remote_code() -> bool:
    """Remote modelling code runs only when ``SPECVIZ_TRUST_REMOTE_CODE=1`` (it is arbitrary code from the hub)."""
    return os.environ.get(TRUST_REMOTE_CODE_ENV, "").strip().lower() in {"1", "true", "yes"}


#: Set by Hugging Face Spaces in every Space's environment.
SPACE_ENV = "SPACE_ID"


def allowlist() -> list[str] | None:
    """The allowlist patterns (names, ids, paths or globs), or None when every model is allowed. On a Hugging Face
    Space without the variable, the registry names only: a public page must not load any hub id or server path a
    visitor types unless the operator says so (``SPECVIZ_MODEL_ALLOWLIST=*`` allows everything)."""
    raw = os.environ.get(ALLOWLIST_ENV, "").strip()
    if not raw:
        if os.environ.get(SPACE_ENV, "").strip():
            from specviz.models.registry import REGISTRY

            return list(REGISTRY)
        return None
    return [item.strip() for item in raw.split(",") if item.strip()]


def served_targets() -> list[str]:
    """The served targets the operator offers in the app (``SPECVIZ_SERVED_TARGETS``: comma-separated
    ``vllm:<base url>[#<model>]``), in order; the app's visitors pick from these and never type a URL. Allowed
    wherever the allowlist applies too."""
    entries = [item.strip() for item in os.environ.get(SERVED_ENV, "").split(",") if item.strip()]
    for entry in entries:
        if not entry.startswith(("vllm:http://", "vllm:https://")):
            raise SpecvizError(f"{SERVED_ENV} lists vllm:<base url>[#<model>] entries, e.g. "
                               f"vllm:http://127.0.0.1:8000; got {entry!r}")
    return entries


def check_allowed(spec: str, *aliases: str) -> None:
    """Raise a one-line error unless ``spec`` (or one of its aliases, such as a registry entry's location) is
    allowlisted, or a served target the operator lists (``served_targets``). Local paths go through
    ``check_allowed_path``."""
    if spec in served_targets():
        return
    _check(spec, [spec, *aliases])


def check_allowed_path(spec: str, path: Path) -> None:
    """A local file or folder is allowed by its resolved path only: the text as typed could climb out of an allowed
    folder with ``..`` or a symbolic link (and a glob's ``*`` matches ``/``)."""
    _check(spec, [str(path.resolve())])


def _check(spec: str, names: list[str]) -> None:
    patterns = allowlist()
    if patterns is None:
        return
    for name in names:
        if name and any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            return
    raise SpecvizError(f"model {spec!r} is not allowed here ({ALLOWLIST_ENV}={','.join(patterns)})")
