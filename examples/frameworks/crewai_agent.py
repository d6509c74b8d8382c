"""A tool-using agent with CrewAI: an `Agent` with a tool, given a `Task` in a `Crew`.

No agentgrad here. The LLM is CrewAI's `LLM` for an OpenAI-compatible server (`base_url`).
"""

from __future__ import annotations

from typing import Any

from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

from examples.frameworks import tasks


@tool("calculate")
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as '123 + 456' and return the result."""
    return tasks.calculate(expression)


def solve(question: str, *, model: str, base_url: str, api_key: str, **settings: Any) -> str:
    llm = LLM(model=f"openai/{model}", base_url=base_url, api_key=api_key, **settings)
    calculator = Agent(role="Calculator", goal="Answer arithmetic questions exactly, using the calculate tool.",
                       backstory=tasks.INSTRUCTIONS, tools=[calculate], llm=llm, max_iter=3, verbose=False)
    task = Task(description=question, expected_output="Answer: <number>", agent=calculator)
    return str(Crew(agents=[calculator], tasks=[task], verbose=False).kickoff())
