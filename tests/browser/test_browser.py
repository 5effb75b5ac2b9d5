"""A real browser (Debian's Chromium via Playwright) against the app served on localhost with the real default target.

Covers: a streamed run (tree nodes, coloured tokens, speedup while rounds arrive), Step, Stop mid-run, an XSS prompt
that must render as text, errors shown in the page (bad settings, unknown model, malformed trace), Chain vs Tree,
the rejection debugger, trace upload + replay, and two browser sessions generating at once. Screenshots go to
``test-artifacts/browser/``; with ``SPECVIZ_UPDATE_DOCS=1`` the per-tab ones are also written to ``docs/screenshots/``.

Skips (with the reason) when /usr/bin/chromium or the playwright package is missing.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
DOCS = ROOT / "docs" / "screenshots"
IMG = ROOT / "docs" / "img"  # the first screen at a projector's and a phone's size
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
XSS = "<img src=x onerror=alert(1)>"
LONG = 180_000  # ms; the first run loads the model
RAINBOW = "Name three colours of the rainbow."
SOLO_TOKENS = 64  # the solo run: enough rounds (and plain rounds between them) for an interval steady under the
# suite's other worker (fewer rounds since the lookup chains fill the node budget: 32 tokens timed 9 plain steps)
#: True while a live run is mid-stream: status counts n rounds (2 ≤ n), the round picker shows the newest of those
#: n, the tree has nodes, the text has generated tokens coloured by provenance, and a speedup is measured.
STREAMING = """() => {
  const status = document.querySelector('#status .sv-status').innerText;
  const m = status.match(/(\\d+) rounds/);
  if (!status.startsWith('Generating') || !m || +m[1] < 2) return false;
  const n = +m[1];
  return document.querySelector('#round-info').innerText.includes(`of ${n}`)
    && document.querySelectorAll('#tree-plot .scatterlayer .point').length > 1
    && document.querySelectorAll('#tokens .sv-stream [data-round]').length >= n
    && document.querySelector('#speedup').innerText.includes('×');
}"""

#: True while the text panel overflows its box and is scrolled to its end (the newest tokens in view).
FOLLOWING = """() => {
  const box = document.querySelector('#tokens .sv-stream');
  return document.querySelector('#status .sv-status').innerText.startsWith('Generating')
    && box.scrollHeight > box.clientHeight + 50 && box.scrollTop + box.clientHeight >= box.scrollHeight - 30;
}"""

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="the playwright package is missing (pip install playwright)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """The app in its own process, as ``python app.py`` would serve it, on a free port."""
    port = _free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    code = ("from specviz.ui.app import build_app, launch; "
            f"launch(build_app(), server_name='127.0.0.1', server_port={port}, quiet=True)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = open(ARTIFACTS / "server.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while time.time() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the app exited early; see {ARTIFACTS / 'server.log'}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.5)
    else:
        process.kill()
        pytest.fail("the app did not start within 120 s")
    yield url
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()


def _server_log() -> str:
    return (ARTIFACTS / "server.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


#: the Playground's radios that sit under its "Advanced" accordion
ADVANCED_RADIOS = {"mode"}

class Page:
    """A browser tab on the app, recording dialogs (none may fire) and page errors."""

    def __init__(self, browser, url: str, width: int = 1400, height: int = 1500):
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.page.on("dialog", self._dialog)
        self.page.goto(url)
        self.page.wait_for_selector("#tree-plot .js-plotly-plot", timeout=60_000)
        self.page.wait_for_function(
            "(e => e && e.innerText.includes('recorded example'))(document.querySelector('#status .sv-status'))",
            timeout=30_000)

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def tab(self, name: str) -> None:
        self.page.get_by_role("tab", name=name).click()
        time.sleep(0.5)

    def advanced(self) -> None:
        """Open the Playground's "Advanced" accordion (closed on the first screen) if it is closed."""
        if not self.page.locator("#target").is_visible():
            self.page.locator("#advanced").get_by_text("Advanced", exact=True).first.click()
            self.page.locator("#target").wait_for(state="visible", timeout=10_000)

    def fill(self, elem_id: str, value: str) -> None:
        """Set a textbox, number or custom dropdown value and commit it (Enter for dropdowns, blur otherwise)."""
        selector = {"prompt": "#prompt textarea", "target": "#target input", "drafter": "#drafter input"}.get(
            elem_id, f"#{elem_id} input[type=number]")
        if elem_id not in {"prompt", "drafter", "k", "max-nodes", "temperature"}:  # under Advanced
            self.advanced()
        self.page.fill(selector, value)
        self.page.press(selector, "Enter" if elem_id in {"target", "drafter"} else "Tab")

    def choose(self, elem_id: str, label: str) -> None:
        if elem_id in ADVANCED_RADIOS:  # the Playground's, under Advanced (other tabs' radios are always shown)
            self.advanced()
        self.page.locator(f"#{elem_id}").get_by_text(label, exact=True).click()

    def status(self, elem_id: str = "status") -> str:
        """The status line's own text (not Gradio's status-tracker overlay, which can add "Error")."""
        return self.page.inner_text(f"#{elem_id} .sv-status")

    def wait_status(self, prefix: str, elem_id: str = "status", timeout: int = LONG) -> None:
        self.page.wait_for_function(
            f"(e => e && e.innerText.trim().startsWith({prefix!r}))(document.querySelector('#{elem_id} .sv-status'))",
            timeout=timeout)

    def toast(self, text: str, timeout: int = 60_000) -> str:
        locator = self.page.locator(".toast-body", has_text=text).first
        locator.wait_for(timeout=timeout)
        return locator.inner_text()

    def clear_toasts(self) -> None:
        """Close every toast (they would cover later screenshots)."""
        for _ in range(10):
            close = self.page.locator(".toast-close:visible, .toast-wrap button[aria-label*='lose']:visible")
            if close.count() == 0:
                return
            try:  # a toast can time out and vanish between count() and click()
                close.first.click(timeout=2_000)
            except sync_api.TimeoutError:
                pass
            time.sleep(0.2)

    def points(self, elem_id: str) -> int:
        return self.page.locator(f"#{elem_id} .scatterlayer .point").count()

    def shot(self, name: str, docs: bool = False, full_page: bool = True) -> None:
        """Screenshot to test-artifacts/browser/ (and, for the docs' ones, without toasts left by earlier steps)."""
        if docs:
            self.clear_toasts()
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        if docs and os.environ.get("SPECVIZ_UPDATE_DOCS"):
            _save_small(path, DOCS / f"{name}.png")

    def close(self) -> None:
        self.context.close()


