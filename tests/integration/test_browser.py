"""The explorer in a real browser: JupyterLab + headless Chromium (Debian's), driven by Playwright.

GIVEN a JupyterLab server on 127.0.0.1 with a token and a notebook that shows an
Explorer on a synthetic profile, WHEN headless Chromium runs it and a control is
clicked/typed into, THEN the flame chart renders, updates, no frame name runs as
script, and a screenshot is taken.  The standalone HTML report renders with the network
off.  Times are printed (run with ``-s`` to see them).  Screenshots go to a temporary
folder; ``DDPROF_NB_SCREENSHOTS=docs/img`` writes them where the README shows them.

Needs: ``apt-get install -y chromium`` and ``pip install playwright jupyterlab``.
Skips (with the reason) only when /usr/bin/chromium or playwright is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent / "notebooks_for_browser"
# (tests leave the checkout untouched unless asked to refresh the README's pictures)
IMG = Path(os.environ.get("DDPROF_NB_SCREENSHOTS") or Path(os.environ.get("TMPDIR", "/tmp")) / "ddprof_nb-screenshots")
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# Targets from the issue (headless Chromium, software rendering, 2 cores): printed beside
# the measured times for people to judge, never a pass/fail gate (a shared machine moves
# them more than any bound that would still mean something)
FIRST_RENDER_BUDGET_S = 2.0
UPDATE_BUDGET_S = 0.5

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)", allow_module_level=True)
playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is missing (pip install playwright)")


# The sandwich, inverted and transform views, and the width following the window.
VIEWS_CELLS = (
    f"import sys\nsys.path.insert(0, {str(HELPERS)!r})\nfrom explorer_demo import make_profile\n"
    "from ddprof_nb.explorer import Explorer\nex = Explorer(make_profile(n_samples=20_000, n_stacks=300))",
    "ex",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SETUP_CELL = f"""\
import sys, time
sys.path.insert(0, {str(HELPERS)!r})
from explorer_demo import make_profile
from ddprof_nb.explorer import Explorer
import plotly.graph_objects as go
go.FigureWidget  # import anywidget & co. before the timed display
profile = make_profile()
t0 = time.perf_counter()
ex = Explorer(profile)
print(f"PY_BUILD_MS={{(time.perf_counter() - t0) * 1000:.0f}} NODES={{ex.flame_data.node_count}}")
print("READY")
"""
SHOW_CELL = "ex"


# Two explorers in one page: plotly's JS bundle is sent once (figure_widget.py) and
# both must draw, also after a page reload restores every model from the kernel.
TWO_CELLS = (
    f"import sys\nsys.path.insert(0, {str(HELPERS)!r})\nfrom explorer_demo import make_profile\n"
    "from ddprof_nb.explorer import Explorer\nprofile = make_profile(n_samples=20_000, n_stacks=300)",
    "Explorer(profile)",
    "Explorer(profile, event='cpu')",
)


# A 5-second cell under %%ddprof --live: the view refreshes about once a second while it
# runs, then becomes the explorer of the whole profile.
LIVE_CELLS = (
    "%load_ext ddprof_nb\nimport time\n\n"
    "def spins_in_named_function(seconds):\n"
    "    end = time.perf_counter() + seconds\n"
    "    n = 0\n"
    "    while time.perf_counter() < end:\n"
    "        n += 1\n"
    "    return n",
    "%%ddprof --live\nspins_in_named_function(5.0)",
)

# What a user sees first after a %%ddprof cell in a new kernel.
FIRST_SCREEN_CELLS = (
    "%load_ext ddprof_nb\nimport time\n\n"
    "def spins_a_while(seconds):\n"
    "    end = time.perf_counter() + seconds\n"
    "    while time.perf_counter() < end:\n"
    "        pass\n\n"
    "def calls_down(depth, seconds):\n"
    "    return calls_down(depth - 1, seconds) if depth else spins_a_while(seconds)",
    "%%ddprof\ncalls_down(14, 1.0)",  # a chart of ~17 rows: 400 px high
)


# A kernel busy in a known function, for another notebook's %ddprof kernels and dump.
# It allows attaching as the README tells users to (a no-op where Yama is absent).
BLOCKER_CELLS = (
    "%load_ext ddprof_nb\n%ddprof allow-attach\nimport os\nprint(f'PID={os.getpid()}')",
    "import time\n\n"
    "def waits_in_known_function():\n"
    "    print('BLOCKING', flush=True)\n"
    "    time.sleep(600)  # interrupted by the test\n\n"
    "waits_in_known_function()",
)


def _notebook(path: Path, sources=(SETUP_CELL, SHOW_CELL)) -> None:
    cells = [{"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
             for src in sources]
    nb = {
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb), encoding="utf-8")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 with a token, news and update checks off."""
    if shutil.which("jupyter-lab", path=os.path.dirname(sys.executable)) is None:
        pytest.fail("jupyterlab is not installed next to this Python (pip install jupyterlab)")
    root = tmp_path_factory.mktemp("lab")
    settings = root / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}), encoding="utf-8"
    )
    _notebook(root / "explorer.ipynb")
    _notebook(root / "two.ipynb", TWO_CELLS)
    _notebook(root / "views.ipynb", VIEWS_CELLS)
    _notebook(root / "live.ipynb", LIVE_CELLS)
    _notebook(root / "blocker.ipynb", BLOCKER_CELLS)
    _notebook(root / "first.ipynb", FIRST_SCREEN_CELLS)
    port, token = _free_port(), "ddprof-test-token"
    # a private Jupyter config/data/runtime: the user's kernels and settings stay out of it
    env = dict(os.environ, JUPYTER_PLATFORM_DIRS="1", PYDEVD_DISABLE_FILE_VALIDATION="1",
               JUPYTER_CONFIG_DIR=str(root / "cfg"), JUPYTER_DATA_DIR=str(root / "data"),
               JUPYTER_RUNTIME_DIR=str(root / "run"))
    with open(root / "lab.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             f"--IdentityProvider.token={token}", "--ServerApp.allow_root=True",
             "--LabApp.expose_app_in_browser=True", f"--ServerApp.root_dir={root}",
             f"--LabApp.user_settings_dir={root / 'settings'}", f"--LabApp.workspaces_dir={root / 'ws'}"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2).read()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log.flush()
                        pytest.fail("JupyterLab did not start:\n"
                                    + (root / "lab.log").read_text(errors="replace")[-3000:])
                    time.sleep(0.3)
            yield url, token, root
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def browser():
    with playwright_sync.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _slices(page) -> int:
    """Nodes drawn in the main flame chart (the explorer's first plot; a click opens the
    sandwich's two more)."""
    return page.evaluate(
        "() => document.querySelector('.ddprof-explorer .js-plotly-plot').querySelectorAll('g.slice').length")


