"""The machine a benchmark ran on: numbers without it cannot be compared or reproduced."""

from __future__ import annotations

import datetime
import os
import platform
import time
from pathlib import Path

import torch


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu() -> str:
    if torch.cuda.is_available():
        return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return "none"


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: a busy machine shows here (another job skews every number)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def busy_cores(seconds: float = 1.0) -> float | None:
    """Cores' worth of CPU time the machine spent busy over the next ``seconds`` while the caller sleeps (Linux's
    /proc/stat): other work running now. The load average would also count the caller's own work of the last
    minutes (a recorder's previous trace). None where /proc/stat cannot be read."""
    def busy_and_total() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)

    try:
        busy0, total0 = busy_and_total()
        time.sleep(seconds)
        busy1, total1 = busy_and_total()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)


def memory_bandwidth_gbs(megabytes: int = 512, repeats: int = 5) -> float:
    """Read bandwidth in GB/s: the best of ``repeats`` sums over a buffer far larger than any cache."""
    buffer = torch.ones(megabytes * (1 << 20) // 4)
    buffer.sum()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    return buffer.numel() * 4 / best / 1e9


def matmul_gflops(size: int = 1024, repeats: int = 5) -> float:
    """Float32 matrix-product throughput in GFLOP/s on this CPU: the best of ``repeats`` square products, a rate that
    the thin products of a forward over a few tokens approach but do not beat."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def describe() -> dict:
    import transformers

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "load_average_start": load_average(),
    }
