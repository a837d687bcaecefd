"""A server that does nothing: what servelab's client is measured against to find its own ceiling
(``servelab.measure.senders``).

    python -m servelab.measure.noop_server --port 8123

``POST .../predict`` reads the whole body and answers one prediction (the FastAPI services' shape, so the
client parses and checks it as it does theirs); ``POST /batch-<n>/predict/batch`` answers ``n`` of them;
``GET /ready`` answers 200. No decoding, no JSON parsing of the request: per request it costs far less than the
client's sending, so a closed loop against it measures the client. Several processes may share one port
(``SO_REUSEPORT``; ``senders.noop_server`` starts them), so that on a machine with many cores one server process is
not the limit either. aiohttp's server, with its C HTTP parser; aiohttp is the client's own dependency.
"""

import argparse
import json

from aiohttp import web

ONE = {"prediction": "Bread", "probability": 1.0, "class_index": 0}
_ONE = json.dumps(ONE).encode()
_JSON = "application/json"


async def predict(request: web.Request) -> web.Response:
    await request.read()  # the body is received whole, as a real server would
    return web.Response(body=_ONE, content_type=_JSON)


async def predict_batch(request: web.Request) -> web.Response:
    await request.read()
    size = int(request.match_info["size"])
    return web.Response(body=json.dumps({"predictions": [ONE] * size}).encode(), content_type=_JSON)


async def ready(_: web.Request) -> web.Response:
    return web.Response(body=b'{"ready": true}', content_type=_JSON)


def app() -> web.Application:
    application = web.Application(client_max_size=1 << 30)  # a Triton-sized tensor body is tens of MB at most
    application.router.add_post("/batch-{size:[0-9]+}/predict/batch", predict_batch)
    application.router.add_post("/predict", predict)
    application.router.add_post("/{prefix:.*}/predict", predict)
    application.router.add_get("/ready", ready)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(app(), host=args.host, port=args.port, reuse_port=True, access_log=None, print=None,
                handle_signals=True)


if __name__ == "__main__":
    main()