def _slice_labels(page) -> set[str]:
    """The labels shown in the main flame chart."""
    return set(page.evaluate(
        "() => Array.from(document.querySelector('.ddprof-explorer .js-plotly-plot')"
        ".querySelectorAll('g.slice text')).map(t => t.textContent).filter(t => t)"))


def _title(page) -> str:
    return page.evaluate(
        "() => { const t = document.querySelector('.ddprof-explorer .js-plotly-plot .gtitle');"
        " return t ? t.textContent : ''; }"
    )


# What a failure prints of the page (CI keeps the log, not the screenshot): how far the
# explorers got, and what the output areas say (a traceback, a widget error)
_PAGE_STATE = (
    "() => ({explorers: document.querySelectorAll('.ddprof-explorer').length,"
    " plots: document.querySelectorAll('.ddprof-explorer .js-plotly-plot').length,"
    " slices: document.querySelectorAll('.ddprof-explorer .js-plotly-plot g.slice').length,"
    " kernel: (window.jupyterapp && window.jupyterapp.shell.currentWidget && window.jupyterapp.shell.currentWidget.sessionContext"
    "  && window.jupyterapp.shell.currentWidget.sessionContext.session && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
    "  || {}).status || null,"
    " outputs: Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output'))"
    "  .map(o => o.innerText.slice(0, 300)).filter(t => t.trim())})"
)


@contextlib.contextmanager
def _page(browser, failure_png: Path):
    """A new page, closed at the end; a failure leaves a screenshot at ``failure_png`` and
    prints the page's state and its last console errors and warnings."""
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text[:300]}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: console.append(f"pageerror: {str(e)[:300]}"))
    try:
        yield page
    except Exception:
        page.screenshot(path=str(failure_png))
        print(f"\n[browser] failure screenshot: {failure_png}")
        try:
            print(f"[browser] page state: {page.evaluate(_PAGE_STATE)}")
        except Exception as exc:  # noqa: BLE001 - the page itself may be what failed
            print(f"[browser] page state unreadable: {exc}")
        print("[browser] last console errors and warnings:\n  " + "\n  ".join(console[-30:] or ["(none)"]))
        raise
    finally:
        page.close()


def test_explorer_in_jupyterlab(lab, browser):
    url, token, root = lab
    with _page(browser, root / "failure.png") as page:
        _run_explorer_notebook(page, url, token)


# "static first" once a frame shows the static flame graph while no explorer chart exists;
# "chart first" if plotly's chart came before any such frame.
STATIC_FIRST = """() => { window._ddstatic = '';
  (function tick() {
    const s = document.querySelector('.ddprof-static-fallback');
    const chart = document.querySelector('.ddprof-explorer .ddprof-flame .main-svg');
    if (chart) { window._ddstatic = window._ddstatic || 'chart first'; return; }
    if (s && s.offsetParent !== null && s.querySelector('svg rect')) window._ddstatic = 'static first';
    requestAnimationFrame(tick); })(); }"""


INSTRUMENT = """() => {
  const gd = document.querySelector('.ddprof-explorer .js-plotly-plot');
  const d = window._ddp = {input: 0, plots: [], frame: 0, animEnd: 0};
  for (const ev of ['mouseup', 'keydown']) document.addEventListener(ev, () => { d.input = performance.now(); }, true);
  gd.on('plotly_afterplot', () => d.plots.push(performance.now()));
  // two animation frames after the zoom starts: the first frame has been painted
  gd.on('plotly_animating', () => requestAnimationFrame(() => requestAnimationFrame(() => {
    d.frame = performance.now(); })));
  gd.on('plotly_animated', () => { d.animEnd = performance.now(); });
}"""