def _save_small(source: Path, target: Path) -> None:
    """Palette PNG (≈4× smaller than the screenshot) for committing under docs/."""
    from PIL import Image

    target.parent.mkdir(parents=True, exist_ok=True)
    with Image.open(source) as image:
        image.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(target, optimize=True)


@pytest.fixture(scope="module")
def page(server, browser):
    tab = Page(browser, server)
    yield tab
    tab.close()


def test_live_run_streams_rounds(page):
    page.fill("max-new-tokens", "40")
    page.choose("shape", "tree")
    page.page.click("#run")
    # while rounds stream: the tree has nodes, the text has coloured tokens, the speedup is measured
    # the recorded example is cleared as soon as the run starts
    page.page.wait_for_function("!document.querySelector('#status').innerText.includes('recorded example')")
    assert page.page.locator("#tokens .sv-stream [data-round]").count() == 0
    page.page.wait_for_function(STREAMING, timeout=LONG)
    page.shot("streaming")
    page.wait_status("Done")
    assert page.points("tree-plot") >= 2
    assert "measured speedup" in page.page.inner_text("#speedup")
    assert "τ tokens / round" in page.page.inner_text("#metrics")
    assert page.page.locator("#charts .js-plotly-plot").count() == 1
    # the round picker redraws an earlier round's tree and highlights its tokens
    best, most = 0, -1
    for index in [*range(1, 6), None]:
        index = best if index is None else index
        page.page.fill("#round-slider input[type=number]", str(index))
        page.page.press("#round-slider input[type=number]", "Tab")
        page.page.wait_for_function(
            f"document.querySelector('#round-info').innerText.startsWith('round {index} of')", timeout=30_000)
        time.sleep(0.3)
        if page.points("tree-plot") > most:
            best, most = index, page.points("tree-plot")
    assert page.page.locator(f"#tokens .sv-sel[data-round='{best}']").count() > 0
    # spaces read as spaces; the markers checkbox shows the glyphs in their place, and hides them again
    text = page.page.inner_text("#tokens .sv-stream")
    assert " " in text and "␣" not in text
    page.page.click("#markers input")
    page.page.wait_for_function("document.querySelector('#tokens .sv-stream').innerText.includes('␣')")
    assert "␣" in page.page.inner_text("#tokens .sv-stream")
    page.page.click("#markers input")
    page.page.wait_for_function("!document.querySelector('#tokens .sv-stream').innerText.includes('␣')")
    time.sleep(0.5)
    page.shot("playground", docs=True)


