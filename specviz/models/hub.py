"""Hugging Face hub ids: load with from_pretrained, but fail in one line when the hub cannot be reached."""

from __future__ import annotations

import os
import re
import socket
import time
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


#: Proxy settings: a hub request first connects to the proxy, which may reach the hub although its name does not
#: resolve here.
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
#: Seconds a TCP connection to the hub (or to its proxy) may take before the hub counts as unreachable.
CONNECT_TIMEOUT_S = 2.0
#: Seconds a reachability answer is kept: every hub-id check asks, and the network rarely changes within a minute.
ANSWER_KEPT_S = 60.0
_ANSWERS: dict[tuple[str, int], tuple[float, bool]] = {}


def _first_hop() -> tuple[str, int]:
    """Where a hub request first connects: the proxy when one is set, else the hub's own host."""
    proxy = next((os.environ[name] for name in PROXY_VARIABLES if os.environ.get(name)), "")
    url = urlparse(proxy if "://" in proxy else f"http://{proxy}") if proxy else \
        urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    default_port = {"https": 443, "http": 80}.get(url.scheme, 1080)  # 1080: a SOCKS proxy
    return url.hostname or "huggingface.co", url.port or default_port


def hub_unreachable() -> bool:
    """Whether hub requests cannot even connect (the hub's host, or the proxy's, does not resolve, refuses or does
    not answer within ``CONNECT_TIMEOUT_S``): hub calls then read the local cache at once instead of retrying the
    connection for half a minute."""
    hop, now = _first_hop(), time.monotonic()
    kept = _ANSWERS.get(hop)
    if kept is not None and now - kept[0] < ANSWER_KEPT_S:
        return kept[1]
    try:
        socket.create_connection(hop, timeout=CONNECT_TIMEOUT_S).close()
        unreachable = False
    except OSError:
        unreachable = True
    _ANSWERS[hop] = (now, unreachable)
    return unreachable


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
                            f"is unreachable from this machine (no network, or a proxy that does not answer) and it "
                            f"is not in the local cache")
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return SpecvizError(f"{spec!r} is not a local path, and loading it from the Hugging Face hub failed (unreachable, "
                        f"private or missing): {first[:200]}")
