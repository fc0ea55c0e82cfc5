"""The demo served on a free port, and a headless Chromium to look at pages (Debian's chromium, chromium-driver)."""

import os
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.paths import REPO_ROOT

# Debian's packages (apt-get install chromium chromium-driver; setup.sh installs them)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@contextmanager
def served_demo(command: list[str], log_path: Path, start_timeout: float = 120):
    """Run a demo/app.py command line (it must name a `--port`) until it answers over HTTP; yield its URL, then stop
    it."""
    port = command[command.index("--port") + 1]
    # this checkout's package, not the one installed: they differ in a git worktree
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": python_path}
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if server.poll() is not None:
                pytest.fail(f"the demo exited with {server.returncode}:\n{log_path.read_text()}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the demo did not answer within {start_timeout} s:\n{log_path.read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


@contextmanager
def headless_chromium(width: int = 1280, height: int = 1600, timeout: float = 90, offline: bool = False):
    """A real Chromium without a display, driven through Selenium; quit when the block ends. `offline`: every host
    name but 127.0.0.1 fails to resolve, so a page that fetches from anywhere else fails."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    arguments = ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"]
    if offline:
        arguments.append("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
    for argument in arguments:
        options.add_argument(argument)
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        browser.set_page_load_timeout(timeout)
        yield browser
    finally:
        browser.quit()