def _since_input(page) -> float:
    """Seconds from the last input event to the flame chart's next redraw (page clock)."""
    page.wait_for_function("() => window._ddp.plots.some(t => t > window._ddp.input)", timeout=20_000)
    return page.evaluate("() => (window._ddp.plots.find(t => t > window._ddp.input) - window._ddp.input) / 1000")


def _run_explorer_notebook(page, url, token):
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(f"{url}/lab/tree/explorer.ipynb?token={token}", wait_until="domcontentloaded")
    page.wait_for_function(
        "() => window.jupyterapp && document.querySelector('.jp-NotebookPanel .jp-Cell')", timeout=60_000
    )
    # wait for the kernel to be ready, then run both cells
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status === 'idle'; }",
        timeout=60_000,
    )
    # notes whether a frame showed the static flame graph before plotly's chart existed
    page.evaluate(STATIC_FIRST)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

    # GIVEN the Explorer was built in the kernel (READY printed) ...
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.jp-OutputArea-output')).some(e => e.innerText.includes('READY'))",
        timeout=90_000, polling=20,
    )
    t_ready = time.perf_counter()
    text = page.inner_text(".jp-NotebookPanel .jp-OutputArea-output >> nth=0")
    # ... WHEN the display message arrives, THEN plotly draws the flame chart
    page.wait_for_selector(".ddprof-explorer .js-plotly-plot g.slice", timeout=60_000)
    page.wait_for_function(
        "() => document.querySelectorAll('.ddprof-explorer .js-plotly-plot g.slice').length > 50", polling="raf",
        timeout=60_000,
    )
    first_render = time.perf_counter() - t_ready
    n0 = _slices(page)
    labels0 = _slice_labels(page)
    title0 = _title(page)
    assert "CPU time" in title0, title0
    # the widget view is drawn, and the static flame output beside it is hidden
    assert page.locator(".ddprof-static-fallback").count() == 1
    assert page.locator(".ddprof-static-fallback").is_hidden()
    # ... which was on screen while plotly set itself up (a new page: seconds of CPU)
    assert page.evaluate("() => window._ddstatic") == "static first"

    # Times below are read from the page's own clock: from the input event (mouseup or
    # keydown) to the flame chart's next plotly_afterplot, i.e. kernel round trip + redraw.
    page.evaluate(INSTRUMENT)

    # WHEN "icicle" is clicked THEN the root moves from the bottom of the chart to its top
    root_in_top_half = (
        "() => { const p = document.querySelector('.ddprof-explorer .js-plotly-plot .main-svg').getBoundingClientRect();"
        " const r = document.querySelector('.ddprof-explorer .js-plotly-plot g.slice').getBoundingClientRect();"
        " return r.top < p.top + p.height / 2; }"
    )
    assert page.evaluate(root_in_top_half) is False  # flame: root at the bottom
    page.locator(".ddprof-explorer button", has_text="icicle").click()
    page.wait_for_function(root_in_top_half, polling="raf", timeout=20_000)
    toggle_update = _since_input(page)

    # WHEN a focus regex is typed THEN the chart redraws with the focused stacks only and
    # a new total (the node count need not fall: small nodes of the focused part, folded
    # before, may now be wide enough to draw)
    page.locator(".ddprof-explorer button", has_text="more").click()  # focus is behind "more"
    box = page.get_by_placeholder("regex: keep stacks through")
    box.fill("transform_2$")
    box.press("Enter")
    page.wait_for_function("(t) => { const e = document.querySelector('.ddprof-explorer .gtitle');"
                           " return e && e.textContent !== t; }", arg=title0, polling="raf", timeout=20_000)
    filter_update = _since_input(page)
    n1 = _slices(page)
    labels1 = _slice_labels(page)
    assert n1 > 1 and "transform_2" in labels1 and labels0 - labels1, (n0, n1, sorted(labels0 - labels1))

    # WHEN a node is clicked THEN plotly zooms into it.  plotly animates every click-zoom
    # for a fixed 750 ms (CLICK_TRANSITION_TIME in plotly.js): we time its first painted
    # frame (the response) and its end (only the subtree remains).
    page.wait_for_timeout(300)
    target = page.locator(".ddprof-explorer .js-plotly-plot g.slice").nth(1)
    clicked = target.text_content()
    # Point at it first, as a person does: ipywidgets coalesces a widget's state messages
    # while one is in flight, so a click landing within a few ms of the hover message
    # would be replaced by the hover plotly re-emits after zooming.
    target.hover(force=True)
    page.wait_for_timeout(400)
    target.click(force=True)
    page.wait_for_function("() => window._ddp.frame > window._ddp.input && window._ddp.animEnd > window._ddp.input",
                           timeout=20_000)
    zoom_response, zoom_done = page.evaluate(
        "() => [(window._ddp.frame - window._ddp.input) / 1000, (window._ddp.animEnd - window._ddp.input) / 1000]"
    )
    assert _slices(page) < n1
    # ... and the kernel heard the click: the source view shows that function
    page.wait_for_function("(name) => document.querySelector('.ddprof-explorer').innerText.includes(name + ' ')",
                           arg=clicked.strip(), timeout=20_000)

    # back to the whole profile
    box.fill("")
    box.press("Enter")
    page.wait_for_function("(t) => document.querySelector('.ddprof-explorer .gtitle').textContent === t",
                           arg=title0, polling="raf", timeout=20_000)

    # WHEN a range is dragged on the timeline THEN the flame shows only that time
    timeline = page.locator(".ddprof-explorer .ddprof-timeline rect.nsewdrag")
    timeline.scroll_into_view_if_needed()
    box_tl = timeline.bounding_box()
    y = box_tl["y"] + box_tl["height"] / 2
    page.mouse.move(box_tl["x"] + box_tl["width"] * 0.25, y)
    page.mouse.down()
    page.mouse.move(box_tl["x"] + box_tl["width"] * 0.5, y, steps=8)
    page.mouse.up()
    page.wait_for_function("(t) => document.querySelector('.ddprof-explorer .gtitle').textContent !== t",
                           arg=title0, polling="raf", timeout=20_000)
    range_update = _since_input(page)
    assert "time " in page.locator(".ddprof-status").inner_text()
    # and a double-click restores the whole profile
    page.mouse.dblclick(box_tl["x"] + box_tl["width"] * 0.4, y)
    page.wait_for_function("(t) => document.querySelector('.ddprof-explorer .gtitle').textContent === t",
                           arg=title0, polling="raf", timeout=20_000)

    # flame again, tall enough to hold the whole widget, for the screenshots
    page.locator(".ddprof-explorer button", has_text="flame").first.click()
    page.wait_for_function(f"() => !({root_in_top_half})()", polling="raf", timeout=20_000)
    page.wait_for_function("(n) => document.querySelector('.ddprof-explorer .js-plotly-plot')"
                           ".querySelectorAll('g.slice').length >= n",
                           arg=int(n0 * 0.9), polling="raf", timeout=20_000)
    # the click above opened that function's sandwich: closed, the picture shows the
    # flame, timeline and top table together (the README shows the sandwich apart)
    page.locator(".ddprof-explorer .ddprof-sandwich button", has_text="close sandwich").click()
    page.wait_for_function("() => document.querySelector('.ddprof-explorer .ddprof-sandwich').offsetParent === null",
                           timeout=20_000)
    page.set_viewport_size({"width": 1400, "height": 2000})
    page.locator(".ddprof-explorer").scroll_into_view_if_needed()
    page.wait_for_timeout(800)
    IMG.mkdir(parents=True, exist_ok=True)
    page.locator(".ddprof-explorer").screenshot(path=str(IMG / "explorer.png"))
    # the dark theme: same widget, JupyterLab's own theme switch
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=20_000)
    page.wait_for_timeout(800)
    page.locator(".ddprof-explorer").screenshot(path=str(IMG / "explorer_dark.png"))

    # nothing ran the <script>alert(1)</script> frame name; it shows as text
    assert dialogs == []
    assert page.evaluate("() => document.body.innerHTML.includes('<script>alert(1)</script>')") is False

    print(
        f"\n[browser] {text.strip()}\n"
        f"[browser] first render: {first_render:.2f} s for {n0} nodes (budget {FIRST_RENDER_BUDGET_S} s)\n"
        f"[browser] flame->icicle toggle: {toggle_update:.2f} s; focus filter: {filter_update:.2f} s "
        f"({n1} nodes); click-to-zoom: first frame {zoom_response:.2f} s, done {zoom_done:.2f} s "
        f"(750 ms of it is plotly's animation); timeline range: {range_update:.2f} s (budget {UPDATE_BUDGET_S} s)"
    )


