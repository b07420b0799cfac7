"""The app contract: an App has a name, a description and APIs; an API has a JSON-schema for its
arguments, a description, a return description and a handler.

Built-in apps keep their state as tables of JSON records inside a World (see world.py), so that
snapshots are copies and evaluation is a diff. A handler receives a `CallContext` (its own tables,
the logged-in user, the world's frozen clock) and its validated arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import referencing.exceptions

from agentloop.apps.api_doc import api_doc, clip, one_line

if TYPE_CHECKING:
    from agentloop.apps.world import World
    from agentloop.apps.world_prompt import WorkedExample

Record = dict[str, Any]
Table = dict[str, Record]  # record id (as a string) -> record
AppState = dict[str, Table]  # table name -> table; names starting with "_" are bookkeeping, not diffed

PAGE_LIMIT_MAX = 20


class ApiError(Exception):
    """An error the app returns to its caller, as a product would: an HTTP-like status and a message."""

    def __init__(self, status: int, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        # what went wrong, for metrics: unknown_app | unknown_api | bad_arguments | auth | api_error
        self.kind = kind or {401: "auth", 403: "auth", 422: "bad_arguments"}.get(status, "api_error")

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


def string(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **extra}


def integer(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "description": desc, **extra}


def number(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "number", "description": desc, **extra}


def boolean(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "boolean", "description": desc, **extra}


def array(desc: str, items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "array", "description": desc, "items": items, **extra}


def page_params(default_limit: int = 5) -> dict[str, dict[str, Any]]:
    return {
        "page_index": integer("Zero-based page number.", minimum=0, default=0),
        "page_limit": integer(
            f"Items per page (max {PAGE_LIMIT_MAX}).", minimum=1, maximum=PAGE_LIMIT_MAX, default=default_limit
        ),
    }


def schema_problem(error: jsonschema.exceptions.SchemaError) -> str:
    """How a schema breaks its draft's metaschema, and where in the schema, in one short line."""
    where = ".".join(str(p) for p in error.absolute_path)
    return clip(f"{error.message}, at {where}" if where else error.message, 80)


ACCESS_TOKEN = string("Access token from this app's `login` API.")


@dataclass(frozen=True)
class Api:
    app: str
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of type object
    returns: str
    handler: Callable[..., Any]
    login_required: bool = False
    hidden: bool = False  # never listed to the agent (e.g. an external app's agentloop_* operations)
    summary: str = ""  # a short line for listings (an OpenAPI summary); empty: the description's first sentence

    def doc(self) -> dict[str, Any]:
        """The full documentation (`api_docs.show_api_doc` shows it fitted to the observation cap)."""
        return api_doc(self)

    @property
    def summary_line(self) -> str:
        """The API's line in `api_docs.list_apis`: its summary, else its description's first sentence, cut."""
        return one_line(self.summary or self.description)

    @cached_property
    def _validator(self) -> Any:
        """Built once: `jsonschema.validate` checks the schema itself against its metaschema on every call,
        which was most of what a built-in tool call cost."""
        cls = jsonschema.validators.validator_for(self.parameters)
        cls.check_schema(self.parameters)
        return cls(self.parameters)

    def validate(self, args: Any) -> dict[str, Any]:
        """Check arguments against the schema; return them with defaults filled in. A schema that cannot be
        used (an app's stored schema that is not valid JSON Schema) is an error of this call, not a crash."""
        if not isinstance(args, dict):
            raise ApiError(422, f"Arguments of {self.app}.{self.name} must be a JSON object.")
        try:
            validator = self._validator
            props = self.parameters.get("properties", {})
            unknown = sorted(set(args) - set(props))
            error = None if unknown else jsonschema.exceptions.best_match(validator.iter_errors(args))
            filled = {k: v["default"] for k, v in props.items() if isinstance(v, dict) and "default" in v}
        except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable, re.error) as exc:
            problem = schema_problem(exc) if isinstance(exc, jsonschema.exceptions.SchemaError) else clip(str(exc), 80)
            raise ApiError(
                500,
                f"{self.app}.{self.name} cannot be called: the app's schema of its arguments is not valid "
                f"JSON Schema ({problem}). The app's owner has to fix its document; use another API meanwhile.",
            ) from None
        if unknown:
            raise ApiError(
                422,
                f"Unknown argument(s) {', '.join(unknown)} for {self.app}.{self.name}; "
                f"it takes: {', '.join(props) or 'no arguments'}.",
            )
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "arguments"
            raise ApiError(422, f"Invalid {where} for {self.app}.{self.name}: {error.message}")
        filled.update(args)
        return filled


@dataclass
class CallContext:
    """What a built-in API handler sees."""

    world: World
    app: str
    user: str | None  # email of the logged-in account (None for APIs without login)

    @property
    def db(self) -> AppState:
        return self.world.state[self.app]

    @property
    def now(self) -> datetime:
        return self.world.now

    def table(self, name: str) -> Table:
        return self.world.state[self.app][name]

    def get(self, table: str, record_id: Any, what: str | None = None) -> Record:
        rec = self.world.state[self.app][table].get(str(record_id))
        if rec is None:
            raise ApiError(404, f"No {what or table.rstrip('s')} with id {record_id}.")
        return rec

    def insert(self, table: str, record: Record) -> Record:
        """Add a record with the table's next id (deterministic, like a database sequence)."""
        return insert_record(self.world.state[self.app], table, record)


def insert_record(app_state: AppState, table: str, record: Record) -> Record:
    """Insert with the next id of the table's sequence. Ids are never reused, so a deleted record
    and a new one are a removal and an addition in a diff, not an update."""
    rows = app_state[table]
    seq = app_state.setdefault("_sequences", {}).setdefault(table, {"next": 1})
    next_id = max(seq["next"], max((int(k) for k in rows), default=0) + 1)
    seq["next"] = next_id + 1
    record = {"id": next_id, **record}
    rows[str(next_id)] = record
    return record


@dataclass
class AppSpec:
    """A built-in app: APIs registered with `@app.api(...)`, and a builder of its initial tables."""

    name: str
    description: str
    build_state: Callable[[Any], AppState] | None = None  # (WorldData) -> tables
    login: bool = True  # gets a standard `login` API and per-call access tokens
    volatile_fields: frozenset[str] = frozenset()  # fields whose changes are never collateral damage
    apis: dict[str, Api] = field(default_factory=dict)
    # the app's own worked example for the neutral prompt (an external app's agentloop_example); may raise
    worked_example: Callable[[], WorkedExample] | None = None

    def api(
        self,
        description: str,
        params: dict[str, dict[str, Any]] | None = None,
        required: Iterable[str] = (),
        returns: str = "",
        login: bool | None = None,
        name: str | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        needs_login = self.login if login is None else login

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            api_name = name or fn.__name__
            props = dict(params or {})
            req = list(required)
            if needs_login:
                props = {"access_token": ACCESS_TOKEN, **props}
                req = ["access_token", *req]
            schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
            if req:
                schema["required"] = req
            self.apis[api_name] = Api(
                app=self.name,
                name=api_name,
                description=description,
                parameters=schema,
                returns=returns,
                handler=fn,
                login_required=needs_login,
            )
            return fn

        return register


class AppHandle(Protocol):
    """Anything a World can route calls to: a built-in app or an external app over HTTP."""

    name: str
    description: str

    def list_apis(self) -> list[Api]: ...


def paginate(items: list[Any], page_index: int, page_limit: int) -> list[Any]:
    start = page_index * page_limit
    return items[start : start + page_limit]