def test_dspark_run_draws_its_block_and_calibration(page):
    """The shipped DSpark drafter sets a confidence: the panel draws the round's block (q, ĉ, survival, the cut)
    and the run's reliability diagram with its ECE."""
    page.fill("drafter", "dspark")
    page.fill("max-new-tokens", "24")
    page.choose("shape", "chain")
    page.fill("k", "7")  # the whole block, for the schedule to weigh (the default shape caps it at depth 2)
    try:
        page.page.click("#run")
        page.page.wait_for_function(  # the previous test's run ended "Done" too: wait for this one to start
            "!document.querySelector('#status .sv-status').innerText.trim().startsWith('Done')", timeout=30_000)
        page.wait_status("Done")
        notes = " ".join(page.page.locator("#confidence .annotation-text").all_text_contents())
        assert "Run calibration: ECE" in notes and "verify ℓ =" in notes, notes
        assert page.points("confidence") >= 3
        page.page.fill("#round-slider input[type=number]", "0")  # the first round drafted a whole block
        page.page.press("#round-slider input[type=number]", "Tab")
        page.page.wait_for_function(
            "document.querySelector('#confidence').textContent.includes('Round 0:')", timeout=30_000)
        shot = ARTIFACTS / "confidence.png"
        page.page.locator("#confidence").screenshot(path=str(shot))
        if os.environ.get("SPECVIZ_UPDATE_DOCS"):
            _save_small(shot, DOCS / "confidence.png")
    finally:  # the next tests expect the default drafter, length and shape
        page.fill("drafter", "ngram")
        page.fill("max-new-tokens", "40")
        page.fill("k", "2")
        page.choose("shape", "tree")


def test_full_plain_run_side_by_side(page):
    page.advanced()
    page.page.click("#measure-plain")
    page.page.wait_for_function(  # the divisor when the run had no plain rounds beside it, else a note
        "(t => t.includes('full run') || t.includes('full plain run'))(document.querySelector('#speedup').innerText)",
        timeout=LONG)
    speedup = page.page.inner_text("#speedup")
    assert "identical to plain greedy decoding" in speedup or "first divergence" in speedup
    page.choose("shape", "chain")


def test_step_then_stop_mid_run(page):
    page.page.click("#step")
    page.wait_status("Step mode: round 0 done")
    page.page.click("#step")
    page.wait_status("Step mode: round 1 done")
    assert page.page.locator("#tokens [data-round='1']").count() > 0
    page.fill("max-new-tokens", "400")
    page.page.click("#run")
    page.page.wait_for_function(
        "(m => m && +m[1] >= 3)(document.querySelector('#status').innerText.match(/(\\d+) rounds/))", timeout=LONG)
    page.page.click("#stop")
    page.wait_status("Stopped by you after", timeout=60_000)
    page.shot("stopped")
    page.fill("max-new-tokens", "24")


def test_run_during_a_run_restarts_it_and_the_text_follows(page):
    """Run mid-run restarts with the panel's current drafter (Gradio's default trigger dropped the click without a
    word), and the text panel keeps the newest tokens in view while the run streams past its height."""
    page.fill("max-new-tokens", "400")
    page.page.click("#run")
    page.page.wait_for_function(
        "(m => m && +m[1] >= 3)(document.querySelector('#status').innerText.match(/Generating.* (\\d+) rounds/))",
        timeout=LONG)
    page.fill("drafter", "ngram:2")
    page.page.click("#run")
    page.page.wait_for_function(
        "document.querySelector('#status .sv-status').innerText.includes('drafter ngram:2')", timeout=60_000)
    page.page.wait_for_function(FOLLOWING, timeout=LONG)
    page.shot("text-follows-the-stream")
    page.page.click("#stop")
    page.wait_status("Stopped by you after", timeout=60_000)
    page.fill("drafter", "ngram")
    page.fill("max-new-tokens", "24")