def _open_and_wait_idle(page, url, token, name):
    """Open notebook ``name`` and wait until it is the current tab (the workspace may
    restore other notebooks first) with its kernel idle."""
    page.goto(f"{url}/lab/tree/{name}?token={token}", wait_until="domcontentloaded")
    page.wait_for_function(
        "(name) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " return w && w.context && w.context.path === name && w.sessionContext && w.sessionContext.session"
        " && w.sessionContext.session.kernel && w.sessionContext.session.kernel.status === 'idle'; }",
        arg=name, timeout=60_000,
    )


_DRAWN = ("() => { const ex = document.querySelectorAll('.ddprof-explorer');"
          " return ex.length === 2 && Array.from(ex).every(e => e.querySelectorAll('.js-plotly-plot').length === 2"
          " && e.querySelectorAll('.js-plotly-plot g.slice').length > 20); }")


def test_two_explorers_share_one_bundle_and_survive_a_reload(lab, browser):
    url, token, root = lab
    with _page(browser, root / "failure_two.png") as page:
        _open_and_wait_idle(page, url, token, "two.ipynb")
        t0 = time.perf_counter()
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        # THEN both explorers draw their flame chart and timeline
        page.wait_for_function(_DRAWN, polling=100, timeout=90_000)
        both = time.perf_counter() - t0
        # and the page imported plotly's bundle once, through the carrier
        keys = page.evaluate("() => Object.getOwnPropertySymbols(globalThis).map(String)"
                             ".filter(k => k.includes('ddprof_nb.plotly-widget-bundle'))")
        assert len(keys) == 1, keys
        # WHEN the notebook is saved and the page reloaded (the kernel lives on) THEN the
        # widget manager restores every model from the kernel, in any order, and both draw
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=20_000)
        _open_and_wait_idle(page, url, token, "two.ipynb")
        t1 = time.perf_counter()
        page.wait_for_function(_DRAWN, polling=100, timeout=90_000)
        print(f"\n[browser] two explorers drawn in {both:.2f} s (run all); after a reload {time.perf_counter() - t1:.2f} s")


