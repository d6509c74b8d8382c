"""The gateway's front end: an OpenAI-compatible ASGI app that routes each call and records it.

Agents call `/v1/chat/completions`, `/v1/responses`, `/v1/completions`, `/v1/messages` (Anthropic's, in
`messages.py`) or `/v1/models`, under
`/rollouts/{rollout_id}/attempts/{attempt_id}` (what `LLM.for_attempt` hands them) and/or
`/agents/{name}` (the agent making the call), or at the root with the
`x-agentgrad-rollout-id` / `x-agentgrad-attempt-id` / `x-agentgrad-agent` headers. The
headers win when both are given: they are set per call, the path only when the client was
built. Calls with neither are recorded outside any rollout.

The gateway asks an upstream that can give them (the engine, vLLM) for token ids and logprobs
(vLLM's `return_token_ids`, `logprobs`), records them, and strips what it added, so the client
gets the response it asked for; any other upstream gets the client's request as it was.
Responses API calls are recorded in the shape chat completions are (`responses.py`). Calls go upstream through
`forwarding.py` (each within one deadline, retried only where no byte of an answer exists yet; whatever goes wrong
there, the agent gets an OpenAI-style JSON error) and answers come back through `relay.py`; spans are built after the
last byte went to the client and written in background batches (`recording.py`). The hot path is a bare ASGI app: no
framework routing, orjson, one pooled aiohttp session. A call the agent hangs up on is cancelled upstream, and
recorded as such.

With a sampling plan (`set_sampling`, `sampling.RolloutSampling`), calls made inside a rollout run with the
trainer's temperature, top-p and `max_tokens` for that rollout's mode (read from the store once per rollout).
The route table can be swapped live (`set_routes`, `reroute`, `PUT /admin/routes`: `table.LiveRoutes`).

`POST …/v1/agentgrad/flush` returns once every call answered so far is in the store: the
runner calls it on each proxied LLM's route before it closes an attempt (the flush barrier).

Standalone: `agentgrad gateway`, or `ServerThread(Gateway(store, backends))`. On a store
server: `routes=[*store_routes, *gateway.routes()]` or `Mount("/gateway", gateway)`; mounted
apps get no lifespan events, so the host calls `await gateway.aclose()` when it shuts down.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import orjson

import agentgrad.gateway.admin as admin
import agentgrad.gateway.messages as messages
import agentgrad.gateway.routing as routing
from agentgrad import semconv as sc
from agentgrad.gateway.ab import ABSplit
from agentgrad.gateway.admin import HEALTH_PATH, ROUTES_PATH
from agentgrad.gateway.forwarding import forward
from agentgrad.gateway.metrics import GatewayMetrics
from agentgrad.gateway.recording import Call, GatewaySink
from agentgrad.gateway.relay import Recorder, reject, send_error, send_json
from agentgrad.gateway.replicas import ReplicaPool
from agentgrad.gateway.sampling import RolloutSampling, SamplingPlan
from agentgrad.gateway.table import LiveRoutes, RouteTable
from agentgrad.gateway.upstreams import MAX_RETRIES, RETRY_BACKOFF_SECONDS, Backend, GatewayError
from agentgrad.semconv import CHAT_COMPLETIONS_API, COMPLETIONS_API, MESSAGES_API, RESPONSES_API
from agentgrad.serving.guard import MAX_BODY_BYTES, BodyTooLarge, bearer_ok, expected_authorization, read_body
from agentgrad.serving.metrics import METRICS_PATH, ROUTE_KEY, ServerMetrics, counted
from agentgrad.store import Store

MAX_UPSTREAM_CONNECTIONS = 1024

_ROUTE = re.compile(
    r"(?:/rollouts/(?P<rollout>[^/]+)/attempts/(?P<attempt>[^/]+))?"
    r"(?:/agents/(?P<agent>[^/]+))?"
    r"/v1/(?P<endpoint>chat/completions|completions|responses|messages|models|" + re.escape(sc.FLUSH_ENDPOINT) + r")/?"
)
_APIS = {
    "chat/completions": CHAT_COMPLETIONS_API,
    "completions": COMPLETIONS_API,
    "responses": RESPONSES_API,
    "messages": MESSAGES_API,
}
_ROUTE_LABELS = {endpoint: f"/v1/{endpoint}" for endpoint in (*_APIS, "models", sc.FLUSH_ENDPOINT)}
"""A call's route label for its HTTP metrics: its endpoint, whatever rollout or agent its path names."""
_ROLLOUT_KEY, _ATTEMPT_KEY, _AGENT_KEY = (
    sc.ROLLOUT_HEADER.encode(),
    sc.ATTEMPT_HEADER.encode(),
    sc.AGENT_HEADER.encode(),
)
_NOT_TRAINED_KEY = sc.NOT_TRAINED_HEADER.encode()
_TOOL_RUNS_TRACED_KEY = sc.TOOL_RUNS_TRACED_HEADER.encode()