def test_xss_prompt_renders_as_text(page):
    page.fill("prompt", f"Repeat exactly: {XSS} <script>alert(2)</script>")
    page.choose("mode", "raw")
    page.fill("max-new-tokens", "8")
    page.page.click("#run")
    page.wait_status("Done")
    # this run's tokens, not the stopped run's from the test before (its panel can outlive the status change)
    page.page.wait_for_function(
        "(e => e && e.innerText.replaceAll('\u2423', ' ').includes('Repeat exactly'))"
        "(document.querySelector('#tokens'))",
        timeout=60_000)
    visible = page.page.inner_text("#tokens").replace("␣", " ")
    assert XSS in visible and "<script>alert(2)</script>" in visible
    assert page.page.locator("#tokens img, #tokens script").count() == 0
    assert page.page.evaluate("() => document.querySelectorAll('img[src=\"x\"]').length") == 0
    page.tab("Why was it rejected?")
    page.page.wait_for_function("document.querySelector('#debug-warnings').innerText.includes('live run')",
                                timeout=30_000)
    page.tab("Playground")
    assert page.dialogs == []
    page.choose("mode", "chat")


def test_errors_show_in_the_page(page):
    page.fill("prompt", "   ")
    page.page.click("#run")
    assert "the prompt is empty" in page.toast("the prompt is empty")
    page.fill("prompt", "Write a haiku about the sea.")
    page.fill("drafter", "ngram:x")
    page.page.click("#run")
    page.toast("ngram takes a maximum n-gram size")
    page.fill("drafter", "ngram")
    page.fill("target", "no-such-model")
    page.page.click("#run")
    assert "unknown model 'no-such-model'" in page.toast("unknown model")
    page.wait_status("The run did not start: unknown model 'no-such-model'", timeout=60_000)
    assert page.page.locator("#tokens .sv-stream [data-round]").count() > 0  # the previous run stays on show
    assert "Traceback" not in page.page.inner_text("body")
    page.shot("error-unknown-model")
    page.fill("target", "smollm2-135m")
    page.clear_toasts()
    assert page.page.locator(".toast-body:visible").count() == 0


def test_chain_vs_tree(page):
    from specviz.ui import examples

    page.fill("prompt", examples.prompt_text("243"))  # Spec-Bench summarization: n-gram drafts get accepted
    page.fill("max-new-tokens", "48")
    page.tab("Chain vs Tree")
    page.page.click("#compare-run")
    page.wait_status("Done", elem_id="compare-status")
    assert page.points("compare-chain-tree") >= 2 and page.points("compare-tree-tree") >= 2
    verdict = page.page.inner_text("#compare-verdict")
    assert "Verdict" in verdict and "τ" in verdict and "tokens/s" in verdict
    page.shot("chain-vs-tree", docs=True)


def test_rejection_debugger(page):
    page.tab("Why was it rejected?")
    page.choose("debug-source", "Chain vs Tree: tree")
    page.page.wait_for_function("document.querySelector('#debug-explain').innerText.includes('Why')",
                                timeout=30_000)
    assert page.page.locator("#debug-topk .js-plotly-plot").count() == 1
    assert "target top-k vs draft top-k" in page.page.inner_text("#debug-topk")
    page.shot("why-rejected-greedy")


