"""Reading a server's ``/metrics`` with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.serve.server import ServerProcess


def scrape(server: ServerProcess) -> dict[str, float]:
    """{sample name{labels}: value}, e.g. ``vllm:num_requests_running`` or
    ``vllm:request_success_total{finished_reason="length"}`` (labels model_name and engine
    left out)."""
    reply = server.request("GET", "/metrics")
    assert reply.status == 200, reply.body
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in ("model_name", "engine")}
            key = sample.name
            if labels:
                key += "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
            out[key] = out.get(key, 0.0) + sample.value
    return out


def families(server: ServerProcess) -> dict[str, str]:
    """{family name: type} of everything ``/metrics`` exposes."""
    text = server.request("GET", "/metrics").body.decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}
