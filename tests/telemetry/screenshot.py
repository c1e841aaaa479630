"""Takes the screenshot of a promptd session in Arize Phoenix's UI, in headless Chromium through
WebDriver (the inspector test's selenium venv). Usage: screenshot.py SPEC_JSON, the spec being
{"url": PHOENIX, "span": SPAN_ID_HEX, "name": SPAN_NAME, "screenshot": PATH}.

It opens the span's page (its trace, with the span selected: the step whose story the picture
tells), waits for the span tree, opens the span's attributes, scrolls to `promptd.prefix.cause`,
and saves the screenshot. On failure it saves one beside it and prints what it did not see.
"""

import json
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

spec = json.loads(sys.argv[1])
WAIT_S = 60


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1360,1180", "--force-device-scale-factor=1", "--lang=en-US",
                "--no-first-run", "--disable-extensions"]:
        options.add_argument(arg)
    # An explicit driver path: Selenium Manager (which would download one) never runs.
    return webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)


def wait_for(driver, what, condition):
    try:
        wait = WebDriverWait(driver, WAIT_S, poll_frequency=0.2,
                             ignored_exceptions=(StaleElementReferenceException,))
        return wait.until(lambda d: condition(d))
    except TimeoutException:
        raise AssertionError(f"timed out after {WAIT_S} s waiting for: {what}") from None


def main():
    driver = browser()
    try:
        started = time.time()
        driver.get(f"{spec['url']}/redirects/spans/{spec['span']}")
        name = spec["name"]
        wait_for(driver, f"the span {name!r} in the trace's tree", lambda d: d.find_elements(
            By.XPATH, f"//*[normalize-space(text())='{name}']"))
        tab = wait_for(driver, "the span's Attributes tab", lambda d: [
            e for e in d.find_elements(By.CSS_SELECTOR, "[role=tab]") if e.text.strip() == "Attributes"])
        tab[0].click()
        # Key cells hold <wbr>: match on textContent.
        def key(d, text):
            return [e for e in d.find_elements(By.CSS_SELECTOR, ".json-table__key")
                    if e.get_attribute("textContent") == text]
        wait_for(driver, "the attribute gen_ai.request.model", lambda d: key(d, "gen_ai.request.model"))
        cause = key(driver, "promptd.prefix.cause")
        if not cause:
            raise AssertionError("the selected span has no promptd.prefix.cause in its table")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", cause[0])
        time.sleep(0.5)  # let the panel finish laying out
        driver.save_screenshot(spec["screenshot"])
        print(json.dumps({"seconds": round(time.time() - started, 1), "url": driver.current_url}))
    except Exception as e:
        failure = spec["screenshot"].replace(".png", "-failure.png")
        try:
            driver.save_screenshot(failure)
        except Exception:
            pass
        print(f"screenshot.py: {e}\n  at {driver.current_url}\n  screenshot: {failure}", file=sys.stderr)
        sys.exit(1)
    finally:
        driver.quit()


main()