def test_trace_upload_and_replay(page):
    from specviz.ui import examples

    page.tab("Traces")
    bad = ARTIFACTS / "malformed.jsonl"
    bad.write_text('{"type": "header", "schema": "nope"}\n')
    page.page.set_input_files("#trace-upload input[type=file]", str(bad))
    page.toast("Not a valid specviz trace")
    # a draft-model trace sampled at T > 0 (rejection sampling) when shipped, else an n-gram tree
    sampled = examples.TRACES / "coding-smollm2-135m-draft-tree-sampled.jsonl"
    trace_file = sampled if sampled.is_file() else examples.TRACES / "coding-ngram-tree.jsonl"
    clear = page.page.locator("#trace-upload button[aria-label='Clear']")
    if clear.count():  # the refused file is still shown; clear it to get the file input back
        clear.first.click()
    page.page.set_input_files("#trace-upload input[type=file]", str(trace_file))
    page.page.wait_for_function(
        f"document.querySelector('#replay-status').innerText.includes('replay of {trace_file.name}')",
        timeout=30_000)
    assert page.points("replay-tree-plot") >= 2
    assert page.page.locator("#replay-tokens .sv-stream [data-round]").count() > 0
    assert "×" in page.page.inner_text("#replay-speedup")
    page.shot("traces", docs=True)
    # the debugger explains the replayed trace with no model involved
    page.tab("Why was it rejected?")
    page.choose("debug-source", "Replayed trace (Traces tab)")
    page.page.wait_for_function(
        f"document.querySelector('#debug-warnings').innerText.includes('replay of {trace_file.name}')",
        timeout=30_000)
    if trace_file == sampled:
        explain = page.page.inner_text("#debug-explain")
        assert "rejection sampling" in explain and "min(1, p/q)" in explain
        assert "draft q (top-k)" in page.page.inner_text("#debug-topk")
    page.shot("why-rejected", docs=True)
    page.tab("Traces")
    page.page.click("#replay-play")
    page.page.wait_for_function("document.querySelector('#replay-status').innerText.includes('replay finished')",
                                timeout=60_000)
    page.choose("trace-which", "Chain vs Tree: tree")
    page.page.wait_for_function("!document.querySelector('#trace-download').disabled", timeout=30_000)
    for _ in range(60):  # the button still offers the previous choice's file until the server's answer lands
        with page.page.expect_download() as download:
            page.page.click("#trace-download")
        if download.value.suggested_filename.startswith("specviz-tree-"):
            break
        page.page.wait_for_timeout(500)
    saved = ARTIFACTS / "downloaded-tree.jsonl"
    download.value.save_as(saved)
    from specviz.engine import trace

    downloaded = trace.read(saved)
    assert downloaded.header["budget"]["tree"] is True and downloaded.rounds and downloaded.summary


def test_a_phone_keeps_the_figures_legible(server, browser):
    """At 400 px the multi-panel figures keep a legible width and scroll sideways in their box (squeezed to the
    screen, the confidence panel's titles printed over each other and its left panel shrank to nothing), while the
    page itself never scrolls sideways."""
    phone = Page(browser, server, width=400, height=900)
    try:
        for elem_id in ("charts", "confidence", "theory"):
            phone.page.wait_for_selector(f"#{elem_id} .js-plotly-plot", timeout=30_000)
            box = phone.page.evaluate(
                f"() => [document.querySelector('#{elem_id} .js-plotly-plot').getBoundingClientRect().width, "
                f"document.querySelector('#{elem_id}').getBoundingClientRect().right]")
            assert box[0] >= 700 and box[1] <= 400, (elem_id, box)
        assert phone.page.evaluate("() => document.documentElement.scrollWidth") <= 400
        phone.page.locator("#confidence").scroll_into_view_if_needed()
        phone.shot("phone")
    finally:
        phone.close()


#: The Playground's panels that a recorded run fills with words (none may be empty once a scenario has opened).
FILLED = ("status", "speedup", "round-info", "tokens", "metrics", "theory-note", "warnings", "scenario-note")
#: Every text the figures draw (tick labels, titles, legends, node labels), with its font size in px.
SVG_TEXT = """(ids) => ids.flatMap(id => [...document.querySelectorAll(`#${id} svg text`)]
  .filter(t => t.textContent.trim()).map(t => [id, t.textContent, parseFloat(getComputedStyle(t).fontSize)]))"""
#: A box's [left, top, right, bottom] in the viewport.
BOX = "(sel) => { const b = document.querySelector(sel).getBoundingClientRect(); return [b.left, b.top, b.right, " \
      "b.bottom]; }"


def _round_shown(tab: Page) -> int:
    return int(re.match(r"round (\d+) of", tab.page.inner_text("#round-info")).group(1))


def _contrast(css_color: str) -> float:
    """WCAG contrast ratio of an ``rgb(...)`` text colour on white."""
    def linear(channel: float) -> float:
        channel /= 255
        return channel / 12.92 if channel <= 0.03928 else ((channel + 0.055) / 1.055) ** 2.4
    r, g, b = (float(v) for v in re.findall(r"[\d.]+", css_color)[:3])
    luminance = 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b)
    return 1.05 / (luminance + 0.05)


