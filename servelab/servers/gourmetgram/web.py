"""The GourmetGram Flask app: an upload form, the prediction, and failures in plain words.

``POST /classify`` takes an uploaded photo (field ``photo``) or a bundled sample (field ``sample``). ``GET /health`` is
the app's own liveness: it never calls the backend, so a stopped backend does not restart the front end. ``GET
/metrics`` counts predictions by route (stable or canary), model version and outcome, and how long the backend took.
"""

import base64
import io
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from flask import Flask, Request, Response, abort, render_template, request, send_file
from PIL import Image
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from servelab.core.artifacts import STAND_IN_NOTE
from servelab.core.paths import REPO_ROOT, sample_images
from servelab.core.preprocess import ImageError, ImageTooLarge, load_image
from servelab.core.settings import Settings, get_settings
from servelab.core.wire import SECONDS_BUCKETS
from servelab.servers.gourmetgram.services import CANARY, STABLE, BackendError, make_backend

# templates/ and static/ live beside the thin flask_app/app.py.
FLASK_DIR = REPO_ROOT / "flask_app"
# Room for the multipart envelope around a file of the largest accepted size.
FORM_OVERHEAD = 64 * 1024
PREVIEW_SIZE = (320, 320)
# Only the page's own files, plus the data: URL of the photo preview.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

log = logging.getLogger(__name__)


class _InMemoryRequest(Request):
    """Uploads stay in memory (MAX_CONTENT_LENGTH bounds them): no file is ever written."""

    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        return io.BytesIO()


