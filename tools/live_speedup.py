"""The page's live speedup against the bench's figure for the same request: ``python tools/live_speedup.py``.

The page times plain decoding between its run's rounds (``engine.baseline``) and states an interval around its
speedup; ``specviz bench`` times whole speculative runs between whole plain runs of the same prompt
(``bench.runners.run_specviz``). This runs one request the page's way and then the bench's way, right after it,
``--repeats`` times: the page's way in this process with nobody watching, and with ``--served`` also through the app
served in its own process (every panel streamed to ``gradio_client``; ``--browser``: to Chromium, which draws them).
It prints each speedup, its interval and whether the interval holds the bench's figure. Two wall-clock figures on a
shared machine are a benchmark, not a test: this is where they are compared (BENCHMARKS.md quotes it). Every process
runs with ``OMP_NUM_THREADS`` torch threads (the app's own setting): set it to compare like with like.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout's specviz

from specviz import api
from specviz.bench.runners import RunResult, run_specviz
from specviz.drafters import registry
from specviz.engine import metrics
from specviz.errors import SpecvizError, exit_status
from specviz.ui import runner
from tools import ui_perf

DEFAULT_PROMPT = "Name three colours of the rainbow."
#: the page's speedup panel: ×speedup (×low–×high)
STATED = re.compile(r"×([\d.]+) \(×([\d.]+)–×([\d.]+)\)")


def bench_speedup(request: runner.RunRequest, repeats: int = 3) -> tuple[float, float]:
    """The bench's figure: the median over ``repeats`` of a speculative run's tokens/s over the mean of the whole plain
    runs either side (wall clock, prefill included on both sides); and the same runs' decode phase alone (tokens over
    their rounds' time, as the page counts), which tells the two definitions apart from the two conditions."""
    target, _, _ = runner.load_target(request.target)
    drafter = api.make_drafter(request.drafter, target, request.values())
    ids = target.encode_prompt(request.prompt, chat=request.chat)
    config, budget = request.config(), request.budget()
    run_specviz(target, ids, config, drafter, budget)  # warm-up, as the bench's
    wall, decode = [], []
    for _ in range(repeats):
        before = run_specviz(target, ids, config)
        speculative = run_specviz(target, ids, config, drafter, budget)
        after = run_specviz(target, ids, config)
        wall.append(metrics.speedup(speculative.tokens_per_s, statistics.mean([before.tokens_per_s,
                                                                              after.tokens_per_s])))
        decode.append(metrics.speedup(_decode_rate(speculative), statistics.mean([_decode_rate(before),
                                                                                  _decode_rate(after)])))
    return statistics.median(wall), statistics.median(decode)


def _decode_rate(run: RunResult) -> float:
    return run.new_tokens / sum(r.total_ms for r in run.rounds) * 1e3


def stated(text: str) -> tuple[float, float, float]:
    """(speedup, low, high) from the page's speedup text (``RunRecord.speedup_text``, or the panel Chromium shows)."""
    found = STATED.search(text)
    if found is None:
        raise SpecvizError(f"the run states no interval: {text!r}")
    return tuple(float(value) for value in found.groups())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/live_speedup.py", description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--drafter", default=None, help="the page's (the target's default drafter) unless given")
    parser.add_argument("--repeats", type=int, default=3, help="page runs, each followed by the bench's figure")
    parser.add_argument("--served", action="store_true", help="also through the app served in its own process")
    parser.add_argument("--browser", action="store_true", help="and drawn by /usr/bin/chromium (implies --served)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    return exit_status(lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise SpecvizError("--repeats must be 1 or more")
    fields = {"prompt": args.prompt, "max_new_tokens": args.max_new_tokens}
    drafter = args.drafter or registry.default_for(runner.RunRequest(**fields).target)  # what the page opens on
    request = runner.RunRequest(**fields, drafter=drafter).validate()
    ways = ["headless"] + (["served"] if args.served or args.browser else []) + (["browser"] if args.browser else [])
    server = client = playwright = browser = None
    if "served" in ways:
        import gradio_client

        port = ui_perf.free_port()
        server = ui_perf.serve(port)
        url = f"http://127.0.0.1:{port}/"
        client = gradio_client.Client(url, verbose=False)
        ui_perf.streamed_record(client, request)  # warm-up: the server loads the model
    if args.browser:
        playwright, browser = ui_perf.launch_chromium()
    rows: list[dict] = []
    try:
        ui_perf.headless_record(request)  # warm-up: load, calibrate
        for repeat in range(args.repeats):
            for way in ways:
                if way == "headless":
                    speedup, low, high = stated(ui_perf.headless_record(request)[0].speedup_text())
                elif way == "served":
                    speedup, low, high = stated(ui_perf.streamed_record(client, request)[0].speedup_text())
                else:
                    speedup, low, high = stated(ui_perf.streamed_browser(url, request, browser)[3])
                bench, decode = bench_speedup(request)
                inside = low - 0.005 <= bench <= high + 0.005  # the page rounds to two decimals
                rows.append({"repeat": repeat, "way": way, "speedup": speedup, "low": low, "high": high,
                             "bench": bench, "bench_decode": decode, "inside": inside})
                print(f"{way:>8}: page ×{speedup:.2f} (×{low:.2f}–×{high:.2f}), the bench's ×{bench:.2f}"
                      f"{'' if inside else ' OUTSIDE'} (its decode phase alone ×{decode:.2f})", flush=True)
    finally:
        if browser is not None:
            browser.close()
            playwright.stop()
        if server is not None:
            server.terminate()
            server.wait(10)
    for way in ways:
        mine = [row for row in rows if row["way"] == way]
        print(f"{way}: the interval held the bench's figure in {sum(r['inside'] for r in mine)} of {len(mine)} runs; "
              f"median page/bench {statistics.median(r['speedup'] / r['bench'] for r in mine):.3f}, page/bench's "
              f"decode phase {statistics.median(r['speedup'] / r['bench_decode'] for r in mine):.3f}")
    if args.json:
        settings = {**fields, "drafter": request.drafter, "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
        args.json.write_text(json.dumps({"settings": settings, "runs": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
