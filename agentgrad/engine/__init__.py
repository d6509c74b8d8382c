"""The local model: serves OpenAI-compatible generations with token ids and logprobs, and trains."""

from agentgrad.engine.engine import Engine
from agentgrad.engine.model import DEFAULT_MODEL, ModelNotFoundError, load_model, resolve_model
from agentgrad.engine.params import SamplingParams
from agentgrad.engine.rows import Completion, Generation

__all__ = [
    "DEFAULT_MODEL",
    "Completion",
    "Engine",
    "Generation",
    "ModelNotFoundError",
    "SamplingParams",
    "load_model",
    "resolve_model",
]