def _demo_profile(**kwargs):
    sys.path.insert(0, str(HELPERS))
    try:
        from explorer_demo import make_profile
    finally:
        sys.path.remove(str(HELPERS))
    return make_profile(**kwargs)


def _render_offline(browser, report: Path, png: str) -> float:
    """Open ``report`` with the network off; check it drew and asked for nothing; screenshot."""
    context = browser.new_context(offline=True, viewport={"width": 1300, "height": 1000})
    requests: list[str] = []
    context.route("**/*", lambda route: (requests.append(route.request.url), route.continue_()
                                         if route.request.url.startswith("file:") else route.abort()))
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    t0 = time.perf_counter()
    page.goto(report.as_uri())
    page.wait_for_selector(".js-plotly-plot g.slice", timeout=30_000)
    render = time.perf_counter() - t0
    assert page.locator("table.ddprof-top tr").count() > 5
    assert [u for u in requests if not u.startswith("file:")] == []
    assert dialogs == []  # the <script>alert(1)</script> frame name stayed text
    IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMG / png), full_page=False)
    context.close()
    return render


def test_html_report_offline(browser, tmp_path):
    """GIVEN Explorer.to_html's report WHEN opened with the network off THEN it renders (plotly.js inlined)."""
    from ddprof_nb.explorer import Explorer

    report = Explorer(_demo_profile(n_samples=50_000, n_stacks=2_000)).to_html(tmp_path / "report.html")
    render = _render_offline(browser, report, "explorer_report.png")
    print(f"\n[browser] offline HTML report ({report.stat().st_size / 1e6:.1f} MB) rendered in {render:.2f} s")


def test_diff_report_offline(browser, tmp_path):
    """GIVEN a profile and one where the paths through load_0 doubled WHEN their diff report
    is opened offline THEN the differential flame chart renders (screenshot)."""
    from ddprof_nb.model import selection
    from ddprof_nb.explorer import Explorer

    before = _demo_profile(n_samples=50_000, n_stacks=2_000)
    after = selection.merge(before, selection.filter(before, focus="^load_0$"))
    ex = Explorer(before, after)
    grown = [lab for lab, d in zip(ex.flame_data.labels, ex.flame_data.raw[:, 2]) if d > 0]
    assert "load_0" in grown
    render = _render_offline(browser, ex.to_html(tmp_path / "diff.html"), "explorer_diff.png")
    print(f"\n[browser] offline diff report rendered in {render:.2f} s")


# Selectors below look in the notebook tab in front: JupyterLab restores the tabs of
# the other tests, whose explorers stay in the page, hidden.
def _title_here(page) -> str:
    return page.evaluate(
        "() => { const t = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer "
        ".js-plotly-plot .gtitle'); return t ? t.textContent : ''; }")


# the main flame chart is the explorer's first plot
_FLAME_LABELS = ("() => Array.from(document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer .js-plotly-plot')"
                 ".querySelectorAll('g.slice text')).map(t => t.textContent).sort().join('|')")
_FLAME_WIDTH = "() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer .js-plotly-plot .main-svg').getBoundingClientRect().width"
_EXPLORER_WIDTH = "() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer').getBoundingClientRect().width"


def _screenshot_controls_and_flame(page, path: Path) -> None:
    """The explorer from its controls to the bottom of its flame chart's colour legend."""
    page.mouse.move(1, 1)  # no hover label or plotly toolbar in the picture
    page.wait_for_timeout(500)  # the redraw's last frame is painted
    here = ".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer"
    page.evaluate("(sel) => document.querySelector(sel).scrollIntoView({block: 'start'})", here)
    page.wait_for_timeout(300)
    top = page.locator(here).bounding_box()
    legend = page.locator(f"{here} .ddprof-legend").bounding_box()
    IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), clip={"x": top["x"], "y": top["y"], "width": top["width"],
                                          "height": legend["y"] + legend["height"] + 6 - top["y"]})


