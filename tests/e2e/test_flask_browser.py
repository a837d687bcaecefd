"""GourmetGram in a real headless browser (Debian's chromium driven by Playwright), with JavaScript
off: the container's gunicorn command serving the app in front of a real FastAPI ONNX service,
which is stopped and restarted on the same port while the app keeps running.
"""

import base64
import sys

import requests
from playwright.sync_api import Page, sync_playwright

from servelab.cli.serve import GUNICORN_OPTIONS
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.procs import ServerProcess, free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync", "--disable-quic"]
# What flask_app's container runs (see servelab/cli/serve.py).
GUNICORN = [sys.executable, "-m", "gunicorn", "--worker-class", GUNICORN_OPTIONS["worker_class"],
            "--workers", "2", "--threads", str(GUNICORN_OPTIONS["threads"]), "--no-control-socket"]


def fastapi_onnx(port: int, log, model_dir) -> ServerProcess:
    return ServerProcess([sys.executable, "-m", "servelab", "serve", "fastapi-onnx", "--port", str(port)],
                         f"http://127.0.0.1:{port}/ready", log, env={"MODEL_DIR": str(model_dir)})


def upload(page: Page, base: str) -> int:
    """Open the page, choose the bundled photo, press Classify; the status of the result page."""
    page.goto(base + "/")
    page.set_input_files("#photo", str(DEFAULT_IMAGE))
    with page.expect_navigation() as navigation:
        page.click("#submit")
    return navigation.value.status


def test_upload_in_a_browser_through_a_backend_outage(artifacts, tmp_path):
    api_port, app_port = free_port(), free_port()
    api_url, base = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{app_port}"
    model_dir = artifacts.manifest.parent
    app = ServerProcess([*GUNICORN, "--bind", f"127.0.0.1:{app_port}", "flask_app.app:app"], f"{base}/health",
                        tmp_path / "gunicorn.log", cwd=REPO_ROOT, ready_timeout=60,
                        env={"BACKEND": "fastapi", "FASTAPI_SERVER_URL": api_url, "BACKEND_TIMEOUT": "10"})
    api = fastapi_onnx(api_port, tmp_path / "fastapi-1.log", model_dir)
    with app, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_context(java_script_enabled=False).new_page()
        try:
            with api:
                photo = base64.b64encode(DEFAULT_IMAGE.read_bytes()).decode()
                expected = requests.post(f"{api_url}/predict", json={"image": photo}, timeout=60).json()["prediction"]
                assert upload(page, base) == 200
                assert page.inner_text("#label") == expected
                assert page.inner_text("#probability").endswith("%")
                assert "fastapi_onnx" in page.inner_text("#stage")
                assert float(page.inner_text("#elapsed").removesuffix(" ms")) > 0
                assert page.is_visible("img[src^='data:image/jpeg']")  # the photo that was classified

                page.goto(base + "/")  # the bundled sample photo, without choosing a file
                with page.expect_navigation() as navigation:
                    page.click(f"button[name=sample][value='{DEFAULT_IMAGE.name}']")
                assert navigation.value.status == 200 and page.inner_text("#label") == expected

            assert upload(page, base) == 502  # the backend is stopped; the app is not
            assert "cannot be reached" in page.inner_text("#error")
            assert page.locator("#label").count() == 0

            with fastapi_onnx(api_port, tmp_path / "fastapi-2.log", model_dir):  # back, on the same port
                assert upload(page, base) == 200
                assert page.inner_text("#label") == expected
        finally:
            browser.close()
