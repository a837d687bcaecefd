"""Every error is a JSON ``{"detail": "..."}`` with a 4xx/5xx status, never an HTTP 200: which status when
is ``ERROR_RESPONSES`` (shown in ``/docs``); a 500 is a bug, its traceback in the log, not sent to the client.

Shedding answers 503, not 429: 429 says *this client* sent too many requests (a quota it can keep to by itself), while a
full queue is the *server's* state, whoever sent the requests; 503 with ``Retry-After`` is HTTP's "overloaded, come back
later", which proxies, load balancers and client retry policies already treat as retryable on another replica or later.
"""

import asyncio
import fcntl
import os
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servelab.core.preprocess import ImageError, ImageTooLarge
from servelab.core.procs import take_place
from servelab.servers.fastapi.schemas import ErrorResponse, Reloaded, ShedResponse, ValidationErrorResponse

# Retry-After of a shed request, in whole seconds (HTTP's unit; 1 is its least): a bounded queue drains
# within its bound times the service time, well under a second on the lab's stages.
SHED_RETRY_AFTER_S = 1
SHED_KEY = "servelab.shed"  # scope key: why the request was shed, for the metrics middleware to count
PREDICT_ROUTES = frozenset({"/predict", "/predict/batch"})  # what MAX_QUEUE_REQUESTS bounds, and reloads drain

ERROR_RESPONSES = {
    400: {"model": ErrorResponse, "description": "Invalid base64, not an image, a truncated, corrupt or tiny image, or empty input."},
    413: {"model": ErrorResponse, "description": "Body over MAX_BODY_BYTES, too many images, or an image declaring more "
                                                 "than MAX_IMAGE_PIXELS pixels."},
    422: {"model": ValidationErrorResponse, "description": "Malformed JSON or a body that does not match the schema."},
    503: {"model": ShedResponse, "description": "The model is not loaded and warmed up yet, a preprocessing worker "
                                                "process died while the request waited for it, or the request was shed "
                                                "(MAX_QUEUE_REQUESTS, MAX_QUEUE_DELAY_MS; `shed` says which): retry "
                                                "after Retry-After seconds."},
}

RELOAD_RESPONSES = {
    202: {"model": Reloaded, "description": "This process serves the new model; uvicorn is replacing the other server "
                                           "processes by ones started on it (`/ready`'s `workers.versions` says when)."},
    400: {"model": ErrorResponse, "description": "The body is not JSON (FastAPI cannot parse it)."},
    404: {"model": ErrorResponse, "description": "No model there (no manifest, or no file for the variant); the old one keeps serving."},
    401: {"model": ErrorResponse, "description": "No bearer token (`Authorization: Bearer <ADMIN_TOKEN>`)."},
    403: {"model": ErrorResponse, "description": "A wrong token, or a `model_dir` outside MODEL_ROOT; nothing was loaded."},
    409: {"model": ErrorResponse, "description": "Another reload is in progress, or the service is not ready yet."},
    422: {"model": ErrorResponse, "description": "The model failed to load or to warm up (a broken file, a GPU-only "
                                                "variant on the CPU), or the body does not match the schema; the old "
                                                "one keeps serving."},
}


class WorkerLost(RuntimeError):
    """A process working on this request died (HTTP 503, retry): a preprocessing worker (its pool was
    replaced), or the batcher process (``shared``) twice."""