def test_sandwich_inverted_transforms_and_width_in_jupyterlab(lab, browser):
    url, token, root = lab
    with _page(browser, root / "failure_views.png") as page:
        # every error the widget manager logs for a model, from the first draw through the
        # reload ("Error setting state: ...", "Could not process update msg ...")
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and (
            "Error setting state" in m.text or "Could not process update" in m.text) else None)
        _open_and_wait_idle(page, url, token, "views.ipynb")
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function("() => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer .js-plotly-plot g.slice').length > 20",
                               polling=100, timeout=90_000)
        page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer table.ddprof-top tbody tr", timeout=30_000)
        title0 = _title_here(page)
        labels0 = page.evaluate(_FLAME_LABELS)

        # WHEN the first row of the top table is clicked THEN its sandwich opens: callers
        # above, callees below (two more charts), and no filter changed the flame
        row = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer table.ddprof-top tbody tr").first
        name = row.locator("td").nth(6).inner_text()
        row.click()
        page.wait_for_function("() => { const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-sandwich');"
                               " return s && s.offsetParent !== null"
                               " && s.querySelectorAll('.js-plotly-plot g.slice').length >= 2; }",
                               polling=100, timeout=30_000)
        header = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-sandwich").inner_text()
        assert name in header and "callers above, callees below" in header, header
        assert _title_here(page) == title0
        # the sort header works too: sorting by total puts another column's arrow up
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer table.ddprof-top th", has_text="total time").click()
        page.wait_for_function("() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer table.ddprof-top th.sortable')"
                               " && Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer table.ddprof-top th'))"
                               ".some(th => th.textContent.startsWith('total time') && th.textContent.includes('\\u25BC'))",
                               timeout=20_000)

        # WHEN "inverted" is pressed THEN the flame holds other nodes (roots are the leaves)
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer button", has_text="inverted").click()
        page.wait_for_function(f"(l) => ({_FLAME_LABELS})() !== l", arg=labels0, polling=100, timeout=20_000)
        _screenshot_controls_and_flame(page, IMG / "explorer_inverted.png")
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer button", has_text="inverted").click()
        page.wait_for_function(f"(l) => ({_FLAME_LABELS})() === l", arg=labels0, polling=100, timeout=20_000)

        # WHEN a "drop function" transform is added THEN a chip shows and the total drops;
        # WHEN the chip is clicked THEN the whole profile is back
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer button", has_text="more").click()
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer select").filter(has_text="drop function").select_option("drop function")
        box = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer").get_by_placeholder(
            "regex (empty: the selected function)")
        box.fill("^load_0$")
        box.press("Tab")
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer button", has_text="add transform").click()
        chip = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer .ddprof-chip", has_text="drop function: ^load_0$")
        chip.wait_for(timeout=20_000)
        page.wait_for_function("(t) => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer .gtitle').textContent !== t",
                               arg=title0, polling=100, timeout=20_000)
        chip.click()
        page.wait_for_function("() => !document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer .ddprof-chip')", timeout=20_000)
        page.wait_for_function("(t) => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer .gtitle').textContent === t",
                               arg=title0, polling=100, timeout=20_000)

        # WHEN the window narrows and widens THEN the flame chart follows the output's width
        widths = []
        for w in (1000, 1700):
            before = page.evaluate(_EXPLORER_WIDTH)
            page.set_viewport_size({"width": w, "height": 1100})
            # the output area takes the new width first, then the chart follows it
            page.wait_for_function(f"(b) => ({_EXPLORER_WIDTH})() !== b", arg=before, polling=100, timeout=20_000)
            page.wait_for_function(f"() => Math.abs(({_FLAME_WIDTH})() - ({_EXPLORER_WIDTH})()) < 40",
                                   polling=100, timeout=20_000)
            widths.append(page.evaluate(_FLAME_WIDTH))
        # (the side panel JupyterLab restores may be open or not: only the change is known)
        assert widths[1] > widths[0] + 200, widths
        IMG.mkdir(parents=True, exist_ok=True)
        page.mouse.move(1, 1)  # no hover label or plotly toolbar in the picture
        page.wait_for_timeout(500)
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-sandwich").screenshot(path=str(IMG / "explorer_sandwich.png"))

        # WHEN the event is switched to wall and the page reloaded (the kernel lives on)
        # THEN the restored charts show wall, as the restored dropdown says, without errors
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer select").filter(has_text="Wall time").select_option(label="Wall time")
        page.wait_for_function("() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer .gtitle').textContent.includes('Wall')",
                               polling=100, timeout=20_000)
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=20_000)
        _open_and_wait_idle(page, url, token, "views.ipynb")
        page.wait_for_function("() => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer .js-plotly-plot g.slice').length > 20",
                               polling=100, timeout=90_000)
        assert "Wall" in _title_here(page), _title_here(page)
        selected = page.evaluate("() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer select'))"
                                 ".map(s => s.options[s.selectedIndex] && s.options[s.selectedIndex].text.replace(/\\u00a0/g, ' '))")
        assert "Wall time" in selected, selected
        # (a sandwich shown again, or a transform's update, reached a plotly view removed
        # earlier: "Cannot read properties of undefined (reading 'length')"; a restored
        # chart addressed by a stale message: "indices must be valid indices for gd.data")
        page.wait_for_timeout(1000)  # the restored models' first updates
        assert errors == [], errors

        # WHEN the kernel is gone (shut down; the page reloads onto a new one that has no
        # such widget) THEN the saved static flame graph shows in place of the widget
        kernels = json.loads(urllib.request.urlopen(f"{url}/api/kernels?token={token}", timeout=10).read())
        for k in kernels:
            req = urllib.request.Request(f"{url}/api/kernels/{k['id']}?token={token}", method="DELETE")
            urllib.request.urlopen(req, timeout=20).read()
        _open_and_wait_idle(page, url, token, "views.ipynb")
        page.wait_for_function("() => { const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-static-fallback');"
                               " return s && s.offsetParent !== null && s.querySelectorAll('svg rect').length > 20; }",
                               polling=200, timeout=60_000)
        assert page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer").count() == 0
        # ... and ipywidgets' "Error displaying widget: model not found" beside it is hidden
        error = ("() => Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output'))"
                 ".filter(e => e.textContent.includes('model not found'))")
        page.wait_for_function(f"() => ({error})().length > 0", polling=200, timeout=30_000)
        assert page.evaluate(f"() => ({error})().every(e => e.offsetParent === null)")
        print(f"\n[browser] sandwich of {name!r}; flame widths at 1000 and 1700 px windows: {widths}")