class Gateway:
    """An ASGI app proxying OpenAI-compatible calls to `backends` (model name → upstream) and recording them.

    A name with `*`, `?` or `[` is a glob pattern (`claude-*`), tried in order after the exact names
    (`routing.load_routes` reads such a table from a file; an `ab.ABSplit` in it serves its model as a router).
    `default` (a backend or a replica pool) serves models
    missing from the table; without it they get a 404 naming the known
    ones. `routers` (model → `agentgrad.gateway.replicas.ReplicaPool`) pick a replica per call and name the
    weights version it runs. With `token`, callers must send `Authorization: Bearer <token>` (their API key).

    Each call has one deadline (`upstreams.Deadline`): `connect_timeout_s`, `first_byte_timeout_s` and
    `timeout_s` (the whole call), given here for every upstream or per `Backend`. A call past it gets a
    504 and its upstream request is cancelled, as it is when the agent hangs up.
    """

    def __init__(
        self,
        store: Store,
        backends: Mapping[str, Backend | str | ABSplit] | None = None,
        *,
        default: Backend | str | ReplicaPool | None = None,
        token: str | None = None,
        max_retries: int = MAX_RETRIES,
        retry_backoff_s: float = RETRY_BACKOFF_SECONDS,
        close_store: bool = False,
        routers: Mapping[str, Any] | None = None,
        connect_timeout_s: float | None = None,
        first_byte_timeout_s: float | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.store = store
        self.counts = GatewayMetrics(lambda: self.table)
        self._live = LiveRoutes(backends, default=default, routers=routers, swaps=self.counts.swaps)
        self.cache = routing.ResponseCache()
        """Answers of upstreams with `cache=True` (judges, critics; never the policy)."""
        self.metrics = ServerMetrics()
        """Prometheus metrics served at `/metrics`: HTTP requests, and the gateway's calls (`gateway.metrics`)."""
        self.metrics.add(self.counts)  # collects once now: the table must exist
        self._count_http = True  # off when mounted on a host that counts its requests (`routes`)
        self.token = token
        self._auth = expected_authorization(token)
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.timeouts = (connect_timeout_s, first_byte_timeout_s, timeout_s)
        """(connect, first byte, total) in seconds overriding every backend's own; None: the backend's."""
        for name, value in zip(("connect_timeout_s", "first_byte_timeout_s", "timeout_s"), self.timeouts):
            if value is not None and not value > 0:
                raise ValueError(f"{name} is a number of seconds above 0, not {value!r}")
        self._close_store = close_store
        self._session: Any = None
        self._recorder: Recorder | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sampling = RolloutSampling(store)

    def set_sampling(self, plan: SamplingPlan | None) -> None:
        """Apply `plan` (the trainer's sampling per rollout mode) to every later call made inside a rollout."""
        self._sampling.plan = plan

    @property
    def _recording(self) -> Recorder:
        """What records the calls (made by `start`, which runs before any call is proxied)."""
        assert self._recorder is not None, "the gateway records calls once started"
        return self._recorder

    @property
    def table(self) -> RouteTable:
        """The route table serving now; `set_routes` swaps it (`table.LiveRoutes`)."""
        return self._live.table

    @property
    def models(self) -> list[str]:
        return self.table.models

    def set_routes(self, backends: Mapping[str, Backend | str | ABSplit], if_id: str | None = None) -> RouteTable:
        """Serve `backends` from the next call on, calls in flight keeping their table; from any thread; ValueError
        with the reason if it cannot serve, `TableChanged` if `if_id` no longer serves (`LiveRoutes.set`)."""
        return self._live.set(backends, if_id)

    def set_routing_file(self, table: Any, if_id: str | None = None) -> RouteTable:
        """`set_routes` from a routing file already parsed (`LiveRoutes.set_from_file`: the admin route's body)."""
        return self._live.set_from_file(table, if_id)

    def reroute(self, model: str, target: Backend | str | ABSplit) -> RouteTable:
        """Serve `model` from `target` from the next call on, every other route kept (`LiveRoutes.reroute`)."""
        return self._live.reroute(model, target)

    def route_summary(self) -> dict[str, Any]:
        """What `GET /admin/routes` answers of the table serving now (`LiveRoutes.summary`)."""
        return self._live.summary()

    def routes(self) -> list[Any]:
        """Starlette routes serving the gateway at the root of a host app (a store server); the host counts their
        requests, and its `/metrics` shows the gateway's when it shares `self.metrics` (`create_app(metrics=...)`)."""
        from starlette.routing import Route

        self._count_http = False
        return [
            Route(ROUTES_PATH, self, methods=["GET", "PUT"]),
            Route("/v1/{path:path}", self),
            Route("/agents/{agent}/v1/{path:path}", self),
            Route("/rollouts/{rollout_id}/attempts/{attempt_id}/v1/{path:path}", self),
            Route("/rollouts/{rollout_id}/attempts/{attempt_id}/agents/{agent}/v1/{path:path}", self),
        ]

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the upstream connection pool and the span writer on the running loop (done on first use)."""
        if self._session is not None:
            return
        import aiohttp

        self._loop = asyncio.get_running_loop()
        self._recorder = Recorder(GatewaySink(self.store, self._loop), self.counts)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=MAX_UPSTREAM_CONNECTIONS, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=None),  # each call sets its own (`Deadline`)
            skip_auto_headers=("User-Agent",),
        )

    async def flush(self) -> None:
        """Return once every call answered so far is in the store. Safe from any event loop."""
        if self._loop is None or self._recorder is None:
            return
        if asyncio.get_running_loop() is not self._loop:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.flush(), self._loop))
            return
        await self._recorder.drain()

    async def aclose(self) -> None:
        """Write the spans still buffered and close the connection pool (and the store, if owned)."""
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.aclose(), self._loop))
            return
        if self._session is not None:
            await self.flush()
            await self._session.close()
            self._session = None
        if self._close_store:
            await self.store.close()

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        if path == HEALTH_PATH:  # public, like the store's: it says only that the gateway is up (a probe's route)
            return await send_json(send, 200, b'{"status":"ok"}')
        headers = dict(scope["headers"])
        authorization = headers.get(b"authorization")
        if authorization is None and b"x-api-key" in headers:  # the anthropic SDK sends its key so
            authorization = b"Bearer " + headers[b"x-api-key"]
        if not bearer_ok(authorization, self._auth):  # before routing: no route is told to strangers
            message = "this gateway needs `Authorization: Bearer <token>`: use the gateway's token as the API key"
            return await reject(send, 401, message, "invalid_api_key")
        if self._count_http:
            await counted(
                scope,
                send,
                self.metrics,
                "gateway",
                lambda sending: self._serve(scope, receive, sending, path, headers),
            )
        else:
            await self._serve(scope, receive, send, path, headers)

    async def _serve(
        self, scope: dict[str, Any], receive: Any, send: Any, path: str, headers: dict[bytes, bytes]
    ) -> None:
        """Route a request the guard and the token let through: a model call, `/v1/models`, the flush, `/metrics`,
        the route table (`admin.py`)."""
        method = scope["method"]
        if path == METRICS_PATH and method == "GET":
            scope[ROUTE_KEY] = METRICS_PATH
            return await self.metrics.serve(send)
        if path == ROUTES_PATH:
            scope[ROUTE_KEY] = ROUTES_PATH
            await self.start()
            return await admin.serve_routes(self, method, receive, send)
        match = _ROUTE.fullmatch(path)
        if match is None:
            return await reject(
                send,
                404,
                f"no gateway route {path!r}; use /v1/chat/completions, /v1/responses, /v1/completions, /v1/messages "
                "or /v1/models, "
                "optionally under /rollouts/{rollout_id}/attempts/{attempt_id} and /agents/{name}",
                "not_found",
            )
        endpoint = match["endpoint"]
        scope[ROUTE_KEY] = _ROUTE_LABELS[endpoint]
        expected = "GET" if endpoint == "models" else "POST"
        if method != expected:
            error = GatewayError(
                405, f"{path} takes {expected}, not {method}", "invalid_request_error", "method_not_allowed"
            )
            return await send_error(send, error, extra=[(b"allow", expected.encode())])
        await self.start()
        if endpoint == "models":
            await send_json(send, 200, self.table.models_body)
        elif endpoint == sc.FLUSH_ENDPOINT:
            await self.flush()
            await send_json(send, 200, b'{"flushed":true}')
        else:
            await self._proxy(_APIS[endpoint], match, headers, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _proxy(
        self, api: str, match: re.Match[str], headers: dict[bytes, bytes], receive: Any, send: Any
    ) -> None:
        started, start_time = time.perf_counter(), time.time()
        rollout, attempt = headers.get(_ROLLOUT_KEY), headers.get(_ATTEMPT_KEY)
        if (rollout is None) != (attempt is None):
            return await reject(
                send, 400, f"send both {sc.ROLLOUT_HEADER} and {sc.ATTEMPT_HEADER}, or neither", api=api
            )
        if rollout is not None:
            rollout_id, attempt_id = rollout.decode("latin-1"), attempt.decode("latin-1")  # type: ignore[union-attr]
        else:
            rollout_id, attempt_id = match["rollout"], match["attempt"]
        named = headers.get(_AGENT_KEY)  # the header wins over the route, like the attempt's
        if named is not None:
            agent: str | None = named.decode("utf-8", "replace")
        else:
            agent = unquote(match["agent"]) if match["agent"] else None
        try:
            body = await read_body(receive, MAX_BODY_BYTES)
        except BodyTooLarge as exc:
            return await reject(send, 413, str(exc), "request_too_large", api=api)
        if body is None:
            return  # the agent hung up
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return await reject(send, 400, f"request body is not valid JSON: {exc}", api=api)
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            return await reject(
                send, 400, "request body must be a JSON object with a 'model' string", "invalid_model", api=api
            )
        call = Call(
            api, request, None, rollout_id, attempt_id, agent or None, headers.get(b"traceparent"), started, start_time
        )
        call.route_table = self.table.id
        call.tool_runs_traced = _TOOL_RUNS_TRACED_KEY in headers
        if api == MESSAGES_API:
            call.relayed_headers = messages.relayed_headers(headers)
        if rollout_id is not None and _NOT_TRAINED_KEY not in headers:  # a judge keeps its own
            applied = await self._sampling.apply(api, request, rollout_id, attempt_id)
            if applied is not None:
                call.sampling = applied
        if _NOT_TRAINED_KEY in headers:  # a judge's call: recorded, never trained on
            call.sampling[sc.NOT_TRAINED] = headers[_NOT_TRAINED_KEY].decode("utf-8", "replace") or "yes"
        # The call runs as its own task while this one waits for the agent to hang up: if it does, the
        # upstream request is cancelled (its connection closed) rather than left running for nobody.
        work = asyncio.ensure_future(  # with the table it keeps to its end
            forward(
                call,
                send,
                self.table,
                session=self._session,
                recorder=self._recording,
                cache=self.cache,
                timeouts=self.timeouts,
                max_retries=self.max_retries,
                backoff_s=self.retry_backoff_s,
            )
        )
        self.counts.in_flight += 1
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.counts.in_flight -= 1
            gone.cancel()
            if not work.done():
                work.cancel()
                try:
                    await work
                except asyncio.CancelledError:
                    pass
                if not call.recorded:
                    self._recording.begin()
                    self._recording.record(
                        call,
                        {},
                        GatewayError(
                            499,
                            "the agent closed the connection before the answer "
                            "was complete; the upstream request was cancelled",
                            "client_error",
                            "client_disconnected",
                        ),
                        0,
                    )
        if not work.cancelled():
            work.result()  # a failure of the gateway's own surfaces as before (the server answers 500)


async def _disconnected(receive: Any) -> None:
    """Return when the agent hangs up (after its body was read, `receive` says nothing else)."""
    while (await receive())["type"] != "http.disconnect":
        pass
