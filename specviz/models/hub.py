"""Hugging Face hub ids: load with from_pretrained, but fail in one line when the hub cannot be reached."""

from __future__ import annotations

import os
import re
import socket
from urllib.parse import urlparse

from specviz.errors import SpecvizError

#: ``owner/name`` (optionally ``owner/name@revision``), the shape of a hub repository id.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


def looks_like_hub_id(spec: str) -> bool:
    """True for ``owner/name`` strings that are not existing local paths."""
    return bool(HUB_ID.match(spec)) and not spec.startswith((".", "/", "~"))


def hub_offline() -> bool:
    """Whether the user switched the hub off (read from the environment each call, so tests can toggle it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


#: Proxy settings under which the hub may be reachable although its host name does not resolve here.
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def hub_unreachable() -> bool:
    """Whether the hub's host name does not resolve and no proxy is set (a machine without network): hub calls then
    read the local cache at once instead of retrying the connection for half a minute."""
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return True
    return False


def local_only() -> bool:
    """Whether hub calls must use the local cache only: the hub is switched off or cannot be reached."""
    return hub_offline() or hub_unreachable()


def split_revision(spec: str) -> tuple[str, str | None]:
    """``owner/name@rev`` → (``owner/name``, ``rev``)."""
    repo, _, revision = spec.partition("@")
    return repo, revision or None


def check_fetchable(spec: str) -> None:
    """Refuse at once, before any model loads, a hub id that can only come from the local cache and is not in it."""
    if not local_only():
        return
    from huggingface_hub import try_to_load_from_cache

    repo, revision = split_revision(spec)
    try:
        cached = try_to_load_from_cache(repo, "config.json", revision=revision)
    except Exception as error:  # noqa: BLE001 - a malformed id or revision; hub_error words it
        raise hub_error(spec, error) from None
    if not isinstance(cached, str):
        raise hub_error(spec, FileNotFoundError("not in the local cache"))


def hub_error(spec: str, error: Exception) -> SpecvizError:
    """Turn a hub/download failure into a one-line error that says what to do."""
    if hub_offline():
        return SpecvizError(f"{spec!r} is not a local path, and as a Hugging Face hub id it cannot be fetched: the hub "
                            f"is offline (HF_HUB_OFFLINE=1) and it is not in the local cache")
    if hub_unreachable():
        return SpecvizError(f"{spec!r} is not a local path, and as a Hugging Face hub id it cannot be fetched: the hub "
                            f"is unreachable from this machine (no network) and it is not in the local cache")
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return SpecvizError(f"{spec!r} is not a local path, and loading it from the Hugging Face hub failed (unreachable, "
                        f"private or missing): {first[:200]}")