_HERE = ".jp-NotebookPanel:not(.lm-mod-hidden)"

# Records every distinct (refresh count, header text) the live view shows in the tab in
# front, polled by the page itself so that no update between two Python calls is missed.
_RECORD_LIVE = """() => {
  const seen = window._ddpLive = [];
  let last = null;
  window._ddpLiveTimer = setInterval(() => {
    const s = document.querySelector('%s .ddprof-live-status');
    if (!s) return;
    const v = s.dataset.refreshes + '|' + s.textContent;
    if (v !== last) { last = v; seen.push([Number(s.dataset.refreshes), s.textContent]); }
  }, 50);
}""" % _HERE


# where the flame's boxes and the summary are, relative to the window (no scrolling)
_FIRST_SCREEN = """() => {
  const ex = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .ddprof-explorer');
  const slices = Array.from(ex.querySelector('.js-plotly-plot').querySelectorAll('g.slice'))
    .map(g => g.getBoundingClientRect()).filter(r => r.height > 0);
  const banner = ex.querySelector('.ddprof-banner');
  const lh = parseFloat(getComputedStyle(banner).lineHeight) || 1.4 * parseFloat(getComputedStyle(banner).fontSize);
  const out = Array.from(document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output'))
    .find(e => e.innerText.startsWith('ddprof ['));
  const pre = out.querySelector('pre') || out;
  return {innerHeight: window.innerHeight, top: Math.min(...slices.map(r => r.top)),
          bottom: Math.max(...slices.map(r => r.bottom)), bannerHeight: banner.getBoundingClientRect().height,
          toolbarTops: Array.from(ex.querySelector('.ddprof-toolbar').children)
            .map(c => Math.round(c.getBoundingClientRect().top)),
          lineHeight: lh, printed: out.innerText, notesOpen: !!ex.querySelector('details[open]'),
          printedHeight: pre.getBoundingClientRect().height,
          printedLineHeight: parseFloat(getComputedStyle(pre).lineHeight) || 1.4 * parseFloat(getComputedStyle(pre).fontSize)};
}"""


def test_the_flame_is_on_the_first_screen_after_a_ddprof_cell(lab, browser):
    url, token, root = lab
    with _page(browser, root / "failure_first.png") as page:
        page.set_viewport_size({"width": 1400, "height": 1000})
        _open_and_wait_idle(page, url, token, "first.ipynb")
        # WHEN a %%ddprof cell runs in a new kernel
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.jp-OutputArea-output')).some(e => e.innerText.startsWith('ddprof ['))",
            polling=50, timeout=90_000)
        t_printed = time.perf_counter()
        page.wait_for_selector(f"{_HERE} .ddprof-explorer .js-plotly-plot g.slice", timeout=60_000)
        page.wait_for_function(f"() => ({_FLAME_LABELS})().includes('spins_a_while')", polling=50, timeout=60_000)
        chart_after = time.perf_counter() - t_printed
        # with the cell at the top of the notebook, as after scrolling to it
        page.evaluate("() => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')[1]"
                      ".scrollIntoView({block: 'start'})")
        page.wait_for_timeout(300)
        seen = page.evaluate(_FIRST_SCREEN)
        _screenshot_controls_and_flame(page, IMG / "explorer_first_screen.png")
        # THEN every row of the flame, its root included, is inside the 1000-px window
        assert seen["bottom"] <= seen["innerHeight"], seen
        # AND the summary is one line, printed and in the explorer, the notes closed
        assert "\n" not in seen["printed"].strip() and " engine · " in seen["printed"], seen
        assert seen["printedHeight"] < 1.6 * seen["printedLineHeight"], seen  # not wrapped either
        assert seen["bannerHeight"] < 1.6 * seen["lineHeight"] and not seen["notesOpen"], seen
        # AND the controls above the chart are one toolbar, one row
        assert max(seen["toolbarTops"]) - min(seen["toolbarTops"]) < 20, seen
        print(f"\n[browser] first screen: flame rows {seen['top']:.0f}-{seen['bottom']:.0f} px of "
              f"{seen['innerHeight']} px; interactive chart {chart_after:.2f} s after the status line "
              f"(goal {FIRST_RENDER_BUDGET_S:.0f} s, not a gate)")