class Overloaded(RuntimeError):
    """A request shed (HTTP 503, ``Retry-After``): ``reason`` is ``queue_full`` (refused on arrival) or
    ``queue_timeout`` (refused when it had waited past MAX_QUEUE_DELAY_MS, instead of served late)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _shed(scope: Scope, exc: Overloaded) -> JSONResponse:
    scope[SHED_KEY] = exc.reason
    body = ShedResponse(detail=str(exc), shed=exc.reason, retry_after_s=SHED_RETRY_AFTER_S)
    return JSONResponse(body.model_dump(), status_code=503, headers={"Retry-After": str(SHED_RETRY_AFTER_S)})


class QueueBoundMiddleware:
    """Counts prediction requests in flight by generation (``service.Generations``: a replaced model closes
    once those before the swap have answered) and, with a ``limit`` (MAX_QUEUE_REQUESTS), refuses one, its
    body unread, while ``limit`` others are in the service: held from arrival to answer, so the bound covers
    the wait for a preprocessing worker as well as for a batch (on the CPU either queue can be the one that grows).

    A refusal is answered ``hold_s`` after it was decided (SHED_HOLD_MS), at no cost while it waits: a client
    that ignores ``Retry-After`` and sends again at once would otherwise make refusals as fast as the service
    can answer them, taking the CPU the accepted requests need on a machine shared with its clients
    (benchmarks/retry_storm.py). Past ``max_holding`` waiting, one is answered at once, so a flood of
    connections cannot pile up in memory. Beside other server processes (``shared``: a file they share) the
    bound is the service's: a request holds one of its ``limit`` places (``procs.take_place``)."""

    def __init__(self, app: ASGIApp, generations, limit: int = 0, hold_s: float = 0.0, max_holding: int = 1024,
                 shared: Path | None = None):
        self.app, self.generations, self.limit, self.held = app, generations, limit, 0
        self.hold_s, self.max_holding, self.holding = hold_s, max_holding, 0
        self.places = None if shared is None or not limit else os.open(shared, os.O_RDWR | os.O_CREAT, 0o600)
        self.mine: set[int] = set()

    def _take(self) -> int | None:
        """A place for one more request (-1: no shared file), or None where the service holds ``limit`` already."""
        if self.places is None:
            return None if self.limit and self.held >= self.limit else -1
        return take_place(self.places, self.limit, self.mine)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PREDICT_ROUTES:
            await self.app(scope, receive, send)
            return
        if (place := self._take()) is None:
            full = Overloaded("queue_full", f"shed: the service holds {self.limit} requests and takes at most "
                                            f"{self.limit} (MAX_QUEUE_REQUESTS); it is overloaded, retry later")
            if self.hold_s and self.holding < self.max_holding:
                self.holding += 1
                try:
                    await asyncio.sleep(self.hold_s)
                finally:
                    self.holding -= 1
            await _shed(scope, full)(scope, receive, send)
            return
        self.held += 1
        generation = self.generations.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.held -= 1
            self.generations.leave(generation)
            if place >= 0:
                fcntl.lockf(self.places, fcntl.LOCK_UN, 1, place)
                self.mine.discard(place)


class BodyLimitMiddleware:
    """Refuses a body over ``limit`` bytes while it arrives: at once when its Content-Length says so,
    otherwise as soon as the bytes received pass the limit. The excess is never buffered."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    def _detail(self, size: str) -> str:
        return f"the request body is {size} bytes; at most {self.limit} are accepted (MAX_BODY_BYTES)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if (declared := Headers(scope=scope).get("content-length", "")).isdigit() and int(declared) > self.limit:
            await JSONResponse({"detail": self._detail(declared)}, status_code=413)(scope, receive, send)
            return
        received = 0

        async def receive_counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:  # raised inside the handler's body read: answered as JSON
                raise HTTPException(413, self._detail(f"at least {received}"))
            return message

        await self.app(scope, receive_counted, send)


def _describe(error: dict) -> str:
    where = ".".join(str(part) for part in error["loc"])
    reason = error.get("ctx", {}).get("error")
    return f"{where}: {error['msg']}" + (f" ({reason})" if reason else "")


async def _known_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, Overloaded):
        return _shed(request.scope, exc)
    if isinstance(exc, WorkerLost):
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "1"})
    return JSONResponse({"detail": str(exc)}, status_code=413 if isinstance(exc, ImageTooLarge) else 400)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # The offending input is not echoed back: it may be megabytes of base64.
    errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
    detail = "invalid request: " + "; ".join(_describe(e) for e in exc.errors())
    if (content_type := request.headers.get("content-type", "")) and "json" not in content_type:
        detail += f" (the body must be JSON, sent as Content-Type: application/json, not {content_type})"
    return JSONResponse({"detail": detail, "errors": errors}, status_code=422)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises after this response, so uvicorn logs the traceback once.
    return JSONResponse({"detail": f"internal server error ({type(exc).__name__})"}, status_code=500)


def install_error_handlers(app: FastAPI, generations, max_body_bytes: int, max_queue_requests: int = 0,
                           shed_hold_s: float = 0.0, shared_queue: Path | None = None) -> None:
    app.add_middleware(BodyLimitMiddleware, limit=max_body_bytes)
    # Outside the body limit: a shed request's body is never read.
    app.add_middleware(QueueBoundMiddleware, generations=generations, limit=max_queue_requests, hold_s=shed_hold_s,
                       shared=shared_queue)
    for known in (ImageError, WorkerLost, Overloaded):
        app.add_exception_handler(known, _known_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _internal_error)
