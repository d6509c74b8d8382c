"""The gateway's route table: where each model's calls go, built whole and never changed, so it can be swapped live.

A `RouteTable` holds what the routing file says (exact model names, glob patterns, A/B splits: `routing.py`),
the gateway's default upstream, and its pinned routers: replica pools handed to the gateway in code (the policy
being trained), whose weights version the trainer changes through the pool itself. `RouteTable.build` checks
everything (URLs, key variables, caches, splits) before the table exists: a bad table never serves.

A call reads the gateway's table once, when it arrives, and keeps that table to its last byte, so swapping the
gateway's table (`Gateway.set_routes`, done by its `LiveRoutes`) is one assignment: calls in flight finish on the table they started
with, later calls take the new one, and each call's span names its table (`semconv.ROUTE_TABLE`). The table's
`id` is a digest of what it routes, the same for the same table in any process; `generation` counts the swaps
of one gateway (1: the table it started with). A rate limit's state carries over to the new table when its
upstream keeps its name and its limit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

import agentgrad.gateway.routing as routing
from agentgrad.gateway.ab import ABSplit
from agentgrad.gateway.replicas import ReplicaPool
from agentgrad.gateway.upstreams import Backend, Upstream
from agentgrad.serving.metrics import Counts

log = logging.getLogger(__name__)

Routes = Mapping[str, "Backend | str | ABSplit"]
"""Model names and glob patterns -> upstreams (a `Backend`, or a URL) and model names -> A/B splits."""

_BACKEND_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Backend) if f.default is not dataclasses.MISSING}
_UNSHOWN = {"api_key", "headers", "rate_limit", "url", "api_key_env"}


class TableChanged(ValueError):
    """A table was set on the condition that the one serving had a given id, and another serves now."""


@dataclass(frozen=True)
class RouteTable:
    """One immutable routing of models to upstreams (see the module's docstring)."""

    upstreams: dict[str, Upstream]
    """Exact model names."""
    patterns: dict[str, Upstream]
    """Glob patterns (`claude-*`), tried in order after the exact names."""
    routers: dict[str, Any]
    """Model names -> A/B splits and replica pools, which pick an upstream per call."""
    default: Upstream | None
    default_router: ReplicaPool | None
    limiters: dict[str, routing.Limiter]
    backends: dict[str, Backend | str | ABSplit]
    """What it routes, as given (`Gateway.reroute` changes one model of it)."""
    spec: dict[str, Any]
    """The routing file this table is (`describe`), secrets left out."""
    id: str
    generation: int
    models_body: bytes
    """`/v1/models`'s answer."""
    applied_at: float = field(default_factory=time.time)

    @classmethod
    def build(
        cls,
        backends: Routes | None,
        *,
        default: Backend | str | ReplicaPool | None = None,
        routers: Mapping[str, Any] | None = None,
        generation: int = 1,
        previous: RouteTable | None = None,
    ) -> RouteTable:
        """A table from the gateway's arguments; ValueError naming what is wrong (a bad URL, a key variable not
        set, a cached policy, a model two routes claim) before anything is built."""
        backends = dict(backends or {})
        if not backends and default is None and not routers:
            raise ValueError("a gateway needs backends={model: Backend(url)} or default=Backend(url)")
        pinned = dict(routers or {})
        claimed = sorted(set(backends) & set(pinned))
        if claimed:
            raise ValueError(
                f"model(s) {claimed} are served by the trainer's replica pools, pinned in this gateway; "
                "a route table cannot route them elsewhere"
            )
        splits = {name: b for name, b in backends.items() if isinstance(b, ABSplit)}
        plain = {name: _backend(b) for name, b in backends.items() if not isinstance(b, ABSplit)}
        routed = {name: Upstream.of(name, backend) for name, backend in plain.items()}
        for name, upstream in routed.items():
            routing.check_cacheable(name, upstream.backend)
        default_router = default if isinstance(default, ReplicaPool) else None
        fallback = None
        if default is not None and not isinstance(default, ReplicaPool):
            fallback = Upstream.of("default", _backend(default))
        old = previous.limiters if previous is not None else {}
        limiters = {}
        for name, upstream in routed.items():
            limit = upstream.backend.rate_limit
            if limit is not None:
                kept = old.get(name)
                limiters[name] = kept if kept is not None and kept.limit == limit else routing.Limiter(name, limit)
        all_routers = {**splits, **pinned}
        exact = {name: u for name, u in routed.items() if not routing.is_pattern(name)}
        spec = describe(backends)
        identity = {
            "routes": spec,
            "default": _backend_entry(fallback.backend) if fallback is not None else None,
            "pinned": sorted(f"{name}:{type(r).__name__}" for name, r in pinned.items())
            + ([f"default:{type(default_router).__name__}"] if default_router is not None else []),
        }
        models = [
            {"id": n, "object": "model", "created": 0, "owned_by": u.backend.system} for n, u in exact.items()
        ] + [{"id": n, "object": "model", "created": 0, "owned_by": r.system} for n, r in all_routers.items()]
        return cls(
            upstreams=exact,
            patterns={name: u for name, u in routed.items() if routing.is_pattern(name)},
            routers=all_routers,
            default=fallback,
            default_router=default_router,
            limiters=limiters,
            backends=backends,
            spec=spec,
            id=hashlib.sha256(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12],
            generation=generation,
            models_body=orjson.dumps({"object": "list", "data": models}),
        )

    def route(self, model: str) -> tuple[Upstream | None, Any]:
        """The upstream named for `model` (exact, then patterns) and the router that picks one per call, if any."""
        named = self.upstreams.get(model) or routing.matching(model, self.patterns)
        router = self.routers.get(model) or (self.default_router if named is None else None)
        return named, router

    @property
    def models(self) -> list[str]:
        return [*self.upstreams, *self.routers]

    def summary(self, pinned: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What `GET /admin/routes` answers: the table's id, generation, routing file and what stays pinned."""
        return {
            "id": self.id,
            "generation": self.generation,
            "applied_at": self.applied_at,
            "routes": self.spec,
            "default": _backend_entry(self.default.backend) if self.default is not None else None,
            "pinned": sorted(pinned or {}) + (["(default)"] if self.default_router is not None else []),
        }


class LiveRoutes:
    """A gateway's route table serving now and its swaps, one at a time from any thread; each new table keeps the
    default upstream and the pinned replica pools the gateway was given in code."""

    def __init__(
        self,
        backends: Routes | None,
        *,
        default: Backend | str | ReplicaPool | None,
        routers: Mapping[str, Any] | None,
        swaps: Counts,
    ) -> None:
        self.pinned = dict(routers or {})  # replica pools handed in code: in every route table
        self.default = default
        self.table = RouteTable.build(backends, default=default, routers=self.pinned)
        """The route table serving now; `set` swaps it."""
        self._swaps = swaps  # the gateway's count of tables set, by outcome (`GatewayMetrics.swaps`)
        self._swapping = threading.Lock()

    def set(self, backends: Routes, if_id: str | None = None) -> RouteTable:
        """Serve `backends` (what `routing.load_routes` / `parse_routes` read: model names and patterns -> upstreams,
        A/B splits) from the next call on; calls in flight finish on the table they started with. The default
        upstream and the pinned replica pools stay. Safe from any thread (the admin route, an algorithm rolling
        back). A table that cannot serve raises ValueError with the reason, and the old one keeps serving;
        `if_id`: only if the table serving now is that one (else `TableChanged`)."""
        with self._swapping:
            if if_id is not None and if_id != self.table.id:
                self._swaps.add(("conflict",))
                raise TableChanged(
                    f"the route table is {self.table.id} (generation {self.table.generation}), not {if_id}: "
                    "it changed since you read it; read it again (`agentgrad gateway routes show`) and retry"
                )
            try:
                table = RouteTable.build(
                    backends,
                    default=self.default,
                    routers=self.pinned,
                    generation=self.table.generation + 1,
                    previous=self.table,
                )
            except ValueError:
                self._swaps.add(("refused",))
                raise
            self.table = table
            self._swaps.add(("applied",))
        log.info("route table %s (generation %d) serves from now on", table.id, table.generation)
        return table

    def set_from_file(self, table: Any, if_id: str | None = None) -> RouteTable:
        """`set` from a routing file already parsed (TOML's tables, or the same as JSON: the admin route's body); a
        file that does not read refuses the table the same way, with the reason."""
        try:
            backends = routing.parse_routes(table, "the route table")
        except ValueError:
            self._swaps.add(("refused",))
            raise
        return self.set(backends, if_id=if_id)

    def reroute(self, model: str, target: Backend | str | ABSplit) -> RouteTable:
        """Serve `model` from `target` from the next call on, every other route kept (`set`): how a serving gateway
        goes back to an earlier version (an upstream naming the best checkpoint's adapter)."""
        with self._swapping:
            backends = {**self.table.backends, model: target}
            current = self.table.id
        return self.set(backends, if_id=current)

    def summary(self) -> dict[str, Any]:
        """The table serving now: id, generation, routing file (no secrets), what stays pinned (`GET /admin/routes`)."""
        return self.table.summary(self.pinned)


def describe(backends: Routes) -> dict[str, Any]:
    """`backends` as a routing file (`[upstreams.NAME]`, `[ab.MODEL]`), as JSON: what `routing.parse_routes` reads
    back. A key given in code is not shown (a routing file names its variable: `key_env`)."""
    upstreams: dict[str, dict[str, Any]] = {}
    named: dict[int, str] = {}  # id(backend) -> its upstream's name: one backend serving several models is one

    def add(name: str, backend: Backend) -> str:
        if id(backend) in named:
            return named[id(backend)]
        unique, n = name, 1
        while unique in upstreams:
            n += 1
            unique = f"{name}-{n}"
        upstreams[unique] = _backend_entry(backend)
        named[id(backend)] = unique
        return unique

    splits: dict[str, Any] = {}
    for model, target in backends.items():
        if isinstance(target, ABSplit):
            arms = [add(arm, target.upstreams[arm].backend) for arm in target.arms]
            splits[model] = {
                "arms": arms,
                "share": {name: target.share[arm] for name, arm in zip(arms, target.arms)},
                "seed": target.seed,
            }
        else:
            upstreams[add(model, _backend(target))].setdefault("models", []).append(model)
    return {"upstreams": upstreams, "ab": splits} if splits else {"upstreams": upstreams}


def _backend(target: Backend | str) -> Backend:
    return target if isinstance(target, Backend) else Backend(target)


def _backend_entry(backend: Backend) -> dict[str, Any]:
    """One `[upstreams.NAME]` table: the URL, and every setting that is not the default."""
    entry: dict[str, Any] = {"url": backend.url}
    if backend.api_key_env:
        entry["key_env"] = backend.api_key_env
    for name, default in _BACKEND_DEFAULTS.items():
        value = getattr(backend, name)
        if name not in _UNSHOWN and value != default:
            entry[name] = value
    if backend.rate_limit is not None:
        for name, value in dataclasses.asdict(backend.rate_limit).items():
            if value is not None:
                entry[name] = value
    return entry
