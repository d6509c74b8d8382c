"""APO's settings: the search (rounds, beam, rewrites per prompt) and its critic and editor (endpoint, models,
sampling, tries). One dataclass, read by the search (`apo.py`), the critic and editor (`apo_critic.py`) and the
joint run (`joint.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from agentgrad.algorithms.config import RunConfig, check_time_budget


@dataclass
class APOConfig(RunConfig):
    """Every setting of an APO run; `APO(config, name=value)` overrides copy it, never change it."""

    steps: int = 3  # search rounds after the seed prompt is scored
    prompts_per_step: int = 8  # training tasks each prompt in the beam runs per round; the critic reads their failures
    beam_width: int = 2  # prompts kept after each round, old and new together
    branch_factor: int = 3  # rewrites the editor writes for each prompt in the beam, each round
    critic_examples: int = 4  # failed runs the critic reads, lowest reward first
    critic_model: str | None = None  # model writing the critique; None: the agent's model
    editor_model: str | None = None  # model rewriting the prompt; None: the critic's model
    critic_temperature: float = 0.7  # sampling temperature of the critic
    editor_temperature: float = 1.0  # of the editor: higher gives more varied rewrites
    max_tokens: int | None = None  # tokens per critic or editor reply (None: the endpoint's limit)
    lenient_replies: bool = False  # a reply without its markers (or cut off): the critique is the whole text, the
    # rewrite the first ``` block (else the whole text); for small local critics, whose rewrites a guard scores (Joint)
    repair_tries: int = 1  # a rewrite `check_rewrite` refuses goes back to the editor with the reason, this many times
    base_url: str | None = None  # OpenAI-compatible endpoint of critic and editor; None: the agent's LLM resource
    api_key: str | None = None  # its key; None: the LLM resource's when its endpoint is used, else OPENAI_API_KEY
    prompt_name: str | None = None  # the resource to optimize; None: the only PromptTemplate among the resources
    max_tries: int = 3  # tries for a critic or editor reply (malformed, or an API error) before giving it up
    batch_timeout: float | None = None  # seconds to wait for a batch of rollouts; unfinished ones score 0
    time_budget_s: float | None = None  # no round starts past this many seconds of the search (None: no limit)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_time_budget(self.time_budget_s)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(
                f"APO max_tokens must be at least 1 (or None: the endpoint's limit), got {self.max_tokens}"
            )
        at_least_0 = ("steps", "repair_tries")
        for name in ("steps", "beam_width", "branch_factor", "prompts_per_step", "critic_examples", "max_tries",
                     "repair_tries"):  # fmt: skip
            value, least = getattr(self, name), 0 if name in at_least_0 else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"APO {name} must be an integer of at least {least}, got {value!r}")
