"""Drives the web inspector (/ui/) in headless Chromium through WebDriver, against the real daemon
tests/inspector.rs started and filled. Usage: inspector.py SPEC.json (see tests/inspector.rs).

Each check clicks and reads the page as a person would: it waits for what should appear, and
fails naming what it did not see. On success it prints one JSON line, {"checks": [...]}, and
leaves the screenshot where the spec says; on failure it saves a screenshot beside it and the
browser's console.
"""

import json
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WAIT_S = 20

spec = json.load(open(sys.argv[1]))
checks = []


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = spec.get("chromium", "/usr/bin/chromium")
    for arg in [
        "--headless=new",
        # Root in a container has no user namespace sandbox to offer.
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1360,1180",
        "--force-device-scale-factor=1",
        "--lang=en-US",
        "--no-first-run",
        "--disable-extensions",
    ]:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager (which would download one) never runs.
    service = Service(executable_path=spec.get("chromedriver", "/usr/bin/chromedriver"))
    return webdriver.Chrome(service=service, options=options)


def wait_for(driver, what, condition, timeout=WAIT_S):
    try:
        # The page re-renders parts of itself (a live event refreshes the plugins table): an
        # element read as it is replaced is read again.
        wait = WebDriverWait(driver, timeout, poll_frequency=0.1,
                             ignored_exceptions=(StaleElementReferenceException,))
        return wait.until(lambda d: condition(d))
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout} s waiting for: {what}") from None


def css(driver, selector):
    return driver.find_elements(By.CSS_SELECTOR, selector)


def text(el):
    # textContent, not .text: it does not depend on layout or scrolling.
    return el.get_attribute("textContent")


def check(name, ok, detail):
    if not ok:
        raise AssertionError(f"{name}: {detail}")
    checks.append(name)


def no_script_errors(driver):
    """Uncaught exceptions and policy violations in the page fail the run."""
    bad = []
    for entry in driver.get_log("browser"):
        message = entry.get("message", "")
        if entry.get("source") in ("javascript", "security") or "Content Security Policy" in message:
            bad.append(message)
    check("no script errors or policy violations", not bad, f"the console says: {bad}")


def sessions_list(driver, url):
    driver.get(f"{url}/ui/")
    expected = spec["sessions"]
    for s in expected:
        wait_for(driver, f"session {s['id']} in the list",
                 lambda d, s=s: css(d, f"tr[data-session-id='{s['id']}']"))
    for s in expected:
        row = css(driver, f"tr[data-session-id='{s['id']}']")[0]
        agent = text(row.find_element(By.CSS_SELECTOR, "[data-testid=session-agent]"))
        steps = text(row.find_element(By.CSS_SELECTOR, "[data-testid=session-steps]"))
        check(f"session list: {s['id']} shows agent {s['agent']} and {s['steps']} steps",
              (agent, steps) == (s["agent"], str(s["steps"])), f"the row shows agent {agent!r}, steps {steps!r}")
    # The search keeps the sessions whose id or agent matches.
    agent = spec["search_agent"]
    box = driver.find_element(By.ID, "session-search")
    box.send_keys(agent)
    keep = {s["id"] for s in expected if s["agent"] == agent}
    wait_for(driver, f"the search for {agent!r} to leave only {sorted(keep)}",
             lambda d: {r.get_attribute("data-session-id") for r in css(d, "tr[data-testid=session-row]")} == keep)
    check(f"session search: `{agent}` leaves only its sessions", True, "")
    box.clear()
    box.send_keys(" ")  # an input event: back to every session
    wait_for(driver, "every session back after clearing the search",
             lambda d: len(css(d, "tr[data-testid=session-row]")) >= len(expected))


