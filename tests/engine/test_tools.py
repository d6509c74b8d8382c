"""The built-in tool-call formats (pythonic for SmolLM2, Hermes for others): rendering a history, parsing replies (all or nothing)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from agentgrad.engine.tools import (
    CLOSE,
    HERMES,
    OPEN,
    PYTHONIC,
    call_grammar,
    call_text,
    calls_text,
    format_for,
    functions,
    parse_reply,
    render_history,
    template_history,
)

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


def arguments_of(reply) -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def]
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.tool_calls]


def test_smollm2_gets_the_pythonic_format_and_any_other_model_hermes() -> None:
    smollm2 = SimpleNamespace(chat_template="{{ 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' }}")
    assert format_for(smollm2) is PYTHONIC
    assert format_for(SimpleNamespace(chat_template="{% for message in messages %}...")) is HERMES
    assert format_for(SimpleNamespace(chat_template=None)) is HERMES


def test_a_tokenizer_with_its_own_tool_call_tokens_gets_a_grammar_that_names_those_tokens() -> None:
    qwen_like = SimpleNamespace(chat_template="{% if tools %}...", encode=lambda text, add_special_tokens: {
        OPEN: [151657], CLOSE: [151658]}.get(text, [1, 2, 3]))
    fmt = format_for(qwen_like)
    assert fmt.name == "hermes" and fmt.tokens == (151657, 151658)
    assert "<[151657]>" in call_grammar(SPECS, "now", fmt=fmt) and "<[151658]>" in call_grammar(SPECS, "now", fmt=fmt)
    spelled = SimpleNamespace(chat_template=None, encode=lambda text, add_special_tokens: list(text.encode()))
    assert format_for(spelled) is HERMES and "<[" not in call_grammar(SPECS, "now", fmt=HERMES)


def test_a_call_written_as_bare_or_fenced_json_stays_text_and_says_why() -> None:
    for text, where in [('{"name": "now", "arguments": {}}', "bare"),
                        ('```json\n{\n  "name": "now",\n  "arguments": {}\n}\n```', "in a code block")]:
        reply = parse_reply(text, SPECS)
        assert reply.tool_calls == [] and reply.content == text
        assert reply.error is not None and where in reply.error and "'now'" in reply.error
    assert parse_reply('{"name": "elsewhere"}', SPECS).error is None  # not one of the tools: just JSON text
    assert parse_reply("The time is {now}.", SPECS).error is None


def test_a_template_that_renders_tools_gets_each_calls_arguments_as_an_object() -> None:
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "now", "arguments": '{"tz": "UTC"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]
    rendered = template_history(history)
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"}
    assert history[1]["tool_calls"][0]["function"]["arguments"] == '{"tz": "UTC"}'  # the request is not changed
    assert rendered[0] == history[0] and rendered[2] == history[2]


def test_pythonic_calls_parse_into_openai_tool_calls_and_render_back_to_the_same_text() -> None:
    text = calls_text([("calculate", '{"expression": "123 + 456"}'), ("now", {})], PYTHONIC)
    assert text == '[calculate(expression="123 + 456"), now()]'
    reply = parse_reply(text, SPECS)
    assert reply.error is None and reply.content is None
    assert arguments_of(reply) == [("calculate", {"expression": "123 + 456"}), ("now", {})]
    again = calls_text([(c["function"]["name"], c["function"]["arguments"]) for c in reply.tool_calls], PYTHONIC)
    assert again == text  # the round trip: what the model wrote is what the next prompt holds


def test_pythonic_values_are_json_and_text_after_the_calls_stays_content() -> None:
    reply = parse_reply('[now(flag=true, n=2, xs=[1, "a"], none=null)] done', SPECS)
    assert arguments_of(reply) == [("now", {"flag": True, "n": 2, "xs": [1, "a"], "none": None})]
    assert reply.content == " done"
    assert calls_text([("now", {"flag": True, "n": 2})], PYTHONIC) == "[now(flag=true, n=2)]"


def test_a_pythonic_reply_that_does_not_parse_stays_text_and_says_why() -> None:
    for text, why in [
        ('[calculate(expression="1 + 2"', "closed by ']'"),
        ('[calculate("1 + 2")]', "name them"),
        ("[calculate(expression=x)]", "not a literal"),
    ]:
        reply = parse_reply(text, SPECS)
        assert reply.content == text and reply.tool_calls == [] and why in (reply.error or ""), (text, reply.error)


def test_text_that_merely_starts_with_a_bracket_or_names_no_tool_is_not_a_call() -> None:
    for text in ["[1, 2] is a list", "[rm_rf(path='/')]", "Answer: 579", "[calculate] is a tool"]:
        reply = parse_reply(text, SPECS)
        assert reply.content == text and reply.tool_calls == [] and reply.error is None, text


def test_smollm2_model_card_lists_in_tool_call_blocks_parse_and_an_empty_list_is_no_call() -> None:
    reply = parse_reply(f'{OPEN}[{{"name": "now", "arguments": {{}}}}, {{"name": "calculate", "arguments": {{"expression": "2"}}}}]{CLOSE}', SPECS)
    assert arguments_of(reply) == [("now", {}), ("calculate", {"expression": "2"})]
    empty = parse_reply(f"{OPEN}[]{CLOSE}", SPECS)
    assert empty.tool_calls == [] and empty.error is None


def test_a_history_renders_in_the_pythonic_format_with_results_as_tool_turns() -> None:
    messages = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 123 + 456?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "123 + 456"}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": "579"},
    ]
    rendered = render_history(messages, [CALC], PYTHONIC)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "tool"]
    assert rendered[0]["content"].startswith("You are a calculator.\n\nYou have access to the following functions:")
    assert json.dumps([CALC["function"]]) in rendered[0]["content"]
    assert rendered[2]["content"] == '[calculate(expression="123 + 456")]' and rendered[3]["content"] == "579"
