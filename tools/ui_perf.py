"""UI performance benchmark (a script, not a timed test): ``python tools/ui_perf.py [--browser]``.

Tokens/s below are the engine's decode-phase rates (new tokens ÷ Σ round wall time, from the rounds' own timings).

1. Tree figure: build time of a 64-node draft tree figure (plotly object, and the JSON ``gr.Plot`` sends).
2. Panels: one streamed update (light) and one with the heavy charts.
3. Streaming cost: the same prompt and settings run headless (the engine thread with nobody watching, in a
   process without a web server) and streamed through the app served in its own process with every panel on
   (``gradio_client`` receives every update; ``--browser`` also drives Chromium, which draws them). Reported:
   the engine's tokens/s in both (streaming can only slow the engine thread through CPU and GIL contention), and
   the end-to-end wall time from Run to the final update against the headless generation time. Model load and
   calibration are excluded by a warm-up run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: this checkout's specviz

from specviz.engine import trace
from specviz.engine.round import Round, TokenChoice
from specviz.errors import SpecvizError, exit_status
from specviz.ui import examples, runner
from specviz.ui.controller import Producer
from specviz.ui.views import plot
from specviz.viz.record import RunRecord
from specviz.viz.tree_figure import tree_figure, tree_spec

ROOT = Path(__file__).resolve().parents[1]  # the repository root, where app.py is served from


def random_round(nodes: int, seed: int) -> Round:
    rnd = random.Random(seed)
    parents = [-1] + [rnd.randrange(-1, i) for i in range(1, nodes)]
    accepted, node = [], -1
    while len(accepted) < 4:
        kids = [i for i, p in enumerate(parents) if p == node]
        if not kids:
            break
        node = kids[0]
        accepted.append(node)
    top = [[TokenChoice(id=t, p=0.1, text=f" tok{t}") for t in range(5)] for _ in range(nodes + 1)]
    return Round(index=0, start=0, tokens=list(range(nodes)), parents=parents, text=[f" tok{i}" for i in range(nodes)],
                 q_draft=[0.5] * nodes, confidence=None, sampled=False, p_target=[0.3] * nodes, target_top=top,
                 draft_top=None, target_entropy=[1.0] * (nodes + 1), accepted=accepted, extra_token=1,
                 extra_text=" x", extra_kind="correction", committed=[*accepted, 1], committed_text=[" a"] * 5,
                 draws=[], residual_top=None, rule="greedy", lossless=True, draft_ms=1, verify_ms=10, other_ms=1)


def time_ms(function, repeats: int) -> tuple[float, float]:
    samples = []
    for i in range(repeats):
        start = time.perf_counter()
        function(i)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), max(samples)


def bench_tree(repeats: int) -> dict:
    rounds = [random_round(64, seed) for seed in range(repeats + 5)]
    for r in rounds[:5]:
        tree_figure(r).to_json()  # warm up plotly's validators
    build = time_ms(lambda i: tree_figure(rounds[i + 5]), repeats)
    with_json = time_ms(lambda i: tree_figure(rounds[i + 5]).to_json(), repeats)
    streamed = time_ms(lambda i: plot(tree_spec(rounds[i + 5])), repeats)
    return {"tree64_build_ms": build, "tree64_build_and_json_ms": with_json, "tree64_streamed_ms": streamed}


def bench_panels(repeats: int) -> dict:
    import gradio as gr

    from specviz.ui.views import RunView

    with gr.Blocks():
        view = RunView.build()
    record = examples.load_trace(examples.DEFAULT_TRACE)

    def serialise(updates: dict) -> None:
        for value in updates.values():
            if hasattr(value, "to_json"):
                value.to_json()

    light = time_ms(lambda i: serialise(view.render(record, status="x", heavy=False)), repeats)
    heavy = time_ms(lambda i: serialise(view.render(record, status="x", heavy=True)), repeats)
    return {"panels_light_ms": light, "panels_heavy_ms": heavy, "panels_rounds": len(record.rounds)}


def headless(request: runner.RunRequest) -> tuple[float, float, int]:
    """(engine decode tokens/s, generation wall s, tokens): the same engine thread the UI uses, nobody watching."""
    record, wall = headless_record(request)
    return record.rate(decode_only=True), wall, record.new_tokens


def headless_record(request: runner.RunRequest) -> tuple[RunRecord, float]:
    """(the run's record, generation wall s): the same engine thread the UI uses, nobody watching."""
    record = RunRecord(header={})
    marks: dict[str, float] = {}

    def events():
        for event in runner.stream(request):
            if isinstance(event, runner.Loaded):
                marks["start"] = time.perf_counter()  # loaded; what follows is the generation
            yield event

    Producer(record, events).thread.join()
    return record, time.perf_counter() - marks.get("start", time.perf_counter())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(port: int, log_path: Path | None = None, timeout: float = 120.0) -> subprocess.Popen:
    """Serve the app in its own process (as ``python app.py`` would) and wait until it accepts connections."""
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}
    code = ("from specviz.ui.app import build_app, launch; "
            f"launch(build_app(), server_name='127.0.0.1', server_port={port}, quiet=True)")
    out = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115 - the child owns it
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the app exited early (code {process.returncode}); see {log_path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return process
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"the app did not start within {timeout:.0f} s")


