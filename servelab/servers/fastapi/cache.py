"""A response cache in front of ``POST /predict`` (``CACHE_URL``, ``CACHE_TTL_S``), and the redis-server it uses.

The key is the sha256 of the *decoded* image bytes (a ``data:`` prefix or line breaks in the base64 do not matter) and
``cache_version`` (anything that changes an answer changes the key, a reload included). Each response says ``X-Cache:
hit``, ``miss`` or ``error``, also counted, so a load generator reads the hit ratio from the server.

Redis is an optimisation, never a dependency: when it does not answer (down, slow, refused) the model
answers, the failure is logged once (and once more when Redis is back), and Redis is left alone for
``RETRY_AFTER_S``, so an outage costs no request a timeout.
"""

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from fastapi import Response

from servelab.core.installers.opt_tools import ToolBinary
from servelab.core.installers.redis_install import RedisNotFound, locate
from servelab.core.preprocess import decode_base64
from servelab.core.procs import ChildServer, ServerProcess, free_port
from servelab.servers.fastapi.runtimes import Backend
from servelab.servers.fastapi.schemas import SERVING, PredictResponse

log = logging.getLogger("servelab.servers.fastapi")

HEADER = "X-Cache"
RESULTS = ("hit", "miss", "error")  # the metric's labels, and the header's values
# A lookup that takes longer than this is an outage, not a slow hit: the model answers instead.
TIMEOUT_S = 0.25
RETRY_AFTER_S = 1.0  # after a failure, requests skip Redis this long (counted as errors) before trying again


def cache_version(backend: Backend) -> str:
    """What the answers depend on besides the image (a GPU's kernels round differently)."""
    parts = {"runtime": backend.kind, "model": backend.version, "manifest": backend.manifest.sha256(),
             "gpu": backend.on_gpu, "dtype": backend.details.get("dtype", "")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Lookup:
    key: str | None
    answer: PredictResponse | None = None


class ResponseCache:
    """``lookup`` before the model, ``keep`` after it; with no ``url``, a miss that sets no header."""

    def __init__(self, url: str, ttl_s: float, counter):
        self.url, self.ttl_s, self.enabled = url, ttl_s, bool(url)
        self.counter = counter  # Metrics.cache, by result
        for result in RESULTS if self.enabled else ():  # at 0 from the start: a reader's first delta counts them all
            counter.labels(result)
        self._client = None
        self._down_until = 0.0
        self._down = False

    def start(self, backend: Backend) -> None:
        """Open the client (it connects on first use); ``backend``: for the log."""
        if not self.enabled:
            return
        # Deferred: an optional extra (serve), only with a response cache.
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError

        # One retry, on a lost connection only: a pooled connection from before a Redis restart fails once,
        # a fresh one then works. A timeout is not retried: the model answers instead, which is the retry.
        self._client = redis.Redis.from_url(self.url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
                                            retry=Retry(NoBackoff(), 1, supported_errors=(ConnectionError,)))
        log.info("response cache: %s, entries kept %g s, keyed on model version %s", self.url, self.ttl_s,
                 cache_version(backend))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _noted(self, response: Response, result: str, lookup: Lookup) -> Lookup:
        response.headers[HEADER] = result
        self.counter.labels(result).inc()
        return lookup

    def _failed(self, what: str, exc: Exception) -> None:
        self._down_until = time.monotonic() + RETRY_AFTER_S
        if not self._down:
            self._down = True
            log.warning("response cache: Redis at %s failed a %s (%s: %s); the model answers until it is back",
                        self.url, what, type(exc).__name__, exc)

    async def lookup(self, image: str, response: Response) -> Lookup:
        if not self.enabled:
            return Lookup(None)
        # The request's own model (a reload may swap another in while it runs): its answers, its keys.
        key = f"servelab:predict:{cache_version(SERVING.get())}:{hashlib.sha256(decode_base64(image)).hexdigest()}"
        if time.monotonic() < self._down_until:
            return self._noted(response, "error", Lookup(None))
        try:
            value = await self._client.get(key)
        except Exception as exc:  # any failure of the cache falls back to the model
            self._failed("lookup", exc)
            return self._noted(response, "error", Lookup(None))
        if self._down:
            self._down = False
            log.info("response cache: Redis at %s answers again", self.url)
        if value is None:
            return self._noted(response, "miss", Lookup(key))
        try:
            answer = PredictResponse.model_validate_json(value)
        except ValueError as exc:  # not ours, or from an older schema: ask the model, overwrite it
            self._failed("read (the entry is not a prediction)", exc)
            return self._noted(response, "error", Lookup(key))
        return self._noted(response, "hit", Lookup(key, answer))

    async def keep(self, lookup: Lookup, answer: PredictResponse) -> None:
        if lookup.key is None or time.monotonic() < self._down_until:
            return
        try:
            await self._client.set(lookup.key, answer.model_dump_json(), ex=max(1, round(self.ttl_s)))
        except Exception as exc:  # the answer is already made: a failed store costs only a later hit
            self._failed("store", exc)
            self.counter.labels("error").inc()


def find_redis(log=print) -> ToolBinary | None:
    """The redis-server to start, or None, saying so (the lab goes on without its cache stage)."""
    try:
        return locate()
    except RedisNotFound as exc:
        log(f"redis: not installed; cache stage skipped ({exc})")
        return None


class LocalRedis(ChildServer):
    """redis-server on 127.0.0.1, without persistence, stopped by its PID; ``url`` is what ``CACHE_URL`` takes."""

    def __init__(self, binary: ToolBinary, home: Path, port: int = 0, max_memory: str = "256mb"):
        self.home, self.port = Path(home), port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.home.mkdir(parents=True, exist_ok=True)
        # allkeys-lru: a full cache drops its least recently used answers rather than refusing new ones.
        self.process = ServerProcess(
            [str(binary.path), "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(self.home), "--maxmemory", max_memory, "--maxmemory-policy", "allkeys-lru"],
            None, self.home / f"redis-{self.port}.log", env=binary.env(), ready_timeout=30, stop_timeout=10,
            ready_check=self.answers)

    def client(self):  # for reading the cache back (tests, the lab)
        import redis  # deferred: an optional extra (serve), only with a response cache

        return redis.Redis.from_url(self.url, socket_timeout=5)

    def answers(self) -> bool:
        import redis  # deferred: an optional extra (serve), only with a response cache

        try:
            with self.client() as c:
                return bool(c.ping())
        except redis.RedisError:
            return False
