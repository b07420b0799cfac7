"""The episode loop: sample a turn, parse the action, call the world, append the observation.

An `Episode` is a state machine (`request()` then `advance()`), so one batched generate call can
drive many episodes at once (K rollouts of a task, or several served tasks); `run_episodes` is that
driver. Every turn becomes a `Turn` handed to `on_turn` for persistence and streaming.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentloop.agent.actions import action_space
from agentloop.agent.prompt import ChatFormat, example_messages, render_system, render_task, world_prompt
from agentloop.apps.base import ApiError
from agentloop.apps.tasks import ToolCall
from agentloop.apps.world import World
from agentloop.apps.world_prompt import WorkedExample
from agentloop.policy.base import Generation, GenerationRequest, Policy
from agentloop.settings import Settings

MIN_ROOM = 16  # stop when fewer new tokens than this still fit in the context


@dataclass(frozen=True)
class Limits:
    max_turns: int = 20
    max_new_tokens: int = 384
    observation_max_tokens: int = 1024
    max_context_tokens: int = 8192
    wall_time_s: float = 900.0
    temperature: float = 0.7

    @classmethod
    def from_settings(cls, s: Settings, **overrides: Any) -> Limits:
        values: dict[str, Any] = dict(
            max_turns=s.agent_max_turns,
            max_new_tokens=s.agent_max_new_tokens,
            observation_max_tokens=s.agent_observation_max_tokens,
            max_context_tokens=s.agent_max_context_tokens,
            wall_time_s=s.agent_wall_time_s,
            temperature=s.agent_temperature,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class Turn:
    index: int
    prompt_token_count: int
    output_token_ids: list[int]
    output_logprobs: list[float] | None
    output_text: str
    finish_reason: str
    action: dict[str, Any] | None
    observation: str
    observation_token_ids: list[int]
    error_kind: str | None
    n_actions: int
    gen_s: float
    env_s: float


@dataclass
class Episode:
    world: World
    fmt: ChatFormat
    instruction: str
    limits: Limits
    adapter: str | None = None
    key: str | None = None
    # the worked example shown before the task (agent/examples.py); None: the world's own
    example: WorkedExample | None = None
    prompt_token_ids: list[int] = field(init=False)
    context: list[int] = field(init=False)
    turns: list[Turn] = field(default_factory=list)
    finish_reason: str | None = None  # completed | max_turns | context_limit | wall_time | cancelled | error
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        parts = world_prompt(self.world)  # once per episode (an app's worked example is fetched here)
        if self.example is not None and self.world.commands is None:
            parts = replace(parts, example=self.example)
        self.prompt_token_ids = self.fmt.opening(
            render_system(self.world, parts),
            render_task(self.world, parts, self.instruction),
            example_messages(self.world, parts),
        )
        self.context = list(self.prompt_token_ids)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def tokens_generated(self) -> int:
        return sum(len(t.output_token_ids) for t in self.turns)

    def finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def request(self) -> GenerationRequest | None:
        """The next generation to run, or None (and `finish_reason` set) when a limit is reached."""
        if self.done:
            return None
        if len(self.turns) >= self.limits.max_turns:
            self.finish("max_turns")
        elif time.monotonic() - self.started > self.limits.wall_time_s:
            self.finish("wall_time")
        elif self.limits.max_context_tokens - len(self.context) < MIN_ROOM:
            self.finish("context_limit")
        if self.done:
            return None
        room = self.limits.max_context_tokens - len(self.context)
        return GenerationRequest(
            context=list(self.context),
            max_new_tokens=min(self.limits.max_new_tokens, room),
            temperature=self.limits.temperature,
            adapter=self.adapter,
            key=self.key,
        )

    def advance(self, gen: Generation, gen_s: float = 0.0) -> Turn:
        """Apply one sampled turn: run its action against the world and append the observation."""
        prompt_len = len(self.context)
        t0 = time.perf_counter()
        space = action_space(self.world.commands)
        parsed = space.parse(gen.text)
        call: ToolCall | None = parsed.actions[0] if parsed.actions else None
        error_kind: str | None = None
        if call is None:
            observation, error_kind = space.observe(None, False, parsed.error), "parse_error"
        else:
            try:
                value = self.world.call(call.app, call.api, call.args)
                observation = space.observe(call, True, value)
            except ApiError as exc:
                observation, error_kind = space.observe(call, False, f"{exc.status}: {exc.message}"), exc.kind
            if len(parsed.actions) > 1:
                observation += (
                    f"\n[Note: your reply had {len(parsed.actions)} tool calls; only the first was run. "
                    "Make one call per turn.]"
                )
        observation = self._capped(observation, call)
        obs_ids = self.fmt.observation_ids(observation, stopped=gen.finish_reason == "stop")
        env_s = time.perf_counter() - t0
        turn = Turn(
            index=len(self.turns),
            prompt_token_count=prompt_len,
            output_token_ids=list(gen.token_ids),
            output_logprobs=None if gen.logprobs is None else list(gen.logprobs),
            output_text=gen.text,
            finish_reason=gen.finish_reason,
            action=call.to_dict() if call else None,
            observation=observation,
            observation_token_ids=obs_ids,
            error_kind=error_kind,
            n_actions=len(parsed.actions),
            gen_s=gen_s,
            env_s=env_s,
        )
        self.turns.append(turn)
        self.context.extend(gen.token_ids)
        self.context.extend(obs_ids)
        if self.world.completed:
            self.finish("completed")
        return turn

    def _capped(self, observation: str, call: ToolCall | None) -> str:
        """The observation within the cap; a longer one is cut, with a note of what the agent can do about it."""
        tokenizer, cap = self.fmt.tokenizer, self.limits.observation_max_tokens
        ids = tokenizer.encode(observation, add_special_tokens=False)
        if len(ids) <= cap:
            return observation
        kept = tokenizer.decode(ids[:cap], skip_special_tokens=True)
        return f"{kept}\n[Output truncated: showed {cap} of {len(ids)} tokens. {truncation_advice(self.world, call)}]"


# Parameters that make an API answer with less, and how the truncation note names them (the first one of
# each group that the API takes).
SHORTER_OUTPUT = (
    (("page_limit", "limit", "per_page", "max_results"), "a smaller {}"),
    (("query", "q", "search", "filter"), "a narrower {}"),
)


def truncation_advice(world: World, call: ToolCall | None) -> str:
    """How to ask the called API for less, naming only parameters it takes."""
    if call is None:
        return "The rest is not shown."
    try:
        props = world.api_of(call.app, call.api).parameters.get("properties") or {}
    except ApiError:  # no such API: its error is what was cut
        return "The rest is not shown."
    options = []
    for names, phrase in SHORTER_OUTPUT:
        taken = next((n for n in names if n in props), None)
        if taken is not None:
            options.append(phrase.format(taken))
    if options:
        rest = " (and page_index for the rest)" if "page_index" in props else ""
        return f"Ask for less: {' or '.join(options)}{rest}."
    return f"{call.app}.{call.api} takes no parameter that asks for less; the rest is not shown."


OnTurn = Callable[[Episode, Turn], None]


def run_episodes(
    policy: Policy,
    episodes: Sequence[Episode],
    on_turn: OnTurn | None = None,
    should_stop: Callable[[Episode], str | None] | None = None,
) -> None:
    """Drive episodes to the end, one batched generate call per round. `should_stop` may end an
    episode between turns by returning a finish reason (e.g. "cancelled")."""
    released: set[str] = set()
    while True:
        if should_stop is not None:
            for ep in episodes:
                if not ep.done and (reason := should_stop(ep)):
                    ep.finish(reason)
        active = []
        for ep in episodes:
            req = ep.request()
            if req is not None:
                active.append((ep, req))
            elif ep.key is not None and ep.key not in released:
                released.add(ep.key)
                policy.end_episode(ep.key)
        if not active:
            return
        t0 = time.perf_counter()
        gens = policy.generate([req for _, req in active])
        gen_s = (time.perf_counter() - t0) / len(active)
        for (ep, _), gen in zip(active, gens, strict=True):
            turn = ep.advance(gen, gen_s)
            if on_turn is not None:
                on_turn(ep, turn)