def session_timeline(driver):
    sid = spec["session"]
    css(driver, f"tr[data-session-id='{sid}'] a[data-testid=session-link]")[0].click()
    wait_for(driver, "the session's timeline", lambda d: css(d, "#timeline li[data-testid=event]"))
    kinds = [e.get_attribute("data-kind") for e in css(driver, "#timeline li[data-testid=event]")]
    check("timeline: the log's events in order", kinds[0] == "session/created" and kinds.count("step") == spec["steps"],
          f"kinds {kinds}")
    reasons = [text(r) for r in css(driver, "#timeline li[data-kind='request/header'] [data-testid=header-reason]")]
    check("timeline: header events marked with their reason", reasons == spec["header_reasons"],
          f"reasons {reasons}, expected {spec['header_reasons']}")
    links = css(driver, "#timeline li[data-kind=step] a[data-testid=step-link]")
    check("timeline: every step marker links to its step", len(links) == spec["steps"], f"{len(links)} links")
    shown = {row.get_attribute("data-step"): badge.get_attribute("data-outcome")
             for row in css(driver, "#steps-table tr[data-testid=step-row]")
             for badge in row.find_elements(By.CSS_SELECTOR, "[data-testid=cache-outcome]")}
    check("steps: each reply's cache outcome", shown == spec["cache"], f"shown {shown}, expected {spec['cache']}")
    in_timeline = [b.get_attribute("data-outcome") for b in
                   css(driver, "#timeline li[data-kind='assistant/message'] [data-testid=cache-outcome]")]
    check("timeline: the reply carries its cache outcome", in_timeline == list(spec["cache"].values()),
          f"timeline outcomes {in_timeline}")
    css(driver, "#steps-table tr[data-step='1'] a[data-testid=step-link]")[0].click()


def step_view(driver):
    wait_for(driver, "step 1's system parts", lambda d: css(d, "#system-parts [data-testid=system-part]"))
    system = " ".join(text(e) for e in css(driver, "#system-parts [data-testid=system-text]"))
    for phrase in spec["system_phrases"]:
        check(f"step view: the system text shows {phrase!r}", phrase in system, f"system text: {system!r}")
    for section, plugin in spec["sections"].items():
        parts = css(driver, f"#system-parts [data-section='{section}']")
        label = text(parts[0].find_element(By.CSS_SELECTOR, "[data-testid=part-label]")) if parts else ""
        check(f"step view: section `{section}` labelled with plugin `{plugin}`",
              parts and parts[0].get_attribute("data-plugin") == plugin and plugin in label,
              f"found {len(parts)} parts, label {label!r}")
    for tool, origin in spec["tools"].items():
        rows = css(driver, f"#tool-parts tr[data-tool='{tool}']")
        label = text(rows[0].find_element(By.CSS_SELECTOR, "[data-testid=part-label]")) if rows else ""
        check(f"step view: tool `{tool}` labelled {origin['plugin']} · {origin['scope']}",
              rows and rows[0].get_attribute("data-plugin") == origin["plugin"]
              and origin["plugin"] in label and origin["scope"] in label,
              f"found {len(rows)} rows, label {label!r}")
        body = css(driver, f"#request-pretty [data-testid=body-tool-label][data-tool='{tool}']")
        check(f"step view: tool `{tool}` labelled in the request body",
              body and origin["plugin"] in text(body[0]), f"{len(body)} labels in the body")

    # The request as sent, in each format: the exact bytes the API rebuilds.
    for fmt in ["openai", "anthropic", "openai-responses", "neutral"]:
        driver.find_element(By.CSS_SELECTOR, f"[data-testid='format-{fmt}']").click()
        wait_for(driver, f"the {fmt} request", lambda d, fmt=fmt: css(d, "#request h2")
                 and f"({fmt})" in text(css(d, "#request h2")[0]))
        raw = text(driver.find_element(By.ID, "request-raw"))
        sent = urllib.request.urlopen(
            f"{spec['url']}/v1/sessions/{spec['session']}/steps/1/request?format={fmt}").read().decode()
        check(f"step view: the {fmt} body is byte for byte the step's request", raw == sent,
              f"page {len(raw)} chars, API {len(sent)}")
        labels = css(driver, "#request-pretty [data-testid=body-tool-label]")
        check(f"step view: the {fmt} body labels every tool", len(labels) == len(spec["tools"]),
              f"{len(labels)} labels")


