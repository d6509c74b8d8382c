"""What APO's critic and editor read and write: their instructions, the requests built from a prompt and its failed
runs, the text read back out of their replies, and the checks a rewrite must pass before it is scored.

The search over prompts (`apo.APO`) and the joint run (`joint.Joint`) use these; nothing here calls a model or the
store, so each piece is tested on plain strings.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from typing import Any

from agentgrad import semconv as sc
from agentgrad.types import PromptTemplate, Rollout, RolloutStatus, Span

Messages = list[dict[str, str]]

EDIT_STYLES = (
    "Make the smallest change to the template that fixes the problems the critique names.",
    "Add a short, explicit rule for the cases the critique names; keep the rest of the template as it is.",
    "Rewrite the template as a whole so that it is clear and complete, addressing the critique.",
)
"""How the editor is asked to edit, one per candidate of a parent in turn: distinct rewrites even
from an editor that answers deterministically."""

CALLERS = {"critique": "apo-critic", "new_prompt": "apo-editor"}
"""The agent name each of APO's own model calls carries (by the tag its reply is read from)."""

TRANSCRIPT_CHARS = 1500
"""How much of one failed run's task, and of its trace, the critic reads."""

CRITIC_SYSTEM = """\
You review the prompt template of an AI agent. You see the template and runs in which the agent \
failed: each run's task, what the agent did, and the reward it got (higher is better). Say what in \
the template leads to these failures and what it should say instead: concretely, in a few sentences, \
about the template as a whole rather than single tasks. Do not write the new template.
Put your critique between <critique> and </critique>."""

EDITOR_SYSTEM = """\
You edit the prompt template of an AI agent along a critique of it. Keep every placeholder of the \
template exactly as it is written and add no new one: the agent fills exactly these. \
Reply with the complete new template between <new_prompt> and </new_prompt>, nothing else between the markers."""