def test_every_scenario_opens_its_recording(server, browser):
    """Each lesson scenario, picked on the first screen, sets the controls and shows its recorded run with the
    paragraph on what to look for: every panel filled, no error toast, no traceback. ← and → step its rounds from the
    keyboard, but not while typing in a box. Run then runs the picked settings live."""
    from specviz.ui import scenarios
    from specviz.ui import settings as panel

    names = dict((spec, name) for name, spec in panel.drafter_choices("smollm2-135m"))
    tab = Page(browser, server)
    try:
        for scenario in scenarios.SCENARIOS:
            tab.page.click("#scenario input")
            tab.page.get_by_role("option", name=scenario.title, exact=True).click()
            number = scenario.title.split(" ")[0]
            tab.page.wait_for_function(
                f"document.querySelector('#status .sv-status').innerText.startsWith('Scenario {number} ')",
                timeout=30_000)
            tab.page.wait_for_function(
                f"document.querySelector('#scenario-note')?.innerText.includes({scenario.look_for[:50]!r})",
                timeout=30_000)
            time.sleep(1.0)  # the figures redraw after the words
            for elem_id in FILLED:
                text = tab.page.inner_text(f"#{elem_id}").strip()
                assert len(text) > 5 and "Traceback" not in text, (scenario.key, elem_id, text)
            for elem_id in ("tree-plot", "charts", "theory", "confidence"):
                assert tab.page.locator(f"#{elem_id} .js-plotly-plot").count() == 1, (scenario.key, elem_id)
            assert tab.points("tree-plot") >= 2, scenario.key
            assert tab.page.locator("#tokens .sv-stream [data-round]").count() > 0, scenario.key
            assert tab.page.input_value("#drafter input") == names[scenario.drafter], scenario.key
            assert tab.page.locator(".toast-body:visible").count() == 0, scenario.key
            assert "Traceback" not in tab.page.inner_text("body"), scenario.key
            tab.shot(f"scenario-{scenario.key}")
        # the keys step the rounds, outside a text box only
        shown = _round_shown(tab)
        step = "ArrowLeft" if shown > 0 else "ArrowRight"
        tab.page.locator("#header").click()
        tab.page.keyboard.press(step)
        expected = shown - 1 if step == "ArrowLeft" else shown + 1
        tab.page.wait_for_function(
            f"document.querySelector('#round-info').innerText.startsWith('round {expected} of')", timeout=30_000)
        tab.page.locator("#prompt textarea").click()
        tab.page.keyboard.press("ArrowRight")
        time.sleep(1.0)
        assert _round_shown(tab) == expected
        # Run runs the picked scenario live, with its settings
        first = scenarios.SCENARIOS[0]
        tab.page.click("#scenario input")
        tab.page.get_by_role("option", name=first.title, exact=True).click()
        tab.page.wait_for_function(
            "document.querySelector('#status .sv-status').innerText.startsWith('Scenario 1 ')", timeout=30_000)
        tab.page.click("#run")
        tab.wait_status("Done")
        status = tab.status()
        request = first.request()
        assert f"drafter {first.drafter} · chain k={request.k}" in status and "greedy" in status, status
        assert f"{request.max_new_tokens} tokens" in status or "end of sequence" in status, status
        assert tab.page.locator(".toast-body:visible").count() == 0
    finally:
        tab.close()


@pytest.mark.parametrize("width,height", [(1280, 720), (390, 844)])
def test_the_first_screen_is_legible_on_a_projector_and_a_phone(server, browser, width, height):
    """At 1280×720 (a projector) and 390×844 (a phone): body text of 16 px, info lines and every figure's text of at
    least 14 px, info lines dark enough to read (4.5:1 on white), the tree's title whole and below gr.Plot's label,
    no sideways scroll. The first screen's screenshot goes to docs/img/ with SPECVIZ_UPDATE_DOCS=1."""
    tab = Page(browser, server, width=width, height=height)
    try:
        tab.clear_toasts()
        tab.shot(f"first-screen-{width}x{height}", full_page=False)
        if os.environ.get("SPECVIZ_UPDATE_DOCS"):
            _save_small(ARTIFACTS / f"first-screen-{width}x{height}.png", IMG / f"first-screen-{width}x{height}.png")
        for selector in ("#header p", "#prompt textarea", "#status .sv-status", "#drafter input"):
            size = tab.page.eval_on_selector(selector, "e => parseFloat(getComputedStyle(e).fontSize)")
            assert size >= 16, (selector, size)
        info = tab.page.eval_on_selector("#example .info-text", "e => [parseFloat(getComputedStyle(e).fontSize), "
                                         "getComputedStyle(e).color]")
        assert info[0] >= 14 and _contrast(info[1]) >= 4.5, info
        for elem_id in ("charts", "theory", "confidence"):
            tab.page.wait_for_selector(f"#{elem_id} .js-plotly-plot", timeout=30_000)
        texts = tab.page.evaluate(SVG_TEXT, ["tree-plot", "charts", "theory", "confidence"])
        assert len(texts) > 50 and min(size for _, _, size in texts) >= 14, [t for t in texts if t[2] < 14][:5]
        title = tab.page.evaluate(BOX, "#tree-plot .gtitle")
        label = tab.page.evaluate(BOX, "#tree-plot label")
        figure = tab.page.evaluate(BOX, "#tree-plot .js-plotly-plot")
        assert title[1] >= label[3] - 1 and title[2] <= figure[2] and title[0] >= figure[0], (title, label, figure)
        assert tab.page.evaluate("() => document.documentElement.scrollWidth") <= width
    finally:
        tab.close()