def diff_view(driver):
    driver.find_element(By.ID, "step-next").click()
    wait_for(driver, "step 2's diff", lambda d: css(d, "#diff [data-testid=prefix-summary]")
             and "Step 2" in text(d.find_element(By.ID, "step-title")))
    check("diff view: step 2 (only new messages) keeps the prefix", css(driver, "[data-testid=prefix-kept]"),
          text(driver.find_element(By.ID, "diff")))
    driver.find_element(By.ID, "step-next").click()
    n = spec["changed_step"]
    wait_for(driver, f"step {n}'s diff", lambda d: css(d, "#diff-causes [data-testid=diff-cause]")
             and f"Step {n}" in text(d.find_element(By.ID, "step-title")))
    tool = spec["changed_tool"]
    causes = css(driver, "#diff-causes [data-testid=diff-cause]")
    naming = [c for c in causes if f"tool {tool}" in " ".join(text(c).split())]
    check(f"diff view: a cause names the changed tool `{tool}`", naming, f"causes: {[text(c) for c in causes]}")
    check("diff view: that cause is highlighted as cache-breaking",
          naming[0].get_attribute("data-breaks") == "true" and "breaks" in naming[0].get_attribute("class"),
          naming[0].get_attribute("outerHTML"))
    check("diff view: the prefix is shown broken", css(driver, "[data-testid=prefix-broke]"),
          text(driver.find_element(By.ID, "diff")))
    row = css(driver, f"#tool-parts tr[data-tool='{tool}']")
    check(f"diff view: `{tool}` marked changed among the tools", row and "changed" in row[0].get_attribute("class"),
          row[0].get_attribute("outerHTML") if row else "no row")
    # Tall enough to hold the diff, the system parts and the tools with their labels.
    driver.set_window_size(1360, 1720)
    driver.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.3)  # let the resize paint before the picture
    driver.save_screenshot(spec["screenshot"])
    checks.append("screenshot saved")

    # Back to the first version: the step after has an earlier step's header again.
    same = spec["same_header"]
    driver.find_element(By.ID, "step-next").click()
    wait_for(driver, f"step {same['step']}'s diff", lambda d: f"Step {same['step']}" in text(d.find_element(By.ID, "step-title"))
             and css(d, "#diff [data-testid=prefix-summary]"))
    figure = css(driver, "[data-testid=same-header]")
    check(f"diff view: step {same['step']} names step {same['as']} as sending the same header",
          figure and f"same header as step {same['as']}" in text(figure[0]), text(driver.find_element(By.ID, "diff")))


def plugins_view(driver):
    driver.find_element(By.ID, "nav-plugins").click()
    wait_for(driver, "the plugins table", lambda d: css(d, "#plugins-table tr[data-testid=plugin-row]"))
    for plugin, sha in spec["plugins"].items():
        # Read in one script call: the table may be rebuilt between two WebDriver calls.
        row = driver.execute_script(
            "const r = document.querySelector(`#plugins-table tr[data-plugin='${arguments[0]}']`);"
            "return r && {state: r.querySelector('[data-testid=plugin-state]').textContent, text: r.textContent};",
            plugin)
        check(f"plugins: `{plugin}` loaded with its sha256",
              row and row["state"] == "loaded" and sha[:12] in row["text"], row or "no row")
    wait_for(driver, "the registry events replayed from the stream",
             lambda d: css(d, "#registry-events li[data-kind=reload]"))
    check("plugins: the registry events include the swap (reload)", True, "")
    # A live change: the stream shows it and the table follows, with no reload of the page.
    gone = spec["unload"]
    req = urllib.request.Request(f"{spec['url']}/v1/plugins/{gone}", method="DELETE")
    urllib.request.urlopen(req).read()
    wait_for(driver, f"a live `unload` event for {gone}",
             lambda d: [e for e in css(d, "#registry-events li[data-kind=unload]") if gone in text(e)])
    wait_for(driver, f"{gone} to leave the plugins table",
             lambda d: not css(d, f"#plugins-table tr[data-plugin='{gone}']"))
    check("plugins: a live unload arrives over SSE and updates the table", True, "")


