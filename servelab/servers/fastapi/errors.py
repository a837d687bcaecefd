"""Every error is a JSON ``{"detail": "..."}`` with a 4xx/5xx status, never an HTTP 200.

| status | when |
|---|---|
| 400 | invalid base64, bytes that are not an image, a truncated or corrupt image, empty input, a tiny image |
| 413 | a body over ``MAX_BODY_BYTES`` (refused while it is read), more than ``MAX_REQUEST_IMAGES`` images, or an image whose header declares more than ``MAX_IMAGE_PIXELS`` pixels (refused before decoding) |
| 422 | malformed JSON or a body that does not match the schema (``errors`` lists each problem) |
| 503 | the model is not loaded and warmed up yet, or a preprocessing worker process died under the request (``Retry-After``) |
| 500 | a bug; the traceback goes to the log, not to the client |
"""

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servelab.core.preprocess import ImageError, ImageTooLarge
from servelab.servers.fastapi.schemas import ErrorResponse, ValidationErrorResponse

ERROR_RESPONSES = {
    400: {"model": ErrorResponse, "description": "Invalid base64, not an image, a truncated or corrupt image, or empty input."},
    413: {"model": ErrorResponse, "description": "Body over MAX_BODY_BYTES, too many images, or an image declaring more "
                                                 "than MAX_IMAGE_PIXELS pixels."},
    422: {"model": ValidationErrorResponse, "description": "Malformed JSON or a body that does not match the schema."},
    503: {"model": ErrorResponse, "description": "The model is not loaded and warmed up yet, or a preprocessing worker "
                                                 "process died while the request waited for it (retry)."},
}


class PreprocessWorkerLost(RuntimeError):
    """A preprocessing worker process died under this request (HTTP 503); the pool was replaced."""


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
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
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


async def _image_error(request: Request, exc: ImageError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=413 if isinstance(exc, ImageTooLarge) else 400)


def _describe(error: dict) -> str:
    where = ".".join(str(part) for part in error["loc"])
    reason = error.get("ctx", {}).get("error")
    return f"{where}: {error['msg']}" + (f" ({reason})" if reason else "")


async def _worker_lost(request: Request, exc: PreprocessWorkerLost) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "1"})


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # The offending input is not echoed back: it may be megabytes of base64.
    errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
    detail = "invalid request: " + "; ".join(_describe(e) for e in exc.errors())
    content_type = request.headers.get("content-type", "")
    if content_type and "json" not in content_type:
        detail += f" (the body must be JSON, sent as Content-Type: application/json, not {content_type})"
    return JSONResponse({"detail": detail, "errors": errors}, status_code=422)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises after this response, so uvicorn logs the traceback once.
    return JSONResponse({"detail": f"internal server error ({type(exc).__name__})"}, status_code=500)


def install_error_handlers(app: FastAPI, max_body_bytes: int) -> None:
    app.add_middleware(BodyLimitMiddleware, limit=max_body_bytes)
    app.add_exception_handler(ImageError, _image_error)
    app.add_exception_handler(PreprocessWorkerLost, _worker_lost)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _internal_error)