def _args(request: runner.RunRequest) -> list:
    from specviz.ui import settings

    return settings.values_for(request)


def streamed_record(client, request: runner.RunRequest) -> tuple[RunRecord, float, int]:
    """(the run's record, read back from its trace; Run→final-update wall s; updates received) through
    gradio_client."""
    start = time.perf_counter()
    job = client.submit(*_args(request), api_name="/run")
    outputs = job.result(timeout=600)
    wall = time.perf_counter() - start
    download = outputs[-1]
    path = download if isinstance(download, str) else (download or {}).get("value") or download.get("path")
    return RunRecord.from_trace(trace.read(path)), wall, len(job.outputs())


def streamed_client(client, request: runner.RunRequest) -> tuple[float, float, int, int]:
    """(engine decode tokens/s, Run→final-update wall s, tokens, updates received) through gradio_client."""
    record, wall, updates = streamed_record(client, request)
    return record.rate(decode_only=True), wall, record.new_tokens, updates


def streamed_browser(url: str, request: runner.RunRequest, browser) -> tuple[float, float, int, str]:
    """(engine decode tokens/s, Run→Done wall s, tokens, the speedup panel's text) with Chromium drawing every
    update."""
    page = browser.new_page(viewport={"width": 1400, "height": 1500})
    page.goto(url)
    page.wait_for_selector("#status", timeout=60_000)
    page.wait_for_function("document.querySelector('#status').innerText.includes('recorded example')",
                           timeout=60_000)
    page.fill("#prompt textarea", request.prompt)
    page.fill("#drafter input", request.drafter)  # the request's, not the page's default
    page.press("#drafter input", "Enter")
    page.locator("#shape").get_by_text("tree" if request.tree else "chain", exact=True).click()
    if not page.locator("#max-new-tokens").is_visible():  # under the Playground's "Advanced", closed at first
        page.locator("#advanced").get_by_text("Advanced", exact=True).first.click()
    page.fill("#max-new-tokens input[type=number]", str(request.max_new_tokens))
    page.press("#max-new-tokens input[type=number]", "Tab")
    start = time.perf_counter()
    page.click("#run")
    status = "document.querySelector('#status .sv-status').innerText.trim()"
    page.wait_for_function(f"{status}.startsWith('Generating')", timeout=600_000)  # not the last run's "Done"
    page.wait_for_function(f"{status}.startsWith('Done')", timeout=600_000)
    wall = time.perf_counter() - start
    text = page.inner_text("#speedup")
    page.close()
    tps = float(text.split("\n")[0])  # first card: speculative decode tokens/s (engine clock)
    return tps, wall, request.max_new_tokens, text