def held_view(driver):
    url, sid, said = spec["held_url"], spec["held_session"], spec["held_said"]
    driver.get(f"{url}/ui/#/session/{sid}/step/2")
    wait_for(driver, "step 2's held changes", lambda d: css(d, "#held [data-testid=held-line]"))
    lines = [text(e) for e in css(driver, "#held [data-testid=held-line]")]
    check("held changes: the step page says what waits for a cold point", lines == said, repr(lines))


def gateway_view(driver):
    url, sid = spec["gateway_url"], spec["gateway_session"]
    driver.get(f"{url}/ui/#/session/{sid}/step/1")
    wait_for(driver, "the gateway panel", lambda d: css(d, "[data-testid=gateway-panel] [data-testid=gateway-upstream-body]"))
    client = text(css(driver, "[data-testid=gateway-client] pre")[0])
    check("gateway: the step page shows what the client sent, byte for byte", client == spec["gateway_client"], repr(client))
    parts = [e.get_attribute("data-part") for e in css(driver, "[data-testid=gateway-edit]")]
    check("gateway: the sections promptd added are listed", "sections" in parts, repr(parts))
    upstream = text(css(driver, "[data-testid=gateway-upstream-body]")[0])
    check("gateway: what went upstream is what the upstream received", upstream == spec["gateway_upstream"], repr(upstream[:200]))
    check("gateway: the upstream's reply is shown", bool(css(driver, "[data-testid=gateway-reply]")), "no reply panel")
    no_script_errors(driver)


def token(driver):
    url, secret = spec["token_url"], spec["token"]
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{url}/ui/")
    wait_for(driver, "the token form on a daemon with a token",
             lambda d: d.find_element(By.ID, "token-panel").is_displayed())
    check("token: a 401 asks for the token", True, "")
    box = driver.find_element(By.ID, "token-input")
    box.send_keys("not-the-token")
    driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    wait_for(driver, "the refusal of a wrong token", lambda d: d.find_element(By.ID, "token-error").is_displayed()
             and d.find_element(By.ID, "token-panel").is_displayed())
    check("token: a wrong token is refused", True, "")
    box.send_keys(secret)
    driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
    sid = spec["token_session"]
    wait_for(driver, "the sessions of the daemon with a token", lambda d: css(d, f"tr[data-session-id='{sid}']"))
    check("token: with the token the page reads the API", not driver.find_element(By.ID, "token-panel").is_displayed(),
          "the form is still open")
    stored = driver.execute_script("return sessionStorage.getItem('promptd.token')")
    check("token: kept in sessionStorage", stored == secret, repr(stored))


