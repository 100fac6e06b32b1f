"""Prometheus metrics of the service (``GET /metrics``), in a registry of the app's own.

- ``regis_http_requests_total{method, route, status}`` and ``regis_http_request_duration_seconds{method, route}``:
  per route template (``/v1/images/{image_id}``, "unmatched" for no route), so ids never become labels; methods
  outside ``METHODS`` count as "other" (invented methods from unauthenticated clients must not add label values:
  5,000 of them made 13.8 MB of /metrics, issue 27 item 6).
- ``regis_search_stage_seconds{stage}``: decode, encode, candidates, rerank, total of computed searches.
- ``regis_cache_requests_total{result}``: query cache hit, miss, error.
- ``regis_index_version``, ``regis_index_images``, ``regis_index_swaps_total``: what is served.
- ``regis_jobs{state}``: recent jobs per state; ``regis_redis_up``: Redis reachable (1) or not (0).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # the method label's values


class Metrics:
    """The service's metrics (one instance per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("regis_http_requests", "HTTP requests", ["method", "route", "status"], registry=r)
        self.latency = Histogram("regis_http_request_duration_seconds", "HTTP request latency, seconds",
                                 ["method", "route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.search_stage = Histogram("regis_search_stage_seconds", "Search time per stage, seconds", ["stage"],
                                      buckets=_LATENCY_BUCKETS, registry=r)
        self.cache = Counter("regis_cache_requests", "Query cache lookups", ["result"], registry=r)
        self.index_version = Gauge("regis_index_version", "Index version served (0: none yet)", registry=r)
        self.index_images = Gauge("regis_index_images", "Images in the index version served", registry=r)
        self.index_swaps = Counter("regis_index_swaps", "Index versions swapped in", registry=r)
        self.jobs = Gauge("regis_jobs", "Recent jobs per state", ["state"], registry=r)
        self.redis_up = Gauge("regis_redis_up", "Redis reachable (1) or not (0); absent without Redis", registry=r)

    def observe_search(self, timings_ms: dict) -> None:
        """Record the per-stage times (ms) of one computed search."""
        for stage, ms in timings_ms.items():
            if stage.startswith("at_"):  # absolute times of a traced search (REGIS_TRACE_STAGES), not a stage
                continue
            self.search_stage.labels(stage=stage).observe(float(ms) / 1e3)


def route_template(scope) -> str:
    """The matched route's path template (``/v1/collections/{collection}/images/{image_id}``), "unmatched" if
    none. FastAPI >= 0.16x keeps included routers unexpanded (``scope["route"]`` is the router's own route,
    without the include prefix); its effective route context then holds the full path."""
    effective = (scope.get("fastapi") or {}).get("effective_route_context")
    path = getattr(effective, "path", None)
    if path:
        return path
    return getattr(scope.get("route"), "path", None) or "unmatched"


class MetricsMiddleware:
    """ASGI middleware counting requests and timing them per route template."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            template = route_template(scope)
            method = scope.get("method", "GET")
            method = method if method in METHODS else "other"
            self.metrics.latency.labels(method=method, route=template).observe(time.perf_counter() - t0)
            self.metrics.requests.labels(method=method, route=template, status=str(status["code"])).inc()