def test_two_sessions_generate_at_once(server, browser):
    """Two visitors' runs at once each see their own prompt and say they shared the machine; a visitor who closes
    their tab mid-run leaves nothing running, so a run after it says nothing of sharing and states its speedup with an
    interval."""
    first, second = Page(browser, server), Page(browser, server)
    try:
        for tab, prompt in ((first, RAINBOW), (second, "Count from one to five.")):
            tab.fill("prompt", prompt)
            tab.fill("max-new-tokens", "32")  # long enough that the two runs overlap
        first.page.click("#run")
        second.page.click("#run")
        for tab in (first, second):
            tab.wait_status("Done")
        one, two = first.page.inner_text("#tokens"), second.page.inner_text("#tokens")
        assert "rainbow" in one and "rainbow" not in two
        assert "Count" in two and "Count" not in one
        # each measured its own plain baseline between its own rounds, and says the machine was shared; neither
        # states a speedup beyond what its tau allows
        for tab in (first, second):
            shown = tab.page.inner_text("#speedup")
            assert "2 runs shared the machine" in shown and "beyond what τ allows" not in shown, shown
        # a visitor who leaves mid-run: the server stops their run at once (``demo.unload``), so it shares nothing
        # with the run below
        leaving = Page(browser, server)
        leaving.fill("max-new-tokens", "400")
        stopped = _server_log().count("run stopped after")
        leaving.page.click("#run")
        leaving.wait_status("Generating")
        leaving.close()
        # the server logs the stop once the run's thread let go of the machine (``controller.Producer``)
        deadline = time.time() + 60
        while _server_log().count("run stopped after") == stopped and time.time() < deadline:
            time.sleep(0.2)
        ended = [line for line in _server_log().splitlines() if "run stopped after" in line][stopped:]
        assert ended and ended[0].endswith("runs on the machine now: 0"), ended
        # then one alone: it measures its own baseline and says nothing of sharing; it states its speedup with an
        # interval (how well that interval holds the bench's figure is a benchmark: tools/live_speedup.py)
        first.fill("max-new-tokens", str(SOLO_TOKENS))
        first.page.click("#run")
        first.wait_status("Generating")  # the earlier run's "Done" must not count
        first.wait_status("Done")
        shown = first.page.inner_text("#speedup")
        stated = re.search(r"×([\d.]+) \(×([\d.]+)–×([\d.]+)\)", shown)
        assert "shared the machine" not in shown and "beyond what τ allows" not in shown and stated, shown
        assert 0 < float(stated[2]) < float(stated[3]), shown
    finally:
        first.close()
        second.close()


#: The Lesson tab at one step, in one round trip to the browser: each panel's text, whether the figure is drawn,
#: the toasts on show and the step's heading.
LESSON_STATE = """() => ({
  panels: ['lesson-header', 'lesson-text', 'lesson-formula'].map(id => document.getElementById(id).innerText.trim()),
  figure: document.querySelectorAll('#lesson-figure .js-plotly-plot').length,
  toasts: [...document.querySelectorAll('.toast-body')].filter(e => e.offsetParent !== null).map(e => e.innerText),
  title: document.querySelector('#lesson-text .sv-subhead')?.innerText || '',
})"""


