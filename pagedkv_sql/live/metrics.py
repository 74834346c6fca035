"""`watch --metrics-port`: Prometheus metrics on 127.0.0.1 (prometheus-client, the `live`
extra): events, batches, gaps, findings by invariant, and lag behind the publisher."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class Metrics:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.registry = CollectorRegistry()
        self.events = Counter(
            "pagedkv_watch_events", "KV-cache events read", ["source"], registry=self.registry
        )
        self.batches = Counter(
            "pagedkv_watch_batches",
            "event batches (or step-log lines) read",
            ["source"],
            registry=self.registry,
        )
        self.gaps = Counter(
            "pagedkv_watch_gaps",
            "sequence gaps seen (recovered or not)",
            ["source"],
            registry=self.registry,
        )
        self.findings = Counter(
            "pagedkv_watch_findings",
            "findings by invariant",
            ["source", "invariant"],
            registry=self.registry,
        )
        self.lag = Gauge(
            "pagedkv_watch_lag_seconds",
            "now minus the publisher's timestamp of the last batch",
            ["source"],
            registry=self.registry,
        )
        self._server: Any
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
