"""A crew with CrewAI: two agents and two tasks in a sequential `Crew`, a calculator then a reviewer.

No agentgrad here. The first task asks the calculator (with `calculate`) for the sum; the second gives the
reviewer that result as context and asks for the checked final answer. Each agent has its own `LLM`,
built by `base_url_for(role)`: a crew whose agents use different endpoints is written this way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crewai import LLM, Agent, Crew, Process, Task

from examples.frameworks import tasks
from examples.frameworks.crewai_agent import calculate

CALCULATOR, REVIEWER = "calculator", "reviewer"


def solve(question: str, *, model: str, base_url_for: Callable[[str], str], api_key: str,
          **settings: Any) -> dict[str, str]:
    """Run the crew on the question; returns each task's output by the role of its agent."""
    def llm(role: str) -> LLM:
        return LLM(model=f"openai/{model}", base_url=base_url_for(role), api_key=api_key, **settings)

    calculator = Agent(role=CALCULATOR, goal="Answer arithmetic questions exactly, using the calculate tool.",
                       backstory=tasks.INSTRUCTIONS, tools=[calculate], llm=llm(CALCULATOR), max_iter=3)
    reviewer = Agent(role=REVIEWER, goal="Check the calculator's result and give the final answer.",
                     backstory="You check arithmetic. Reply with 'Answer: <number>'.", llm=llm(REVIEWER), max_iter=1)
    compute = Task(description="{question}", expected_output="'Answer: <number>'", agent=calculator)
    review = Task(description="Check the calculator's answer to: {question}", expected_output="'Answer: <number>'",
                  agent=reviewer, context=[compute])
    crew = Crew(agents=[calculator, reviewer], tasks=[compute, review], process=Process.sequential, verbose=False)
    crew.kickoff(inputs={"question": question})
    return {CALCULATOR: str(compute.output.raw if compute.output else ""),
            REVIEWER: str(review.output.raw if review.output else "")}
