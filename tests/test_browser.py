"""The report and the board in Debian's chromium (Playwright): no console errors, charts
drawn, and trace strings with HTML/JS in them shown as text, never run."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from perfswarm.optimize.tune import load_results
from perfswarm.report import html
from perfswarm.report.board import BoardServer
from perfswarm.report.data import report_data
from perfswarm.trace.ingest import ImportOptions, import_traces
from perfswarm.trace.store import Run
from test_report_overview import memory_run

playwright_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed (make test)"),
]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
XSS_NAMES = ('<img src=x onerror="window.__pwned=1">',
             '</script><script>window.__pwned=2</script>',
             '"><svg onload="window.__pwned=3">')


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def open_page(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # Works offline: any request besides the page's own origin is an error.
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}/" if parts.netloc else "file:"
    page.on("request", lambda r: None if r.url.startswith((origin, "data:"))
            else errors.append(f"fetched {r.url}"))
    page.goto(url, wait_until="load")
    return page, errors


def assert_charts_drawn(page: Any, ids: list[str]) -> None:
    for chart in ids:
        page.wait_for_selector(f"#{chart} svg.main-svg", timeout=30_000)
        assert page.locator(f"#{chart} .plot-container").count() == 1


@pytest.fixture(scope="module")
def xss_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("xss")
    events: list[dict[str, Any]] = []
    for step in range(2):
        t0 = step * 1000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                       "pid": 1, "tid": 1, "ts": t0, "dur": 900.0, "args": {}})
        for i, name in enumerate(XSS_NAMES):
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1,
                           "ts": t0 + 10 + 100 * i, "dur": 50.0, "args": {"External id": i}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "pid": 1, "tid": 1, "ts": t0 + 20 + 100 * i, "dur": 5.0,
                           "args": {"correlation": 100 * step + i}})
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7,
                           "ts": t0 + 30 + 100 * i, "dur": 60.0,
                           "args": {"correlation": 100 * step + i, "device": 0, "stream": 7}})
        events.append({"ph": "C", "name": XSS_NAMES[2], "pid": 1, "tid": 1, "ts": t0,
                       "args": {XSS_NAMES[0]: step + 1.5}})
    src = tmp / "xss.json"
    src.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 10**18}))
    return import_traces([src], tmp / "xss.run", ImportOptions(), ["test"])


def show(page: Any, view: str) -> None:
    page.click(f"nav#views a[data-view={view}]")
    page.wait_for_selector(f"#view-{view}", state="visible")


def view_range(page: Any) -> tuple[int, int]:
    t0, t1 = page.get_attribute("#timeline", "data-view").split(",")
    return int(t0), int(t1)


def test_report_renders_without_errors(browser: Any, corpus_runs: dict[str, Run],
                                       tmp_path: Path) -> None:
    data = report_data(corpus_runs["nccl"])
    out = html.write(data, tmp_path / "report.html")
    page, errors = open_page(browser, out.as_uri())
    assert_charts_drawn(page, ["chart-concurrency"])
    for view, _ in html.VIEWS:
        show(page, view)
    assert_charts_drawn(page, ["chart-prediction"])
    assert page.locator("#prediction tr").count() == 4
    show(page, "trace")
    assert int(page.get_attribute("#timeline", "data-drawn")) > 1000
    show(page, "kernels")
    assert page.locator("#kernels td.name").all_inner_texts() == [
        k["name"] for k in data["kernels"]]
    # the launch queue over time (the rank's, streams 7 and 40) and the d2d and memset traffic
    assert_charts_drawn(page, ["chart-queue", "chart-bandwidth"])
    assert page.locator("#chart-queue g.trace.scatter").count() == len(data["queues"]) == 3
    assert page.locator("#chart-bandwidth g.trace.scatter").count() == 2
    assert errors == []
    page.close()


def test_timeline_keyboard(browser: Any, corpus_runs: dict[str, Run], tmp_path: Path) -> None:
    """w/s zoom about the middle, a/d pan by a quarter, n jumps to an iteration, 0 shows all."""
    data = report_data(corpus_runs["nccl"])
    out = html.write(data, tmp_path / "report.html")
    page, errors = open_page(browser, out.as_uri() + "#/trace")
    page.focus("#timeline")
    t0, t1 = view_range(page)
    page.keyboard.press("w")
    z0, z1 = view_range(page)
    assert abs((z1 - z0) - (t1 - t0) / 2) <= 1 and abs((z0 + z1) - (t0 + t1)) <= 2
    page.keyboard.press("d")
    d0, d1 = view_range(page)
    assert abs(d0 - z0 - (z1 - z0) / 4) <= 1 and d1 - d0 == z1 - z0
    page.keyboard.press("0")
    assert view_range(page) == (0, data["timeline"]["end_ns"])
    page.keyboard.press("n")
    step = data["timeline"]["steps"][0]
    pad = (step["end"] - step["start"]) * 0.05
    assert view_range(page) == (round(step["start"] - pad), round(step["end"] + pad))
    page.keyboard.press("n")
    assert view_range(page)[0] > step["end"] - pad
    assert errors == []
    page.close()


def test_report_with_tuning_draws_importance_and_trials(browser: Any, corpus_runs: dict[str, Run],
                                                        tune_out: Path, tmp_path: Path) -> None:
    data = report_data(corpus_runs["simple_add"], tune=load_results(tune_out))
    out = html.write(data, tmp_path / "tuned.html")
    page, errors = open_page(browser, out.as_uri())
    show(page, "model")
    assert_charts_drawn(page, ["chart-importance", "chart-trials"])
    # One bar per parameter the completed trials varied (workers; all ran --fast), one marker
    # per trial that ran steady steps (6 of 8: two failed).
    assert page.locator("#chart-importance g.trace.bars path").count() == 1
    assert page.locator("#chart-trials g.trace.scatter path.point").count() == 6
    rows = page.locator("#trials tr").all_inner_texts()
    assert len(rows) == 1 + 8 and rows[7].split("\t")[:4] == ["6", "COMPLETE", "800.000", "8.00x"]
    assert errors == []
    page.close()


def test_trace_strings_are_text(browser: Any, xss_run: Run, tmp_path: Path) -> None:
    out = html.write(report_data(xss_run), tmp_path / "xss.html")
    page, errors = open_page(browser, out.as_uri())
    for view, _ in html.VIEWS:
        show(page, view)
        if view == "trace":
            assert_charts_drawn(page, ["chart-counter-0"])
            box = page.locator("#timeline canvas").bounding_box()
            seen = set()
            for x in range(240, int(box["width"]), 5):  # hover along the ops' row
                page.mouse.move(box["x"] + x, box["y"] + 30 + 16 + 8)
                seen.add(page.locator(".tl-tip").inner_text().split("\n")[0])
            assert set(XSS_NAMES) <= seen  # shown as text in the tooltip
            # a counter's name as typed in its chart's title (up to its last ".", where the
            # reader splits the name from the arg key), quotes too (not `&quot;`)
            title = page.locator("#chart-counter-0 .gtitle").all_text_contents()
            assert title == [XSS_NAMES[2].rpartition(".")[0]], title
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img").count() == 0
    kernels = page.locator("#kernels td.name").all_inner_texts()
    cpu_ops = page.locator("#cpu-ops td.name").all_inner_texts()
    assert sorted(kernels) == sorted(XSS_NAMES) and sorted(cpu_ops) == sorted(XSS_NAMES)
    # the launch queue is drawn
    assert page.locator("#chart-queue svg.main-svg").count() > 0
    assert errors == []
    page.close()


def test_board_in_the_browser(browser: Any, corpus_runs: dict[str, Run], xss_run: Run,
                              tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(corpus_runs["simple_add"].path, root / "simple_add")
    shutil.copytree(xss_run.path, root / "xss")
    server = BoardServer(root, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page, errors = open_page(browser, server.url)
        assert page.locator("#runs a").all_inner_texts() == ["simple_add", "xss"]
        page.click("text=xss")
        assert_charts_drawn(page, ["chart-concurrency"])
        assert page.evaluate("window.__pwned") is None
        page.goto(server.url)
        page.select_option("select[name=a]", "simple_add")
        page.select_option("select[name=b]", "xss")
        page.click("#compare button")
        assert_charts_drawn(page, ["chart-steps"])
        assert page.evaluate("window.__pwned") is None
        names = page.locator("#ops td.name").all_inner_texts()
        assert set(XSS_NAMES) <= set(names)
        assert errors == []
        page.close()
    finally:
        server.shutdown()
        server.server_close()


def overview_structure(page: Any) -> dict[str, Any]:
    """What a person sees on the overview, top to bottom: headings, cards, the breakdown's
    legend, in page order and each below the one before (structure, not pixels)."""
    assert_charts_drawn(page, ["chart-breakdown"])
    headings = page.locator("#view-overview h2")
    tops = [headings.nth(i).bounding_box()["y"] for i in range(headings.count())]
    assert tops == sorted(tops)
    chart = page.locator("#chart-breakdown").bounding_box()
    assert chart["width"] > 600 and chart["height"] > 250
    return {"headings": headings.all_inner_texts(),
            "cards": page.locator("#cards .label").all_inner_texts(),
            "legend": page.locator("#chart-breakdown g.legend text.legendtext").evaluate_all(
                "els => els.map(e => e.textContent)"),
            "bars": page.locator("#chart-breakdown g.trace.bars path").count()}


def test_overview_of_a_gpu_trace(browser: Any, corpus_runs: dict[str, Run],
                                 tmp_path: Path) -> None:
    out = html.write(report_data(corpus_runs["nccl"]), tmp_path / "gpu.html")
    page, errors = open_page(browser, out.as_uri())
    page.set_viewport_size({"width": 1400, "height": 1000})
    shape = overview_structure(page)
    assert shape == {
        "headings": ["Step-time breakdown", "Device and host states", "Iterations",
                     "Critical path per iteration"],
        "cards": ["step time", "throughput", "device utilization (rank 0)", "events"],
        "legend": ["device compute", "communication", "memory copy", "host compute", "idle"],
        "bars": 5 * 3}  # five categories over three steps
    assert len(page.screenshot(full_page=True)) > 50_000
    assert errors == []
    page.close()


def test_kernel_roofline_of_the_mi250_step(browser: Any, corpus_runs: dict[str, Run],
                                           tmp_path: Path) -> None:
    """MFU and HFU cards; the Kernels view's roofline: the roof and one marker per kernel with
    FLOPs, a table row per priced kernel; no console error."""
    data = report_data(corpus_runs["amd"])
    out = html.write(data, tmp_path / "amd.html")
    page, errors = open_page(browser, out.as_uri())
    cards = page.locator("#cards .label").all_inner_texts()
    assert "MFU (per rank)" in cards and "HFU (per rank)" in cards
    show(page, "kernels")
    assert_charts_drawn(page, ["chart-roofline"])
    kernels = data["op_cost"]["kernels"]
    priced = [k for k in kernels if k["flops"] > 0]
    assert page.locator("#chart-roofline g.trace.scatter").nth(1).locator(
        "path.point").count() == len(priced) > 0
    assert page.locator("#kernel-roofline tr").count() == 1 + len(kernels)
    assert errors == []
    page.close()


def test_memory_view(browser: Any, tmp_path: Path) -> None:
    """The allocation chart and the peak stacked by category, one bar per category."""
    data = report_data(memory_run(tmp_path))
    out = html.write(data, tmp_path / "memory.html")
    page, errors = open_page(browser, out.as_uri() + "#/memory")
    assert_charts_drawn(page, ["chart-memory", "chart-memory-peak"])
    assert page.locator("#chart-memory-peak g.trace.bars").count() == len(html.MEMORY_CATEGORIES)
    assert page.locator("#memory-peak tr").nth(1).locator("td").all_inner_texts()[3:] == [
        "8.8 KiB", "0 B", "8.0 KiB", "19.5 KiB"]  # 9,000, 0, 8,192 and 20,000 bytes
    assert errors == []
    page.close()


def test_overview_of_the_demo_trainer(browser: Any, trainer_run: Run, tmp_path: Path) -> None:
    """The CPU trainer: CPU words (no device utilization), data loading in the breakdown, and
    a model FLOP/s card from op cost (the trainer records shapes)."""
    data = report_data(trainer_run)
    out = html.write(data, tmp_path / "demo.html")
    page, errors = open_page(browser, out.as_uri())
    page.set_viewport_size({"width": 1400, "height": 1000})
    shape = overview_structure(page)
    assert shape["headings"] == ["Step-time breakdown", "Host states", "Iterations",
                                 "Critical path per iteration"]
    assert shape["cards"] == ["step time", "throughput", "samples/s (rank 0)",
                              "CPU busy (rank 0)", "model FLOP/s (per rank)", "events"]
    # the recorded --batch-size 8, as the recorder counted the DataLoader's batches (the
    # model's first conv2d reads 8 rows too, so the source names no other count)
    assert data["throughput"]["source"].startswith(
        "the samples of the batches the DataLoader handed each step")
    assert "the model's own count" not in data["throughput"]["source"]
    assert data["throughput"]["samples_per_step"] == 8
    assert "device compute" not in shape["legend"] and "data loading" in shape["legend"]
    assert shape["bars"] == len(shape["legend"]) * len(data["breakdown"])
    assert len(page.screenshot(full_page=True)) > 50_000
    assert errors == []
    page.close()
