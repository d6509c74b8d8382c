"""The deployment: Kubernetes manifests valid against the API's schemas, every server probed on its real health
route with the token from a Secret and resources requested; the Prometheus configuration and alert rules checked
and unit-tested by Prometheus's own `promtool` (Debian's `prometheus`, installed by `make test`), on metric
names the servers export.

No cluster runs here (kind and k3d need a container runtime these machines do not have): the manifests are
validated, and what their probes call is run against real servers."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentgrad.engine.metrics import EngineCollector
from agentgrad.engine.prefix_cache import PrefixCache
from agentgrad.gateway import Backend, Gateway
from agentgrad.gateway.admin import is_public
from agentgrad.serving import ServerThread
from agentgrad.serving.guard import Guard
from agentgrad.store import MemoryStore
from agentgrad.store.server import create_app

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
KUBERNETES_VERSION = "1.37.0"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
HEALTH_ROUTES = {"agentgrad-store": "/api/health", "agentgrad-gateway": "/health", "agentgrad-engine": "/health"}
"""The health route each of our servers answers (vLLM's is its own `/health`)."""


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def workloads() -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, doc in documents() if doc["kind"] in ("Deployment", "StatefulSet")]


@pytest.mark.parametrize(("name", "doc"), documents(), ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_each_manifest_is_valid_against_the_kubernetes_api_schemas(name: str, doc: dict[str, Any]) -> None:
    if doc["kind"] == "Kustomization":
        listed = set(doc["resources"])
        assert listed <= {p.name for p in (DEPLOY / "k8s").glob("*.yaml")}, listed
        return
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # strict: a misspelt field fails too


def test_strict_validation_catches_a_misspelt_field() -> None:
    """What the check above is worth: a probe under a wrong name is refused, not ignored."""
    _, doc = next((n, d) for n, d in workloads() if d["metadata"]["name"] == "agentgrad-gateway")
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbes"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_server_is_probed_on_its_health_route_requests_resources_and_takes_its_token_from_a_secret() -> None:
    services = {doc["spec"]["selector"]["app"]: doc for _, doc in documents() if doc["kind"] == "Service"}
    checked = set()
    for _, doc in workloads():
        app = doc["spec"]["template"]["metadata"]["labels"]["app"]
        assert doc["spec"]["selector"]["matchLabels"]["app"] == app
        for container in doc["spec"]["template"]["spec"]["containers"]:
            assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
            secrets = [e for e in container.get("env", []) if "valueFrom" in e]
            assert any(e["valueFrom"]["secretKeyRef"]["name"] == "agentgrad-token" for e in secrets), app
            assert not [e for e in container.get("env", []) if "TOKEN" in e["name"] and "value" in e]  # no literal
            if not container.get("ports"):
                continue  # a runner serves nothing
            port = container["ports"][0]
            assert services[app]["spec"]["ports"][0]["targetPort"] in (port["name"], port["containerPort"])
            for probe in ("readinessProbe", "livenessProbe"):
                spec = container[probe]
                if "httpGet" in spec:
                    assert spec["httpGet"]["path"] == HEALTH_ROUTES.get(app, "/health")
                    assert spec["httpGet"]["port"] in (port["name"], port["containerPort"])
                else:
                    command = " ".join(spec["exec"]["command"])
                    assert f"127.0.0.1:{port['containerPort']}{HEALTH_ROUTES[app]}" in command
            checked.add(app)
    assert checked == {"agentgrad-store", "agentgrad-gateway", "agentgrad-engine", "agentgrad-vllm"}


def test_the_health_routes_the_probes_call_answer_without_the_token_where_the_kubelet_calls_them() -> None:
    """As `agentgrad serve` and `agentgrad gateway` serve them: behind the guard, with a token."""
    store, upstream = MemoryStore(), Backend("http://127.0.0.1:9/v1")
    with (
        ServerThread(create_app(store, token="t")) as store_server,
        ServerThread(Guard(Gateway(store, default=upstream, token="t"), token="t", public=is_public)) as gateway,
    ):
        assert httpx.get(store_server.url + HEALTH_ROUTES["agentgrad-store"]).status_code == 200
        assert httpx.get(gateway.url + HEALTH_ROUTES["agentgrad-gateway"]).status_code == 200
        assert httpx.get(gateway.url + "/v1/models").status_code == 401  # nothing else is open


def test_the_engines_exec_probe_passes_with_the_secrets_token_and_fails_without_it() -> None:
    """The probe's own command, run against a server behind the engine's guard (the engine's `/health` needs
    the token), on the port it would find in the pod."""
    _, doc = next((n, d) for n, d in workloads() if d["metadata"]["name"] == "agentgrad-engine")
    command = doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    app = Guard(Starlette(routes=[Route("/health", lambda r: JSONResponse({"status": "ok"}))]), token="engine-secret")
    with ServerThread(app) as server:
        port = server.url.rsplit(":", 1)[1]
        script = command[2].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        assert command[:2] == ["python", "-c"]

        def probe(token: str) -> int:
            env = {"AGENTGRAD_TOKEN": token, "PATH": "/usr/bin:/bin"}
            return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=30).returncode

        assert probe("engine-secret") == 0
        assert probe("wrong") != 0


def test_prometheus_accepts_the_scrape_configuration_and_the_alert_rules(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    for name in ("alerts.yml", "alerts_test.yml"):
        shutil.copy(DEPLOY / "prometheus" / name, tmp_path / name)
    config = (DEPLOY / "prometheus" / "prometheus.yml").read_text().replace("/etc/agentgrad-token/token", str(token))
    (tmp_path / "prometheus.yml").write_text(config)
    checked = subprocess.run(
        [PROMTOOL, "check", "config", "prometheus.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 9 rules found" in checked.stdout


def test_each_alert_fires_on_the_series_that_should_raise_it(tmp_path: Path) -> None:
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=DEPLOY / "prometheus", capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"][0]["rules"]
    tests = (DEPLOY / "prometheus" / "alerts_test.yml").read_text()
    untested = [rule["alert"] for rule in rules if not re.search(rf"alertname: {rule['alert']}\b", tests)]
    assert untested == []


def test_the_alert_rules_read_only_metrics_the_servers_export() -> None:
    store = MemoryStore()
    engine = SimpleNamespace(  # what the engine's collector reads, without a model
        stats={},
        running_rows=0,
        max_batch_size=8,
        waiting_requests=0,
        kv_bytes=0,
        version=0,
        prefix_cache=PrefixCache(0),
    )
    exported = {family.name for family in EngineCollector(engine).collect()}  # type: ignore[arg-type]
    gateway = Gateway(store, default=Backend("http://127.0.0.1:9/v1"))
    with ServerThread(create_app(store, extra_routes=gateway.routes(), metrics=gateway.metrics)) as server:
        text = httpx.get(server.url + "/metrics").text
    exported |= {family.name for family in text_string_to_metric_families(text)}
    exported |= {name + suffix for name in list(exported) for suffix in ("_total", "_count", "_sum", "_bucket")}
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    read = set(re.findall(r"\bagentgrad_[a-z_]+", rules))
    assert read and read <= exported, read - exported
