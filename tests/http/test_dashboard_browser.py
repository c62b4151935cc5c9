"""The dashboard in a real browser: Debian's Chromium, driven by Selenium, against the mock
served by uvicorn (``MockWhitney.serve``), while the GRPO loop trains two cycles on it.

Nothing is downloaded: the browser is ``/usr/bin/chromium`` and the driver
``/usr/bin/chromedriver`` (``Service(path)`` keeps Selenium Manager out of it). Under CI
(``CI=true``, as ``.ci/run`` sets it) a missing browser, driver or Selenium FAILS the test;
elsewhere it is skipped with the reason. Screenshots go to ``$WHITNEY_ARTIFACTS`` (default
``tests/artifacts/``, ignored by git).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ADAMW, API, ce_datum, new_run, text_tokens

CHROMIUM = os.environ.get("WHITNEY_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("WHITNEY_CHROMEDRIVER", "/usr/bin/chromedriver")
KEY, OTHER = "dashboard-key-one", "dashboard-key-two"
WAIT_S = 20.0  # the page polls once a second; everything below shows within a few polls


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return f"{path} not found (apt-get install {package})"
    return None


@pytest.fixture(scope="module")
def artifacts() -> Path:
    root = Path(__file__).resolve().parents[1] / "artifacts"
    folder = Path(os.environ.get("WHITNEY_ARTIFACTS") or root)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = _missing()
    if missing:
        if _in_ci():
            pytest.fail(f"the dashboard browser test needs Chromium under CI: {missing}",
                        pytrace=False)
        pytest.skip(f"no browser for the dashboard test: {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1440,1080", "--no-first-run",
                     "--disable-extensions", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


# -- reading the page (through small scripts: no stale elements between polls) ---------------
def wait_for(driver: Any, what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            status = js(driver, "return document.getElementById('status').textContent;")
            raise AssertionError(f"the page never showed {what} within {timeout:g} s "
                                 f"(page status: {status!r})")
        time.sleep(0.1)


def js(driver: Any, script: str, *args: Any) -> Any:
    return driver.execute_script(script, *args)


def timeline(driver: Any) -> list[dict[str, str]]:
    """The rows of the shown run's timeline, in page order."""
    return js(driver, """return [...document.querySelectorAll('#timeline tr.op')].map(r => ({
        seq: Number(r.dataset.seq), status: r.dataset.status, primitive: r.dataset.primitive,
        held_ms: r.dataset.heldMs || ''}));""")  # type: ignore[no-any-return]


def shown_run(driver: Any) -> str | None:
    return js(driver, "return document.getElementById('detail').dataset.runId || null;")


def curve_points(driver: Any, metric: str) -> int:
    found = js(driver, "const s = document.querySelector("
                       "`svg.curve[data-metric='${arguments[0]}']`);"
                       "return s ? Number(s.dataset.points) : -1;", metric)
    return int(found)


def select_run(driver: Any, run_id: str) -> None:
    wait_for(driver, f"run {run_id} in the session list", lambda: js(
        driver, "const a = document.querySelector(`.run-link[data-run-id='${arguments[0]}']`);"
                "if (a) { a.click(); return true; } return false;", run_id))
    wait_for(driver, f"run {run_id} in the detail", lambda: shown_run(driver) == run_id)


def enter_key(driver: Any, key: str) -> None:
    from selenium.webdriver.common.by import By

    wait_for(driver, "the key form", lambda: js(
        driver, "return !document.getElementById('login').hidden;"))
    field = driver.find_element(By.ID, "key-input")
    field.clear()
    field.send_keys(key)
    driver.find_element(By.ID, "key-submit").click()
    wait_for(driver, "a first answer for the key", lambda: js(
        driver, "return document.getElementById('status').textContent === 'live';"))