def _preview(image: Image.Image) -> str:
    """A small JPEG of the photo as a data: URL, so the page shows what was classified."""
    small = image.copy()
    small.thumbnail(PREVIEW_SIZE)
    buf = io.BytesIO()
    small.save(buf, "JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _upload(samples: dict[str, Path], max_bytes: int) -> bytes:
    if name := request.form.get("sample", ""):
        if name not in samples:
            raise ImageError(f"there is no sample photo named {name!r}")
        return samples[name].read_bytes()
    if (upload := request.files.get("photo")) is None or not upload.filename:
        raise ImageError("no photo was sent; choose a file (or the sample photo) and press Classify")
    if len(data := upload.stream.read(max_bytes + 1)) > max_bytes:
        raise RequestEntityTooLarge()
    if not data:
        raise ImageError("the file is empty")
    return data


CLOSE_KEY = "servelab.close_connection"


def _drain_body() -> None:
    """Read what the view left unread of a body within the size limit (JSON sent to the form, a form
    refused early). gunicorn drains at most 64 kB of it, and otherwise closes the kept-alive connection
    without a word: the client's next request on it would fail. A body over the limit is not read (413):
    the answer says ``Connection: close`` instead (``_close_when_asked``)."""
    try:
        while request.stream.read(64 * 1024):
            pass
    except (HTTPException, OSError):  # over the limit, or the client went away
        request.environ[CLOSE_KEY] = True


def _close_when_asked(app):
    """WSGI middleware: where the app could not read a body to its end, tell gunicorn to answer with
    ``Connection: close`` (a hop-by-hop header the app itself may not set) so that no client sends its next
    request on a connection the server is about to drop. Elsewhere (Werkzeug's server) it changes nothing."""
    def wsgi_app(environ, start_response):
        def start(status, headers, exc_info=None):
            owner = getattr(start_response, "__self__", None)  # gunicorn's Response
            if environ.get(CLOSE_KEY) and callable(getattr(owner, "force_close", None)):
                owner.force_close()
            return start_response(status, headers, exc_info)

        return app(environ, start)

    return wsgi_app


def _metrics(canary_share: float) -> tuple[CollectorRegistry, Counter, Histogram]:
    """GourmetGram's own Prometheus series (its registry, not the process's): predictions by route, version and
    outcome, their latency, the canary's share."""
    registry = CollectorRegistry()
    predictions = Counter("gourmetgram_predictions", "Predictions asked of the backends, by route (stable, canary), "
                          "the model version that answered (empty where none did) and outcome (ok, busy: shed by "
                          "the backend, error).", ["route", "model_version", "outcome"], registry=registry)
    latency = Histogram("gourmetgram_prediction_duration_seconds", "Time the backend took to answer a prediction, "
                        "by route and the model version that answered.", ["route", "model_version"],
                        buckets=SECONDS_BUCKETS, registry=registry)
    Gauge("gourmetgram_canary_share", "The share of predictions sent to the canary (CANARY_SHARE; 0: none).",
          registry=registry).set(canary_share)
    for route in (STABLE, CANARY) if canary_share else (STABLE,):  # at 0 from the start, so rates are defined
        predictions.labels(route, "", "error")
    return registry, predictions, latency


def _answer_errors(app: Flask, page: Callable[..., str], max_mb: float) -> None:
    """Every failure answers with our page and its status, never Werkzeug's page or a traceback."""
    @app.errorhandler(ImageError)
    def bad_image(exc: ImageError):
        if isinstance(exc, ImageTooLarge):
            return page(error=f"This photo is too large to classify: {exc}."), 413
        return page(error=f"This file cannot be classified: {exc}."), 400

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(exc: RequestEntityTooLarge):
        return page(error=f"The file is larger than the {max_mb:g} MB upload limit."), 413

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        # Keep headers such as Allow (405); the body is our page, not Werkzeug's.
        headers = [(k, v) for k, v in exc.get_headers() if k.lower() != "content-type"]
        return page(error=f"{exc.code} {exc.name}."), exc.code, headers

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        # Logged with its traceback for the operator; the user gets plain words only.
        log.exception("unexpected error on %s %s", request.method, request.path)
        return page(error="Something went wrong inside GourmetGram. Try again; if it persists, "
                          "the operator will find the details in the app's log."), 500


def create_app(settings: Settings | None = None, root: Path = FLASK_DIR) -> Flask:
    """GourmetGram: an upload page that asks the configured backend for a class and shows the answer."""
    settings = settings or get_settings()
    app = Flask("gourmetgram", root_path=str(root))
    app.request_class = _InMemoryRequest
    app.wsgi_app = _close_when_asked(app.wsgi_app)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_upload_bytes + FORM_OVERHEAD
    backend = make_backend(settings)
    registry, predictions, latency = _metrics(settings.canary_share if settings.canary_url else 0.0)
    samples = {path.name: path for path in sample_images()}
    max_mb = settings.max_upload_bytes / 1024 / 1024
    page = partial(render_template, "index.html", backend=backend, samples=samples, max_mb=max_mb,
                   stand_in_note=STAND_IN_NOTE)
    _answer_errors(app, page, max_mb)

    @app.get("/")
    def index():
        return page()

    @app.post("/classify")
    def classify():
        data = _upload(samples, settings.max_upload_bytes)
        image = load_image(data, settings.max_image_pixels)  # ImageError: see bad_image
        preview = _preview(image)
        started = time.perf_counter()
        try:
            answer = backend.classify(data, image)
        except BackendError as exc:
            predictions.labels(exc.route, "", "busy" if exc.retry_after is not None else "error").inc()
            if exc.retry_after is not None:  # shed under load: a friendly "busy", not an error page
                log.info("backend %s is busy (shed the request); retry after %d s", backend.name, exc.retry_after)
                return page(busy=exc.message, preview=preview), exc.status, {"Retry-After": str(exc.retry_after)}
            log.warning("backend %s failed with %d: %s", backend.name, exc.status, exc.message)
            return page(error=exc.message, preview=preview), exc.status
        elapsed_ms = (time.perf_counter() - started) * 1000
        predictions.labels(answer.route, answer.version, "ok").inc()
        latency.labels(answer.route, answer.version).observe(elapsed_ms / 1000)
        return page(answer=answer, elapsed_ms=elapsed_ms, about=backend.about(), preview=preview)

    @app.get("/samples/<name>")
    def sample(name: str):
        if name not in samples:  # looked up by name: no path from the URL ever touches the disk
            abort(404)
        return send_file(samples[name], max_age=3600)

    @app.get("/health")
    def health():
        return {"status": "ok", "backend": backend.name}

    @app.get("/metrics")
    def prometheus():
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)

    @app.after_request
    def secure(response):
        response.headers.update(SECURITY_HEADERS)
        _drain_body()
        return response

    return app
