"""A World holds the state of every app for one episode and answers `call(app, api, args)`."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agentloop.apps.base import Api, ApiError, AppSpec, CallContext, string

if TYPE_CHECKING:
    from agentloop.apps.world_prompt import PromptSource

WorldState = dict[str, dict[str, dict[str, dict[str, Any]]]]  # app -> table -> id -> record

ALWAYS_AVAILABLE = ("api_docs", "supervisor")


@dataclass
class CallRecord:
    app: str
    api: str
    args: dict[str, Any]
    ok: bool
    result: Any  # the return value, or the ApiError's message


@dataclass
class World:
    """State of all apps of one episode. `available` are the apps the task may use; `prompt` is what the
    world's provider says in the agent's prompt (None: the neutral prompt, see `world_prompt.py`)."""

    name: str
    seed: int
    now: datetime
    apps: Mapping[str, AppSpec]
    state: WorldState
    available: list[str]
    answer: str | None = None
    completed: bool = False
    calls: list[CallRecord] = field(default_factory=list)
    _token_counter: int = 0
    prompt: PromptSource | None = None
    attached: list[str] = field(default_factory=list)  # apps attached after the provider built the world
    # a text world: the app that takes the agent's text commands (`<app>.act(command)`); None: tool calls
    commands: str | None = None

    def attach(self, spec: AppSpec) -> None:
        """Make one more app (an external one) available in this world; it keeps no state here."""
        if spec.name in self.apps:
            raise ValueError(f"an app named {spec.name!r} already exists in this world")
        self.apps = {**self.apps, spec.name: spec}
        self.available = [*self.available, spec.name]
        self.attached = [*self.attached, spec.name]

    # --- calls -----------------------------------------------------------------------------
    def api_of(self, app: str, api: str) -> Api:
        if app not in self.apps or app not in self.available:
            raise ApiError(
                404,
                f"There is no app named {app!r} in this task. Available apps: {', '.join(self.available)}. "
                "Use api_docs.list_apps to see them.",
                kind="unknown_app",
            )
        spec = self.apps[app]
        if api not in spec.apis or spec.apis[api].hidden:
            raise ApiError(
                404,
                f"App {app!r} has no API named {api!r}. Use api_docs.list_apis with app_name={app!r} to see its APIs.",
                kind="unknown_api",
            )
        return spec.apis[api]

    def call(self, app: str, api: str, args: Any) -> Any:
        """Run one API call; raises ApiError with a status and a message a person can act on."""
        try:
            result = self._call(app, api, args)
        except ApiError as exc:
            self.calls.append(CallRecord(app, api, args if isinstance(args, dict) else {}, False, exc.message))
            raise
        self.calls.append(CallRecord(app, api, args, True, result))
        return result

    def _call(self, app: str, api: str, args: Any) -> Any:
        spec = self.api_of(app, api)
        values = spec.validate(args)
        user = None
        if spec.login_required:
            token = values.pop("access_token")
            session = self.state[app]["_sessions"].get(token)
            if session is None:
                raise ApiError(401, f"Invalid or expired access token for {app}. Call {app}.login to get a new one.")
            user = session["user"]
        return spec.handler(CallContext(world=self, app=app, user=user), **values)

    def new_token(self, app: str, user: str) -> str:
        self._token_counter += 1
        token = hashlib.sha256(f"{self.seed}:{app}:{user}:{self._token_counter}".encode()).hexdigest()[:24]
        self.state[app]["_sessions"][token] = {"user": user}
        return token

    def scratch_copy(self) -> World:
        """A copy of this world for an oracle to solve its task in (the oracle calls APIs; the episode's world
        must not change)."""
        return World.from_snapshot(
            self.name, self.seed, self.now, self.apps, list(self.available), self.snapshot(), self.prompt
        )

    def close(self) -> None:
        """Free what the world holds outside this process (a text world's simulator); the episode has ended.
        A world of app tables holds nothing: its state goes with the object."""

    # --- snapshots ---------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        return pickle.dumps((self.state, self.answer, self.completed, self._token_counter))

    @classmethod
    def from_snapshot(
        cls,
        name: str,
        seed: int,
        now: datetime,
        apps: Mapping[str, AppSpec],
        available: list[str],
        snap: bytes,
        prompt: PromptSource | None = None,
    ) -> World:
        world = cls(name=name, seed=seed, now=now, apps=apps, state={}, available=available, prompt=prompt)
        world.restore(snap)
        return world

    def restore(self, snap: bytes) -> None:
        self.state, self.answer, self.completed, self._token_counter = pickle.loads(snap)
        self.calls = []

    def copy_state(self) -> WorldState:
        state: WorldState = pickle.loads(pickle.dumps(self.state))
        return state


def add_login_api(spec: AppSpec) -> None:
    """Every app with accounts gets the same `login(username, password)`."""

    def login(ctx: CallContext, username: str, password: str) -> dict[str, Any]:
        accounts = ctx.world.state["supervisor"]["accounts"]
        account = accounts.get(ctx.app)
        if account is None or account["username"] != username or account["password"] != password:
            raise ApiError(
                401,
                f"Wrong username or password for {ctx.app}. Usernames are email addresses; passwords "
                "are listed by supervisor.show_account_passwords.",
            )
        return {"access_token": ctx.world.new_token(ctx.app, username), "token_type": "Bearer"}

    spec.api(
        f"Log in to {spec.name} and get an access token for its other APIs.",
        params={
            "username": string("Your account's email address."),
            "password": string("Your password for this app."),
        },
        required=["username", "password"],
        returns="{access_token, token_type}",
        login=False,
        name="login",
    )(login)