def _lesson_walk(tab: Page, steps: int, name: str, to_totals: bool = True) -> None:
    """Press Next through ``steps`` steps from the one shown, checking at each that every panel holds text, the
    figure is drawn, no toast or traceback showed, and Next moved on (the step's heading changed); ``to_totals``:
    the last of them is the run's totals, where Next stays."""
    for step in range(steps):
        state = tab.page.evaluate(LESSON_STATE)
        for text in state["panels"]:
            assert len(text) > 20 and "Traceback" not in text, (name, step, state)
        assert state["figure"] == 1 and not state["toasts"], (name, step, state)
        if step + 1 < steps:
            tab.page.click("#lesson-next")
            try:
                tab.page.wait_for_function(
                    f"() => (document.querySelector('#lesson-text .sv-subhead')?.innerText || '') !== "
                    f"{state['title']!r}", timeout=30_000)
            except sync_api.TimeoutError:
                tab.shot(f"lesson-stuck-{step}")
                pytest.fail(f"{name}: Next did not move on from step {step} ({state['title']!r}); the page shows "
                            f"{tab.page.inner_text('#lesson-text')[:300]!r}")
    if not to_totals:
        return
    assert "The run's totals" in tab.page.inner_text("#lesson-text"), name
    tab.page.click("#lesson-next")  # past the end: it stays on the totals
    time.sleep(0.5)
    assert "The run's totals" in tab.page.inner_text("#lesson-text"), name
    assert "Traceback" not in tab.page.inner_text("body")


def _lesson_source(tab: Page, label: str) -> None:
    tab.page.click("#lesson-source input")
    tab.page.get_by_role("option", name=label, exact=True).first.click()


def test_lesson_walks_a_recorded_trace_and_a_live_run(server, browser):
    """The Lesson tab walks every step of a recorded trace (a sampled tree: rejection sampling, the residual), then
    every step of a short live run of the embedded default, with no error toast, no traceback, no empty panel; the
    glossary opens with one click and the jump control lands on a round."""
    from specviz.ui import examples

    name = "coding-smollm2-135m-draft-tree-sampled.jsonl"
    tab = Page(browser, server)
    try:
        tab.tab("Lesson")
        tab.page.wait_for_function("document.querySelector('#lesson-text').innerText.includes('step 1 of 6')",
                                   timeout=30_000)
        label = dict((value, text) for text, value in examples.trace_choices())[name]
        _lesson_source(tab, label)
        tab.page.wait_for_function(
            f"document.querySelector('#lesson-header').innerText.includes('replay of {name}')", timeout=30_000)
        # the first two rounds step by step, then the round slider to the last round and on to the totals (every
        # step of every round renders in tests/test_lesson.py, without a browser)
        rounds = len(examples.load_trace(name).rounds)
        _lesson_walk(tab, 13, name, to_totals=False)
        tab.page.fill("#lesson-round input[type=number]", str(rounds - 1))
        tab.page.press("#lesson-round input[type=number]", "Tab")
        tab.page.wait_for_function(f"document.querySelector('#lesson-text').innerText.includes('Round {rounds - 1} (')"
                                   " && document.querySelector('#lesson-text').innerText.includes('step 1 of 6')",
                                   timeout=30_000)
        _lesson_walk(tab, 7, name)
        tab.shot("lesson-totals")
        # the jump control lands on a round's first step; the glossary is one click away
        tab.page.click("#lesson-jump input")
        tab.page.get_by_role("option").filter(has_text="residual").first.click()
        tab.page.wait_for_function("document.querySelector('#lesson-text').innerText.includes('step 1 of 6')",
                                   timeout=30_000)
        tab.page.get_by_text("Glossary: every term on these pages").click()
        tab.page.locator("#lesson-glossary dl").wait_for(state="visible", timeout=10_000)
        assert "ECE" in tab.page.inner_text("#lesson-glossary")
        tab.page.locator("#lesson-step").get_by_text("4 · the accept tests").click()  # with their coin draws
        tab.page.wait_for_function("document.querySelector('#lesson-text').innerText.includes('step 4 of 6')",
                                   timeout=30_000)
        assert "u = " in tab.page.inner_text("#lesson-text")
        tab.shot("lesson", docs=True)
        # a short live run in the Playground, then its lesson
        tab.tab("Playground")
        tab.fill("max-new-tokens", "8")
        tab.page.click("#run")
        tab.wait_status("Done")  # the page opened on the recorded example's status, never "Done"
        tab.tab("Lesson")
        _lesson_source(tab, "The Playground's current run")
        tab.page.wait_for_function("document.querySelector('#lesson-header').innerText.includes('live run')",
                                   timeout=30_000)
        live = int(re.search(r"\((\d+) rounds", tab.page.inner_text("#lesson-text"))[1])
        assert live >= 1
        _lesson_walk(tab, 6 * live + 1, "live run")
        assert tab.dialogs == []
    finally:
        tab.close()