def critic_messages(prompt: PromptTemplate, failed: Sequence[tuple[Rollout, Sequence[Span]]], batch: int) -> Messages:
    """The critic's request: the template and the failed runs of a batch of `batch` (each with its spans)."""
    parts = [
        f"## Prompt template\n<template>\n{prompt.template}\n</template>\n",
        f"## Failed runs ({len(failed)} shown of the {batch} runs of this batch)",
    ]
    for i, (run, spans) in enumerate(failed, 1):
        reward = run.reward if run.status is RolloutStatus.SUCCEEDED else f"none, the run {run.status.value}"
        task = json.dumps(run.input, default=repr)
        task = task if len(task) <= TRANSCRIPT_CHARS else task[:TRANSCRIPT_CHARS] + " …"
        parts.append(
            f"\n### Run {i} · reward {reward}\nTask: {task}\n{transcript(spans) or '(the agent recorded nothing)'}"
        )
    return [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": "\n".join(parts)}]


def editor_messages(prompt: PromptTemplate, critique: str, style: str) -> Messages:
    """The editor's request: the template with its syntax and placeholders, the critique, how to edit."""
    names = ", ".join(sorted(prompt.placeholders())) or "none"
    syntax = (
        "Python str.format syntax: {name} is a placeholder, literal braces are written {{ and }}"
        if prompt.engine == "f-string"
        else "Jinja syntax: {{ name }} is a placeholder"
    )
    content = (
        f"## Template ({syntax}; its placeholders: {names})\n<template>\n{prompt.template}\n</template>\n\n"
        f"## Critique\n{critique}\n\n## How to edit\n{style}"
    )
    return [{"role": "system", "content": EDITOR_SYSTEM}, {"role": "user", "content": content}]


def repair_request(prompt: PromptTemplate, reason: str) -> str:
    """What the editor is told when `check_rewrite` refuses its rewrite of `prompt`: why, and what to keep."""
    names = ", ".join(sorted(prompt.placeholders())) or "none"
    return (
        f"That template cannot be used ({reason}). Write the complete new template again, along the critique, "
        f"keeping every placeholder of the original exactly as it is written there (its placeholders: {names}) and "
        "adding none. Reply with it between <new_prompt> and </new_prompt>."
    )


def between_markers(text: str | None, tag: str) -> str:
    """The text between the last `</tag>` and the `<tag>` before it; ValueError saying what is wrong otherwise."""
    if not text or not text.strip():
        raise ValueError("the reply is empty")
    open_, close = f"<{tag}>", f"</{tag}>"
    end = text.rfind(close)
    start = text.rfind(open_, 0, end) if end >= 0 else -1
    if start < 0:
        raise ValueError(f"the reply has no {open_} ... {close} block: {text[:200]!r}")
    inner = text[start + len(open_) : end].strip("\n")
    if not inner.strip():
        raise ValueError(f"the reply's {open_} block is empty")
    return inner


def lenient(text: str | None, tag: str) -> str:
    """`between_markers`, and for a reply without them: a rewrite's first fenced block, else the whole text."""
    try:
        return between_markers(text, tag)
    except ValueError:
        if not text or not text.strip():
            raise
    fenced = re.search(r"```[^\n]*\n(.*?)\n?```", text, re.S)
    found = (fenced.group(1) if fenced and tag != "critique" else text).strip()
    if not found:
        raise ValueError(f"the reply's fenced block is empty: {text[:200]!r}")
    return found


class _StandIn(str):
    """A value that survives attribute access and indexing, to test-render a template without real values."""

    def __getattr__(self, name: str) -> _StandIn:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __getitem__(self, key: Any) -> _StandIn:
        return self


def render_error(prompt: PromptTemplate) -> str | None:
    """Why `prompt` fails to render with stand-in values for its placeholders, or None when it renders."""
    try:
        prompt.format(**{name: _StandIn("x") for name in prompt.placeholders()})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def check_rewrite(original: PromptTemplate, rewrite: PromptTemplate) -> str | None:
    """Why `rewrite` cannot replace `original` in the agent, or None when it can.

    It must parse, fill exactly the original's placeholders, render wherever the original renders,
    and differ from it.
    """
    if not rewrite.template.strip():
        return "empty"
    if rewrite.template.strip() == original.template.strip():
        return "unchanged"
    try:
        names = rewrite.placeholders()
    except Exception as exc:
        return f"does not parse as a {rewrite.engine} template: {type(exc).__name__}: {exc}"
    expected = original.placeholders()
    if expected - names:
        return f"drops placeholder(s) {', '.join(sorted(expected - names))}, which the agent fills"
    if names - expected:
        hint = " (literal braces are written {{ and }})" if rewrite.engine == "f-string" else ""
        return f"adds placeholder(s) {', '.join(sorted(names - expected))}, which the agent does not fill{hint}"
    error = render_error(rewrite)
    if error is not None and render_error(original) is None:
        return f"does not render: {error}"
    return None


def transcript(spans: Sequence[Span]) -> str:
    """What the agent did in one rollout, a line per span a critic can learn from, cut to `TRANSCRIPT_CHARS`."""
    lines = []
    for span in spans:
        a = span.attributes
        if sc.GEN_AI_INPUT_MESSAGES in a or sc.GEN_AI_OUTPUT_MESSAGES in a:
            lines.append(f"model call: {a.get(sc.GEN_AI_INPUT_MESSAGES)} -> {a.get(sc.GEN_AI_OUTPUT_MESSAGES)}")
        elif sc.MESSAGE_BODY in a:
            lines.append(f"message: {a[sc.MESSAGE_BODY]}")
        elif sc.OBJECT_JSON in a:
            lines.append(f"object: {a[sc.OBJECT_JSON]}")
        elif sc.OPERATION_NAME in a:
            lines.append(
                f"{a[sc.OPERATION_NAME]}: input {a.get(sc.OPERATION_INPUT, '-')} "
                f"-> output {a.get(sc.OPERATION_OUTPUT, '-')}"
            )
        elif sc.EXCEPTION_TYPE in a:
            lines.append(f"error: {a[sc.EXCEPTION_TYPE]}: {a.get(sc.EXCEPTION_MESSAGE, '')}")
    text = "\n".join(lines)
    return text if len(text) <= TRANSCRIPT_CHARS else text[:TRANSCRIPT_CHARS] + " …"


def changes(old: str, new: str) -> str:
    """The lines `new` adds to `old` (+) and those it drops (-), on one line."""
    diff = difflib.ndiff(old.splitlines(), new.splitlines())
    return " | ".join(line[0] + line[2:] for line in diff if line[:2] in ("+ ", "- ") and line[2:].strip())
