"""The span schema has one home: every name two components share is spelled once, in `agentgrad.semconv`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from agentgrad import semconv
from agentgrad.types import Span

PACKAGE = Path(semconv.__file__).parent
NAMES = {v for k, v in vars(semconv).items() if k.isupper() and isinstance(v, str)}
NAMES |= set(semconv.GEN_AI_REQUEST_PARAMS.values())
VALUES = {semconv.CHAT, semconv.TEXT_COMPLETION, semconv.CHAT_COMPLETIONS_API, semconv.COMPLETIONS_API,
          semconv.RESPONSES_API, semconv.MESSAGES_API, semconv.TOKEN_IDS_NOT_REQUESTED, semconv.TOKEN_IDS_NOT_RETURNED,
          semconv.UPSTREAM_PARSER}
"""Attribute values that are ordinary words elsewhere (an OpenAPI `responses` table, a metric's `upstream` label)."""


def test_no_module_but_semconv_spells_a_span_attribute_or_header_name() -> None:
    spelled = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "semconv.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if text in NAMES - VALUES or text.startswith(("gen_ai.", "x-agentgrad")):
                    spelled.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {text!r}")
    assert spelled == []


def test_every_name_the_dashboard_reads_is_defined_in_semconv() -> None:
    script = (PACKAGE / "dashboard" / "static" / "dashboard.js").read_text()
    spelled = set(re.findall(r'"((?:agentgrad|gen_ai)\.[a-z_.]+)"', script)) - {"agentgrad.token"}  # a localStorage key
    prefixes = {semconv.LLM_PREFIX, semconv.REWARD + ".", "gen_ai."}
    assert spelled - NAMES - prefixes == set()
    assert semconv.WEIGHTS_VERSION in spelled and semconv.AGENT_NAME in spelled


def test_gateway_routes_name_the_attempt_and_the_agent() -> None:
    assert semconv.gateway_route("http://gw:1/v1/") == "http://gw:1/v1"
    assert semconv.gateway_route("http://gw:1/v1", "r1", "a1") == "http://gw:1/rollouts/r1/attempts/a1/v1"
    assert semconv.gateway_route("http://gw:1", "r1", "a1", "sql writer") == (
        "http://gw:1/rollouts/r1/attempts/a1/agents/sql%20writer/v1"
    )
    assert semconv.gateway_route("http://gw:1/prefix/v1", agent="critic") == "http://gw:1/prefix/agents/critic/v1"


def test_the_weights_version_comes_from_the_header_else_the_fingerprint() -> None:
    assert semconv.model_version("12", semconv.weights_fingerprint(3)) == 12
    assert semconv.model_version(None, semconv.weights_fingerprint(3)) == 3
    assert semconv.model_version("v2", "fp_other") is None
    span = Span(name="chat m", attributes={semconv.WEIGHTS_VERSION: 4, semconv.AGENT_NAME: "writer"})
    assert semconv.weights_version(span) == 4 and semconv.agent_name(span) == "writer"
    assert semconv.weights_version(Span(name="x")) is None and semconv.agent_name(Span(name="x")) is None