def launch_chromium():
    """(Playwright, Debian's headless Chromium): stop the first once the second is closed."""
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    return playwright, playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                  args=["--headless", "--no-sandbox", "--disable-gpu"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/ui_perf.py", description=__doc__.splitlines()[0])
    parser.add_argument("--category", default="summarization", help="Spec-Bench example prompt category")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="alternating headless/streamed runs")
    parser.add_argument("--tree", action="store_true", help="tree drafts instead of a chain")
    parser.add_argument("--browser", action="store_true", help="also drive /usr/bin/chromium via Playwright")
    parser.add_argument("--json", type=Path, help="write the numbers here too")
    args = parser.parse_args(argv)

    return exit_status(lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    """Time one example prompt headless, streamed through the app's client and (``--browser``) in Chromium; print
    and write the figures."""
    prompt = next((p["turns"][0] for p in examples.prompts() if p["category"] == args.category), None)
    if prompt is None:  # checked before the minutes of measuring
        known = ", ".join(sorted({p["category"] for p in examples.prompts()}))
        raise SpecvizError(f"--category {args.category!r} has no example prompt; give one of {known}")
    results: dict = {"threads": os.environ.get("OMP_NUM_THREADS", "default")}
    results.update(bench_tree(50))
    results.update(bench_panels(20))
    request = runner.RunRequest(prompt=prompt, chat=True, tree=args.tree, max_new_tokens=args.max_new_tokens)
    request = request.validate()

    import gradio_client

    port = free_port()
    server = serve(port)
    url = f"http://127.0.0.1:{port}/"
    client = gradio_client.Client(url, verbose=False)
    headless(request)  # warm-up both processes: load the model, calibrate, fill caches
    streamed_client(client, request)
    browser = None
    if args.browser:
        playwright, browser = launch_chromium()
    rows: dict[str, list] = {"headless": [], "client": [], "browser": []}
    for _ in range(args.repeats):
        rows["headless"].append(headless(request))
        rows["client"].append(streamed_client(client, request))
        if browser is not None:
            rows["browser"].append(streamed_browser(url, request, browser))
    if browser is not None:
        browser.close()
        playwright.stop()
    server.terminate()
    server.wait(10)

    def med(name: str, column: int) -> float:
        return statistics.median(row[column] for row in rows[name])

    results["headless_engine_tokens_per_s"] = med("headless", 0)
    results["headless_generation_wall_s"] = med("headless", 1)
    results["streamed_engine_tokens_per_s"] = med("client", 0)
    results["streamed_run_to_final_update_s"] = med("client", 1)
    results["streamed_updates_per_run"] = med("client", 3)
    results["engine_ratio_streamed_over_headless"] = med("client", 0) / med("headless", 0)
    results["end_to_end_ratio"] = med("headless", 1) / med("client", 1)
    if rows["browser"]:
        results["browser_engine_tokens_per_s"] = med("browser", 0)
        results["browser_run_to_done_s"] = med("browser", 1)
        results["browser_engine_ratio"] = med("browser", 0) / med("headless", 0)
        results["browser_end_to_end_ratio"] = med("headless", 1) / med("browser", 1)
    results["runs"] = rows
    results["settings"] = {"category": args.category, "max_new_tokens": args.max_new_tokens, "tree": args.tree,
                           "drafter": request.drafter, "target": request.target, "repeats": args.repeats}

    print(f"tree figure, 64 nodes: go.Figure build {results['tree64_build_ms'][0]:.1f} ms median "
          f"(max {results['tree64_build_ms'][1]:.1f}); + to_json {results['tree64_build_and_json_ms'][0]:.1f} ms; "
          f"streamed path (spec + json) {results['tree64_streamed_ms'][0]:.1f} ms")
    print(f"panels per update ({results['panels_rounds']} rounds): light {results['panels_light_ms'][0]:.1f} ms, "
          f"with charts {results['panels_heavy_ms'][0]:.1f} ms")
    print(f"headless: {results['headless_engine_tokens_per_s']:.2f} tok/s, generation "
          f"{results['headless_generation_wall_s']:.2f} s")
    print(f"streamed (gradio_client, {results['streamed_updates_per_run']:.0f} updates): engine "
          f"{results['streamed_engine_tokens_per_s']:.2f} tok/s = {results['engine_ratio_streamed_over_headless']:.1%}"
          f" of headless; Run→final update {results['streamed_run_to_final_update_s']:.2f} s "
          f"(end-to-end {results['end_to_end_ratio']:.1%})")
    if rows["browser"]:
        print(f"streamed (Chromium drawing): engine {results['browser_engine_tokens_per_s']:.2f} tok/s = "
              f"{results['browser_engine_ratio']:.1%} of headless; Run→Done {results['browser_run_to_done_s']:.2f} s "
              f"(end-to-end {results['browser_end_to_end_ratio']:.1%})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