# -- the test ---------------------------------------------------------------------------------
def test_the_dashboard_shows_training_live(browser: Any, artifacts: Path) -> None:
    from grpo.algorithms import get_algorithm
    from grpo.client import WhitneyClient
    from grpo.config import LoopConfig
    from grpo.loop import CycleMetrics, train
    from grpo.tasks import ByteTokenizer, get_task
    from mock_server.testing import MockWhitney

    driver = browser
    started = time.monotonic()
    with MockWhitney.serve(api_keys=(KEY, OTHER), limits={"order_wait_ms": 60_000}) as whitney:
        driver.get(f"{whitney.base_url}/_mock/ui")
        assert driver.execute_script("return sessionStorage.length") == 0
        enter_key(driver, KEY)
        assert js(driver, "return sessionStorage.getItem('whitney-mock-dashboard-key')") == KEY
        wait_for(driver, "an empty session list", lambda: "no sessions" in js(
            driver, "return document.getElementById('sessions').textContent;"))
        whitney.inject_fault("latency", "capabilities", delay_ms=1, count=None)

        task = get_task("syllables")
        tokenizer = ByteTokenizer()
        config = LoopConfig(cycles=2, group_size=8, prompts_per_cycle=2, max_tokens=12,
                            skip_uniform_groups=True, base_model="whitney-mock/tiny-byte")
        client = WhitneyClient.connect(whitney.base_url, KEY)
        plain = httpx.Client(base_url=whitney.base_url, timeout=60,
                             headers={"Authorization": f"Bearer {KEY}"})
        grpo_run: dict[str, str] = {}

        def held_request_check() -> None:
            """On a second run (session with a TTL): seq 3 is sent before seq 2, from a thread;
            the page shows it held, then completed once seq 2 has executed."""
            handle = new_run(plain, ttl_seconds=600)
            handle.save(0)
            answers: dict[str, httpx.Response] = {}
            ahead = threading.Thread(target=lambda: answers.update(
                opt=handle.post("optim_step", {"adamw": ADAMW}, seq=3)))
            ahead.start()
            select_run(driver, handle.run_id)
            wait_for(driver, "seq 3 held", lambda: {"seq": 3, "status": "held",
                                                    "primitive": "optim_step", "held_ms": ""}
                     in timeline(driver))
            ttl = js(driver, "return document.querySelector("
                             "`.ttl[data-session-id='${arguments[0]}']`).textContent;",
                     handle.session_id)
            assert ttl.endswith(" left") and ttl.startswith(("9:", "10:0")), ttl
            driver.save_screenshot(str(artifacts / "dashboard-held.png"))
            fb = handle.post("forward_backward", {"loss_function": "cross_entropy",
                                                  "loss_config": {},
                                                  "data": [ce_datum(text_tokens("held"))]},
                             seq=2)
            ahead.join(30)
            assert fb.status_code == 200 and answers["opt"].status_code == 200
            rows = wait_for(driver, "seq 3 completed after its hold", lambda: (
                rows := timeline(driver)) and rows[-1]["status"] == "completed" and rows)
            assert [(r["seq"], r["primitive"], r["status"]) for r in rows] == [
                (1, "save_weights_for_sampler", "completed"),
                (2, "forward_backward", "completed"), (3, "optim_step", "completed")]
            assert rows[1]["held_ms"] == "" and float(rows[2]["held_ms"]) > 0
            assert curve_points(driver, "loss") == 1

        def on_cycle(metrics: CycleMetrics) -> None:
            """After each optimizer step of the GRPO run: the loss curve has one more point."""
            if not grpo_run:
                grpo_run["id"] = wait_for(driver, "the GRPO run", lambda: shown_run(driver))
            select_run(driver, grpo_run["id"])
            wait_for(driver, f"{metrics.step} loss points", lambda: all(
                curve_points(driver, m) == metrics.step
                for m in ("loss", "grad_norm", "update_norm")))
            if metrics.cycle == 0:
                held_request_check()

        try:
            result = train(client, [tokenizer.encode(p) for p in task.prompts], task.reward,
                           get_algorithm("grpo"), config, on_cycle=on_cycle)
        finally:
            client.close()
        assert result.run_id == grpo_run["id"] and len(result.metrics) == 2

        # the GRPO run's whole timeline, in seq order, exactly as the mock executed it
        select_run(driver, result.run_id)
        traced = whitney.trace(result.run_id)  # the run's entries (older mocks: by run id)
        trace = traced[result.run_id] if isinstance(traced, dict) else traced
        rows = wait_for(driver, "the finished GRPO run", lambda: js(
            driver, "return document.querySelector('#detail .badge').textContent;") ==
            "finished" and timeline(driver))
        assert [(r["seq"], r["primitive"], r["status"]) for r in rows] == [
            (e["seq"], e["primitive"], e["status"]) for e in trace]
        assert [r["seq"] for r in rows] == list(range(1, len(trace) + 1))
        assert curve_points(driver, "loss") == 2
        samples = js(driver, "return [...document.querySelectorAll('#samples .sample-text')]"
                             ".map(e => e.textContent);")
        assert samples and all(isinstance(text, str) for text in samples)
        versions = js(driver, "return [...document.querySelectorAll('#versions tr.version')]"
                              ".map(r => [...r.cells].map(c => c.textContent.trim()));")
        assert [v[:2] for v in versions] == [["0", "0"], ["1", "1"]]  # version, step taken at
        assert all("sample #" in v[3] for v in versions)  # which samples used which version
        fault_fired = js(driver, "return document.querySelector('#faults tr.fault td.num')"
                                 ".textContent;")
        assert fault_fired.split(" / ")[0] != "0", fault_fired
        driver.save_screenshot(str(artifacts / "dashboard.png"))
        first_key_ids = {result.session_id, result.run_id} | set(js(
            driver, "return [...document.querySelectorAll('[data-session-id],"
                                        " [data-run-id]')].map(e => e.dataset.sessionId ||"
                                        " e.dataset.runId);"))
        plain.close()

        # a second key: none of the first key's sessions, then only its own
        driver.find_element("id", "forget").click()
        enter_key(driver, OTHER)
        wait_for(driver, "no sessions for the second key", lambda: "no sessions" in js(
            driver, "return document.getElementById('sessions').textContent;"))
        page = driver.page_source
        assert not [found for found in first_key_ids if found in page]
        with httpx.Client(base_url=whitney.base_url,
                          headers={"Authorization": f"Bearer {OTHER}"}) as other:
            mine = other.post(f"{API}/sessions", json={"metadata": {"who": "second key"}}).json()
        shown = wait_for(driver, "the second key's session", lambda: js(
            driver, "return [...document.querySelectorAll('.session')]"
                    ".map(e => e.dataset.sessionId);"))
        assert shown == [mine["session_id"]]
        page = driver.page_source
        assert not [found for found in first_key_ids if found in page]
        driver.save_screenshot(str(artifacts / "dashboard-second-key.png"))
    elapsed = time.monotonic() - started
    print(f"dashboard browser test: {elapsed:.1f} s")