def test_live_view_refreshes_in_jupyterlab_then_becomes_the_explorer(lab, browser):
    url, token, root = lab
    with _page(browser, root / "failure_live.png") as page:
        _open_and_wait_idle(page, url, token, "live.ipynb")
        page.evaluate(_RECORD_LIVE)
        # WHEN a 5-second CPU loop runs under %%ddprof --live
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        # THEN (at the end) the live view became the explorer: its flame chart, controls
        # and top table, the loop's function drawn in the flame
        page.wait_for_function(
            f"() => document.querySelectorAll('{_HERE} .ddprof-live .ddprof-explorer .js-plotly-plot g.slice').length > 2",
            polling=100, timeout=90_000)
        page.wait_for_function(f"() => ({_FLAME_LABELS})().includes('spins_in_named_function')",
                               polling=100, timeout=30_000)
        page.wait_for_selector(f"{_HERE} .ddprof-live .ddprof-explorer table.ddprof-top tbody tr", timeout=30_000)
        assert page.locator(f"{_HERE} .ddprof-live .ddprof-explorer button", has_text="icicle").count() == 1
        top = page.locator(f"{_HERE} .ddprof-explorer table.ddprof-top").inner_text()
        assert "spins_in_named_function" in top, top
        # the live header is gone (replaced), and there is one explorer, not a second below
        assert page.locator(f"{_HERE} .ddprof-live-status").count() == 0
        assert page.locator(f"{_HERE} .ddprof-explorer").count() == 1
        seen = page.evaluate("() => { clearInterval(window._ddpLiveTimer); return window._ddpLive; }")
        # AND while the cell ran, the page showed at least 3 refreshes, in order, each
        # with a new elapsed time and the samples counted so far
        refreshes = [n for n, _ in seen if n > 0]
        assert len(set(refreshes)) >= 3, seen
        assert refreshes == sorted(refreshes), seen
        texts = [t for n, t in seen if n > 0]
        assert len(set(texts)) >= 3 and all("elapsed" in t and "samples" in t for t in texts), seen
        print(f"\n[browser] live view: {len(set(refreshes))} refreshes seen in the page: "
              + "; ".join(t.split("\u00b7", 1)[-1].strip() for t in texts))


def _kernel_api(url, token, path, method="GET"):
    req = urllib.request.Request(f"{url}/api/kernels{path}", method=method,
                                 headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def _outputs_after_run_all(page) -> list[str]:
    """Run every cell of the tab in front; wait until each ran and the kernel is idle; the
    text of each cell's output."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget; const cells = w.content.model.cells;"
        " for (let i = 0; i < cells.length; i++) if (cells.get(i).executionCount == null) return false;"
        " return w.sessionContext.session.kernel.status === 'idle'; }",
        polling=200, timeout=90_000)
    return page.evaluate(f"() => Array.from(document.querySelectorAll('{_HERE} .jp-Cell'))"
                         ".map(c => { const o = c.querySelector('.jp-OutputArea'); return o ? o.innerText : ''; })")


def test_kernels_and_dump_between_two_kernels_in_jupyterlab(lab, browser):
    url, token, root = lab
    with _page(browser, root / "failure_kernels.png") as page:
        # GIVEN notebook A's kernel busy in a known function
        _open_and_wait_idle(page, url, token, "blocker.ipynb")
        kid = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id")
        # (not awaited: the command's promise ends with the cells, i.e. not until the interrupt)
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        try:
            page.wait_for_function(
                f"() => Array.from(document.querySelectorAll('{_HERE} .jp-OutputArea-output'))"
                ".some(e => e.innerText.includes('BLOCKING'))", polling=200, timeout=90_000)
            text = page.locator(f"{_HERE} .jp-OutputArea").first.inner_text()
            pid = int(text.split("PID=")[1].split()[0])
            # WHEN notebook B (a second kernel) lists the kernels and dumps A's by id prefix
            _notebook(root / "inspector.ipynb", ("%load_ext ddprof_nb\n%ddprof kernels", f"%ddprof dump {kid[:8]}"))
            _open_and_wait_idle(page, url, token, "inspector.ipynb")
            kernels_out, dump_out = _outputs_after_run_all(page)
        finally:
            _kernel_api(url, token, f"/{kid}/interrupt", method="POST")
        # THEN A is listed with its PID, busy, and its notebook's name
        line_a = [ln for ln in kernels_out.splitlines() if ln.startswith(kid)]
        assert len(line_a) == 1, kernels_out
        assert line_a[0].split()[1:4] == [str(pid), "busy", "blocker.ipynb"], kernels_out
        assert "(this kernel)" in kernels_out  # and B itself, marked
        # and A's dump names the function it waits in
        # (innermost first: time.sleep is C, so the main thread's first Python frame is it)
        lines = dump_out.splitlines()
        main = [i for i, ln in enumerate(lines) if "(main thread" in ln]
        assert len(main) == 1, dump_out
        assert lines[main[0] + 1].strip().startswith("waits_in_known_function ("), dump_out
        # the interrupt ended A's cell: the kernel is idle again for the next tests
        deadline = time.monotonic() + 60
        while _kernel_api(url, token, f"/{kid}")["execution_state"] != "idle":
            assert time.monotonic() < deadline, "kernel A did not go idle after the interrupt"
            time.sleep(0.5)
        print(f"\n[browser] %ddprof kernels from B:\n{kernels_out}\n[browser] %ddprof dump {kid[:8]}, A's main thread:\n"
              + "\n".join(lines[main[0]:main[0] + 3]))
