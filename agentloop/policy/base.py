"""The policy interface the agent and the learner talk to. Backends (local transformers, an
OpenAI-compatible server such as vLLM) implement it; nothing else knows which one runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class GenerationRequest:
    """Continue `context` (exact token ids, never re-tokenised) by at most `max_new_tokens`."""

    context: Sequence[int]
    max_new_tokens: int
    temperature: float = 1.0
    adapter: str | None = None  # a loaded adapter's name; None = the base model
    key: str | None = None  # opaque episode key (scripted policies use it; samplers ignore it)


@dataclass
class Generation:
    token_ids: list[int]  # as sampled, including the end-of-turn token when the model stopped
    logprobs: list[float] | None  # log-prob of each sampled token under the sampling distribution
    finish_reason: str  # "stop" (end-of-turn token) | "length"
    text: str  # decoded without special tokens


class Tokenizer(Protocol):
    """The subset of a Hugging Face tokenizer the agent uses."""

    eos_token_id: Any

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


class Policy(Protocol):
    name: str  # what episodes record as their policy, e.g. the base model's name
    tokenizer: Tokenizer

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """One batched call; requests may name different adapters."""
        ...

    def load_adapter(self, name: str, path: str) -> None: ...

    def unload_adapter(self, name: str) -> None: ...

    def loaded_adapters(self) -> set[str]: ...

    def end_episode(self, key: str) -> None:
        """The episode with this request key is over: drop whatever was kept for it (e.g. its KV cache)."""
        ...