def usage_view(driver):
    """The usage page (K13): every number on it is the one `GET /v1/usage` answers."""
    url, days = spec["url"], spec["usage_days"]
    api = json.load(urllib.request.urlopen(f"{url}/v1/usage?days={days}&top=10"))
    driver.get(f"{url}/ui/#/usage?days={days}")
    wait_for(driver, "the usage page", lambda d: css(d, "[data-testid=usage-cost]"))

    def value(el):
        v = el.get_attribute("data-value")
        return None if v is None else float(v)

    def usd(x):
        return f"${x:.4f}"

    total = api["total"]
    tiles = {t: css(driver, f"[data-testid={t}]")[0] for t in
             ["usage-cost", "usage-replies", "usage-cached-share", "usage-miss-cost"]}
    seen = {t: (value(e), text(e)) for t, e in tiles.items()}
    want = {
        "usage-cost": (total["cost"]["total"], usd(total["cost"]["total"])),
        "usage-replies": (float(total["replies"]), str(total["replies"])),
        "usage-cached-share": (total["cached_share"], f"{total['cached_share'] * 100:.1f}%"),
        "usage-miss-cost": (total["cost"]["miss"], usd(total["cost"]["miss"])),
    }
    check("usage: the tiles show the API's spend, replies, cached share and miss cost", seen == want,
          f"page {seen}, API {want}")

    def bars(chart):
        return {(b.get_attribute("data-day"), b.get_attribute("data-series")): value(b)
                for b in css(driver, f"[data-testid={chart}] rect[data-testid=bar]")}

    by_agent = {(d["day"], a): s["cost"] for d in api["days"] for a, s in d["by_agent"].items() if s["cost"]}
    check("usage: each day's spend by agent is the API's, bar by bar", bars("spend-by-agent") == by_agent,
          f"page {bars('spend-by-agent')}, API {by_agent}")
    by_key = {(d["day"], k["key"] if k["key"] is not None else "(no key)"): k["cost"]
              for d in api["days"] for k in d["by_key"] if k["cost"]}
    check("usage: each day's spend by gateway key is the API's, the keyless as such", bars("spend-by-key") == by_key,
          f"page {bars('spend-by-key')}, API {by_key}")
    points = {p.get_attribute("data-day"): value(p) for p in css(driver, "[data-testid=share-chart] circle[data-testid=share-point]")}
    shares = {d["day"]: d["cached_share"] for d in api["days"] if d["cached_share"] is not None}
    check("usage: the share read from cache per day is the API's", points == shares and len(shares) > 1,
          f"page {points}, API {shares}")

    rows = {}
    for r in css(driver, "tr[data-testid=usage-day]"):
        cells = {c.get_attribute("data-testid"): value(c) for c in r.find_elements(By.CSS_SELECTOR, "td[data-value]")}
        rows[r.get_attribute("data-day")] = cells
    api_rows = {}
    for d in api["days"]:
        cells = {"replies": float(d["replies"]), "input": float(d["input_tokens"]),
                 "cost": d["cost"]["total"] if d["cost"] else 0.0}
        if d["cached_share"] is not None:
            cells["cached-share"] = d["cached_share"]
        for a in sorted({a for x in api["days"] for a in x["by_agent"]}):
            cells[f"agent-cost:{a}"] = d["by_agent"][a]["cost"] if a in d["by_agent"] else 0.0
        api_rows[d["day"]] = cells
    check("usage: the day table is the API's, day by day", rows == api_rows, f"page {rows}, API {api_rows}")

    def miss_rows(testid):
        out = {}
        for r in css(driver, f"[data-testid={testid}] tr[data-testid={testid}-row]"):
            out[r.get_attribute("data-name")] = tuple(
                value(r.find_element(By.CSS_SELECTOR, f"[data-testid={c}]")) for c in ["replies", "lost", "miss-cost"])
        return out

    causes = {k: (float(t["replies"]), float(t["lost_tokens"]), t["miss_cost"])
              for k, t in total["outcomes"].items() if k not in ("hit", "cold", "uncacheable")}
    check("usage: misses by cause with their cost are the API's", miss_rows("usage-causes") == causes and causes,
          f"page {miss_rows('usage-causes')}, API {causes}")
    plugins = {k: (float(t["replies"]), float(t["lost_tokens"]), t["miss_cost"]) for k, t in total["plugins"].items()}
    check("usage: misses by plugin with their cost are the API's", miss_rows("usage-plugins") == plugins and plugins,
          f"page {miss_rows('usage-plugins')}, API {plugins}")

    top = [(r.get_attribute("data-session-id"),
            value(r.find_element(By.CSS_SELECTOR, "[data-testid=cost]")),
            r.find_element(By.CSS_SELECTOR, "[data-testid=usage-step-link]").get_attribute("href").split("#", 1)[1])
           for r in css(driver, "tr[data-testid=usage-top-row]")]
    api_top = [(s["session"], s["cost"], f"/session/{s['session']}/step/{s['top_step']}") for s in api["top_sessions"]]
    check("usage: the most expensive sessions in the API's order, each linked to its costliest step",
          top == api_top and len(top) == len(spec["usage_sessions"]), f"page {top}, API {api_top}")
    unpriced = css(driver, "[data-testid=usage-unpriced]")
    named = text(unpriced[0]) if unpriced else ""
    check("usage: a model without a price is named as such",
          total["unpriced_models"] == spec["usage_unpriced"] and all(m in named for m in total["unpriced_models"]),
          f"notice {named!r}, API {total['unpriced_models']}")
    no_script_errors(driver)

    # The whole page in one picture.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1360, min(max(height + 40, 1200), 4000))
    driver.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.3)
    driver.save_screenshot(spec["screenshot"])
    checks.append("screenshot saved")

    # An agent chosen in the page: its numbers are the API's for that agent.
    agent = spec["usage_agent"]
    from selenium.webdriver.support.ui import Select
    Select(driver.find_element(By.ID, "usage-agent")).select_by_value(agent)
    wait_for(driver, f"the page for agent {agent}", lambda d: f"agent={agent}" in d.current_url
             and css(d, "[data-testid=usage-cost]"))
    scoped = json.load(urllib.request.urlopen(f"{url}/v1/usage?days={days}&top=10&agent={agent}"))
    want_top = [s["session"] for s in scoped["top_sessions"]]

    def scoped_page(d):
        # Read in one script call: the page is replaced as the new hash renders.
        return d.execute_script(
            "const c = document.querySelector('[data-testid=usage-cost]');"
            "return c && {cost: c.getAttribute('data-value'), top: [...document.querySelectorAll("
            "'tr[data-testid=usage-top-row]')].map((r) => r.getAttribute('data-session-id'))};")

    wait_for(driver, f"{agent}'s spend {scoped['total']['cost']['total']} and sessions {want_top}",
             lambda d: (p := scoped_page(d)) and p["cost"] is not None
             and float(p["cost"]) == scoped["total"]["cost"]["total"] and p["top"] == want_top)
    check(f"usage: the agent filter shows {agent}'s numbers", want_top and
          scoped["total"]["cost"]["total"] < total["cost"]["total"], f"API {scoped['total']}")

    # The costliest step of the most expensive session opens that step.
    first = api["top_sessions"][0]
    driver.get(f"{url}/ui/#/usage?days={days}")
    wait_for(driver, "the usage page again", lambda d: css(d, "[data-testid=usage-step-link]"))
    css(driver, "[data-testid=usage-step-link]")[0].click()
    wait_for(driver, f"step {first['top_step']} of {first['session']}",
             lambda d: css(d, "#step-title") and f"Step {first['top_step']}" in text(d.find_element(By.ID, "step-title")))
    check("usage: a session's costliest step link opens that step", first["session"] in driver.current_url, driver.current_url)
    no_script_errors(driver)


def main():
    driver = browser()
    try:
        if spec.get("mode") == "usage":
            usage_view(driver)
            print(json.dumps({"checks": checks, "browser": spec.get("chromium")}))
            return
        sessions_list(driver, spec["url"])
        session_timeline(driver)
        step_view(driver)
        diff_view(driver)
        plugins_view(driver)
        no_script_errors(driver)
        if spec.get("held_url"):
            held_view(driver)
        if spec.get("gateway_url"):
            gateway_view(driver)
        if spec.get("token_url"):
            token(driver)
    except Exception as e:
        failure = spec["screenshot"].replace(".png", "-failure.png")
        try:
            driver.save_screenshot(failure)
            console = driver.get_log("browser")
        except Exception:
            console = []
        print(f"inspector.py: {e}\n  at {driver.current_url}\n  screenshot: {failure}", file=sys.stderr)
        for entry in console:
            print(f"  console: {entry.get('level')} {entry.get('message')}", file=sys.stderr)
        print(f"  passed before it: {checks}", file=sys.stderr)
        sys.exit(1)
    finally:
        driver.quit()
    print(json.dumps({"checks": checks, "browser": spec.get("chromium")}))


main()
