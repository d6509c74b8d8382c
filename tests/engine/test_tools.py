"""The built-in tool-call format: rendering a history, parsing replies (all or nothing), the call grammar."""

from __future__ import annotations

import json

from agentgrad.engine.tools import CLOSE, OPEN, call_text, functions, parse_reply, render_history

CALC = {"type": "function", "function": {"name": "calculate", "description": "Evaluate arithmetic",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                        "required": ["expression"], "additionalProperties": False}}}
SPECS = functions([CALC, {"type": "function", "function": {"name": "now"}}])


def test_several_calls_in_one_reply_parse_into_openai_tool_calls_with_ids() -> None:
    text = call_text("calculate", {"expression": "1 + 2"}) + "\n" + call_text("now", {})
    reply = parse_reply(text, SPECS)
    assert reply.error is None and reply.content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls] == [
        ("calculate", {"expression": "1 + 2"}), ("now", {})]
    assert len({c["id"] for c in reply.tool_calls}) == 2 and all(c["type"] == "function" for c in reply.tool_calls)


def test_text_before_a_call_stays_content() -> None:
    reply = parse_reply("Let me compute.\n" + call_text("calculate", {"expression": "2"}), SPECS)
    assert reply.content == "Let me compute.\n" and len(reply.tool_calls) == 1


def test_a_reply_that_looks_like_a_call_but_does_not_parse_stays_text_and_says_why() -> None:
    for text, why in [
        (f"{OPEN}\n{{not json}}\n{CLOSE}", "is not JSON"),
        (f'{OPEN}\n{{"name": "rm_rf", "arguments": {{}}}}\n{CLOSE}', "not among the tools"),
        (f'{OPEN}\n{{"name": "now", "arguments": [1]}}\n{CLOSE}', "arguments must be a JSON object"),
        (f'{OPEN}\n{{"name": "now", "arguments": {{}}}}', "not closed"),
        (call_text("now", {}) + "\n<tool_call", "not closed"),
    ]:
        reply = parse_reply(text, SPECS)
        assert reply.content == text and reply.tool_calls == [] and why in (reply.error or ""), text


def test_without_tools_nothing_is_parsed() -> None:
    text = call_text("now", {})
    assert parse_reply(text, {}).content == text


def test_a_history_renders_tools_calls_and_results_in_the_built_in_format() -> None:
    messages = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 123 + 456?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "123 + 456"}'}},
            {"id": "b", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "579"},
        {"role": "tool", "tool_call_id": "b", "content": "noon"},
    ]
    rendered = render_history(messages, [CALC])
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert rendered[0]["content"].startswith("You are a calculator.\n\n# Tools") and json.dumps(CALC) in rendered[0]["content"]
    assert rendered[2]["content"] == (f'{OPEN}\n{{"name": "calculate", "arguments": {{"expression": "123 + 456"}}}}\n{CLOSE}\n'
                                      f'{OPEN}\n{{"name": "now", "arguments": {{}}}}\n{CLOSE}')
    assert rendered[3]["content"] == "<tool_response>\n579\n</tool_response>\n<tool_response>\nnoon\n</tool_response>"


def test_malformed_tools_are_refused_by_index() -> None:
    for tools, where in [([{"type": "retrieval"}], "tools[0]"), ([CALC, {"type": "function", "function": {}}], "tools[1].function.name")]:
        try:
            functions(tools)
        except ValueError as exc:
            assert where in str(exc)
        else:
            raise AssertionError(f"{tools} was accepted")
