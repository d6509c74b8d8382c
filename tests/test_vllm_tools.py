"""vLLM's tool flags (no vLLM needed): the parser chosen per model, and the shipped SmolLM2 tool
template rendering the same token ids as the built-in engine's own rendering (`engine/tools.py`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agentgrad.engine.model import resolve_model
from agentgrad.engine.tools import PYTHONIC, render_history, template_history
from agentgrad.policy.vllm_server import SMOLLM2_TOOLS_TEMPLATE, serve_command, tool_flags
from examples.calc_agent import CALCULATE_TOOL, build_messages

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
)
QWEN_LIKE_TEMPLATE = "{%- if tools %}<tools>{{ tools }}</tools>{% endif %}<tool_call>\n{{ call | tojson }}\n</tool_call>"


def folder(tmp_path: Path, template: str, name: str, in_config: bool = False) -> str:
    path = tmp_path / name
    path.mkdir()
    if in_config:
        (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    else:
        (path / "chat_template.jinja").write_text(template)
    return str(path)


def test_smollm2_is_served_with_the_pythonic_parser_and_the_shipped_tool_template(tmp_path: Path) -> None:
    command = serve_command(Path("python"), folder(tmp_path, SMOLLM2_TEMPLATE, "smol"), "smollm2-135m", 18900)
    at = command.index("--tool-call-parser")
    assert "--enable-auto-tool-choice" in command and command[at + 1] == "pythonic"
    template = Path(command[command.index("--chat-template") + 1])
    assert template == SMOLLM2_TOOLS_TEMPLATE and template.is_file()


def test_a_qwen_like_model_is_served_with_the_hermes_parser_and_its_own_template(tmp_path: Path) -> None:
    command = serve_command(Path("python"), folder(tmp_path, QWEN_LIKE_TEMPLATE, "qwen", in_config=True), "q", 18900)
    assert command[command.index("--tool-call-parser") + 1] == "hermes"
    assert "--enable-auto-tool-choice" in command and "--chat-template" not in command


def test_a_users_own_tool_flags_win_and_an_unknown_template_gets_none(tmp_path: Path) -> None:
    smol = folder(tmp_path, SMOLLM2_TEMPLATE, "smol")
    command = serve_command(Path("python"), smol, "s", 18900, extra_args=["--tool-call-parser=llama3_json"])
    assert command.count("--tool-call-parser=llama3_json") == 1 and "--tool-call-parser" not in command
    assert tool_flags(folder(tmp_path, "{{ messages }}", "plain")) == []
    assert tool_flags(str(tmp_path / "absent")) == []


def conversation() -> list[dict[str, Any]]:
    """The function demo's history (a worked tool round), a question, a call the model made and its result."""
    messages = build_messages("What is 123 + 456?", "function")
    call = {"id": "call_1", "type": "function",
            "function": {"name": "calculate", "arguments": json.dumps({"expression": "123 + 456"})}}
    return messages + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "579"}]


@pytest.mark.parametrize("tools", [[CALCULATE_TOOL], None], ids=["tools", "no-tools"])
@pytest.mark.parametrize("system", [True, False], ids=["system", "no-system"])
def test_the_shipped_smollm2_template_renders_the_engines_token_ids(tools: list[dict[str, Any]] | None,
                                                                   system: bool) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(None))
    messages = conversation() if system else conversation()[1:]
    assert any(m.get("tool_calls") for m in messages) and any(m["role"] == "tool" for m in messages)
    engine = tokenizer.apply_chat_template(render_history(copy.deepcopy(messages), tools, PYTHONIC),
                                           add_generation_prompt=True, tokenize=False)
    # vLLM hands the template each call's arguments as the object they encode, and the tools as its
    # pydantic model dumps them (`strict`, `defer_loading`: None)
    dumped = [{**t, "function": {**t["function"], "strict": None, "defer_loading": None}} for t in tools or []]
    ours = tokenizer.apply_chat_template(template_history(copy.deepcopy(messages)), tools=dumped or None,
                                         chat_template=SMOLLM2_TOOLS_TEMPLATE.read_text(),
                                         add_generation_prompt=True, tokenize=False)
    assert ours == engine
    assert tokenizer.encode(ours, add_special_tokens=False) == tokenizer.encode(engine, add_special_tokens=False)
    assert "[calculate(expression=\"123 + 456\")]" in ours
