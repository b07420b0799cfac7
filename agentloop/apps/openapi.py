"""External apps: an OpenAPI 3 document + a base URL. Each operation becomes an API (named by its
operationId) that the agent calls over HTTP.

Calls go only to the registered origin; every resolved address is checked (no loopback, private,
link-local, multicast or reserved address unless an admin allowed it) and the connection is made to
the checked address itself, so a DNS answer cannot change between the check and the request.
Redirects are not followed; timeouts and a response-size cap apply. Any failure becomes an
`ApiError`, which the episode turns into an observation.

An app that declares the operations `agentloop_tasks`, `agentloop_reset` and `agentloop_evaluate`
is also an environment: tasks can be listed, reset per episode (header `Agentloop-Episode`) and
evaluated. Those three are never shown to the agent.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from agentloop.apps.base import Api, ApiError, AppSpec, CallContext
from agentloop.apps.openapi_refs import (
    AppRegistrationError,
    DocumentLimitExceeded,
    DocumentLimits,
    RefResolver,
    json_preview,
)

TASKS_OP, RESET_OP, EVALUATE_OP = "agentloop_tasks", "agentloop_reset", "agentloop_evaluate"
HIDDEN_OPS = frozenset({TASKS_OP, RESET_OP, EVALUATE_OP})
EPISODE_HEADER = "Agentloop-Episode"
_EPISODE = EPISODE_HEADER.lower()
METHODS = ("get", "post", "put", "patch", "delete")
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
RETURNS_SCHEMA_CHARS = 400  # of the response schema, in an API's `returns`

# --- addresses ---------------------------------------------------------------------------------


def address_allowed(ip: str, allow_private: bool) -> bool:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if allow_private:
        return not (addr.is_multicast or addr.is_unspecified)
    return addr.is_global and not (addr.is_multicast or addr.is_reserved)


def resolve(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise AppRegistrationError(f"cannot resolve host {host!r}: {exc.strerror}") from None
    return sorted({str(info[4][0]) for info in infos})


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, base_url: str) -> Origin:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AppRegistrationError(f"base_url must be an http(s) URL with a host, not {base_url!r}")
        if parts.username or parts.password:
            raise AppRegistrationError("base_url must not carry credentials; use auth_header")
        if parts.query or parts.fragment:
            raise AppRegistrationError("base_url must not have a query or a fragment")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    def checked_addresses(self, allow_private: bool) -> list[str]:
        addresses = resolve(self.host, self.port)
        refused = [a for a in addresses if not address_allowed(a, allow_private)]
        if refused:
            raise AppRegistrationError(
                f"{self.host} resolves to {', '.join(refused)}, a loopback, private, link-local or reserved "
                "address; only an admin can allow that (allow_private: true)"
            )
        return addresses


# --- the document ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str
    description: str
    parameters: tuple[dict[str, Any], ...]  # {"name", "in": path|query|header, "required", "schema"}
    body_schema: dict[str, Any] | None
    body_required: bool
    returns: str

    def to_json(self) -> dict[str, Any]:
        """The stored form (the app's row keeps it, so requests never parse the document again)."""
        return {
            "operation_id": self.operation_id,
            "method": self.method,
            "path": self.path,
            "description": self.description,
            "parameters": list(self.parameters),
            "body_schema": self.body_schema,
            "body_required": self.body_required,
            "returns": self.returns,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Operation:
        return cls(**{**data, "parameters": tuple(data["parameters"])})

    def without_headers(self, names: tuple[str, ...]) -> Operation:
        """The operation minus the header parameters the service sets itself (the registered auth header)."""
        managed = {n.lower() for n in names}
        kept = tuple(p for p in self.parameters if not (p["in"] == "header" and p["name"].lower() in managed))
        return self if len(kept) == len(self.parameters) else replace(self, parameters=kept)

    @property
    def flat_body(self) -> bool:
        """An object body's properties become arguments of their own; any other body is `body`."""
        return bool(self.body_schema and self.body_schema.get("type") == "object" and "properties" in self.body_schema)

    def arguments_schema(self) -> dict[str, Any]:
        props: dict[str, Any] = {}
        required: list[str] = []
        for p in self.parameters:
            props[p["name"]] = {**p["schema"], "description": p.get("description", "")}
            if p["required"]:
                required.append(p["name"])
        if self.body_schema is not None:
            if self.flat_body:
                for name, prop in self.body_schema["properties"].items():
                    if name in props:
                        raise AppRegistrationError(
                            f"operation {self.operation_id}: body property {name!r} clashes with a parameter"
                        )
                    props[name] = prop
                if self.body_required:
                    required += list(self.body_schema.get("required", []))
            else:
                props["body"] = self.body_schema
                if self.body_required:
                    required.append("body")
        schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
        if required:
            schema["required"] = required
        return schema


def _returns(op: dict[str, Any], resolver: RefResolver, where: str) -> str:
    responses = op.get("responses") or {}
    if not isinstance(responses, dict):
        raise AppRegistrationError(f"{where}: responses must be an object")
    for code in ("200", "201", "2XX", "default"):
        resp = resolver.deref(responses.get(code), where)
        if isinstance(resp, dict):
            content = resp.get("content")
            media = resolver.deref(content.get("application/json"), where) if isinstance(content, dict) else None
            schema = media.get("schema") if isinstance(media, dict) else None
            text = str(resp.get("description", ""))
            if schema:
                # only a preview is shown, so a large response schema is never written out whole
                preview = json_preview(resolver.schema(schema, where), RETURNS_SCHEMA_CHARS)
                text += (" " if text else "") + preview
            return text
    return ""


def _count_operations(paths: dict[str, Any]) -> int:
    return sum(isinstance(item, dict) and item.get(m) is not None for item in paths.values() for m in METHODS)


def parse_document(
    doc: Any, managed_headers: tuple[str, ...] = (), limits: DocumentLimits | None = None
) -> list[Operation]:
    """Every operation of an OpenAPI 3 document, checked, with its `$ref`s inlined within `limits` (default:
    the settings'); raises AppRegistrationError (DocumentLimitExceeded over a limit). Header parameters the
    service sets itself (Agentloop-Episode, the registered auth header) are not arguments the agent gives."""
    from agentloop.settings import get_settings

    limits = limits or DocumentLimits.from_settings(get_settings())
    if not isinstance(doc, dict) or not str(doc.get("openapi", "")).startswith("3."):
        raise AppRegistrationError('not an OpenAPI 3 document: the top level needs "openapi": "3.x.y"')
    paths = doc.get("paths")
    if not isinstance(paths, dict) or not paths:
        raise AppRegistrationError('the document has no "paths"')
    declared = _count_operations(paths)
    if declared > limits.max_operations:  # before any of them is resolved
        raise DocumentLimitExceeded(
            f"the document declares {declared} operations",
            "openapi_max_operations",
            limits.max_operations,
            "operations",
        )
    resolver = RefResolver(doc, limits)
    ops: list[Operation] = []
    seen: set[str] = set()
    app_bytes = 0
    for path, item in paths.items():
        if not isinstance(path, str) or not path.startswith("/") or not isinstance(item, dict):
            raise AppRegistrationError(f"invalid path entry {path!r}")
        shared = item.get("parameters", [])
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            where = f"{method.upper()} {path}"
            if not isinstance(op, dict):
                raise AppRegistrationError(f"{where}: an operation must be an object")
            op_id = op.get("operationId")
            if not isinstance(op_id, str) or not NAME_RE.match(op_id):
                raise AppRegistrationError(
                    f"{where}: needs an operationId of letters, digits and underscores (it names the API)"
                )
            if op_id in seen:
                raise AppRegistrationError(f"operationId {op_id!r} is used twice")
            seen.add(op_id)
            own = op.get("parameters", [])
            if not isinstance(shared, list) or not isinstance(own, list):
                raise AppRegistrationError(f"{where}: parameters must be a list")
            params = []
            for entry in [*shared, *own]:
                raw = resolver.deref(entry, where)
                if not isinstance(raw, dict) or raw.get("in") not in ("path", "query", "header", "cookie"):
                    raise AppRegistrationError(f"{where}: each parameter needs a name and in: path|query|header")
                if raw["in"] == "cookie" or (raw["in"] == "header" and str(raw.get("name")).lower() == _EPISODE):
                    continue
                params.append(
                    {
                        "name": str(raw.get("name")),
                        "in": raw["in"],
                        "required": bool(raw.get("required", raw["in"] == "path")),
                        "schema": resolver.schema(raw.get("schema") or {}, where),
                        "description": str(raw.get("description", "")),
                    }
                )
            for name in re.findall(r"{([^}]+)}", path):
                if not any(p["name"] == name and p["in"] == "path" for p in params):
                    raise AppRegistrationError(f"{where}: path parameter {name!r} is not declared")
            body = resolver.deref(op.get("requestBody"), where)
            body_schema, body_required = None, False
            if isinstance(body, dict):
                content = body.get("content")
                json_body = None
                if isinstance(content, dict):
                    json_body = resolver.deref(content.get("application/json"), where)
                if not isinstance(json_body, dict):
                    raise AppRegistrationError(f"{where}: only application/json request bodies are supported")
                body_schema = resolver.schema(json_body.get("schema") or {}, where)
                body_required = bool(body.get("required", False))
            schemas = [p["schema"] for p in params] + ([body_schema] if body_schema is not None else [])
            app_bytes += resolver.check_arguments(schemas, where, app_bytes)
            ops.append(
                Operation(
                    operation_id=op_id,
                    method=method,
                    path=path,
                    description=str(op.get("summary") or op.get("description") or op_id),
                    parameters=tuple(params),
                    body_schema=body_schema,
                    body_required=body_required,
                    returns=_returns(op, resolver, where),
                )
            )
    for parsed in ops:
        parsed.arguments_schema()  # raise now for clashes, not on first call
    return [parsed.without_headers(managed_headers) for parsed in ops] if managed_headers else ops


# --- calls -------------------------------------------------------------------------------------


@dataclass
class HttpLimits:
    connect_s: float = 3.0  # httpx's default is 5 s for every phase; an agent turn should not wait that long
    read_s: float = 10.0
    max_bytes: int = 1_000_000


@dataclass
class RemoteClient:
    """Requests to one registered origin, with the checks of the module docstring."""

    origin: Origin
    allow_private: bool
    auth_header: tuple[str, str] | None = None
    limits: HttpLimits = field(default_factory=HttpLimits)
    episode: str | None = None  # sent as Agentloop-Episode on every request once set
    transport: httpx.BaseTransport | None = None

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        body: Any = None,
    ) -> Any:
        try:
            address = self.origin.checked_addresses(self.allow_private)[0]
        except AppRegistrationError as exc:
            raise ApiError(403, f"refused to call {self.origin.host}: {exc}") from None
        host_in_url = f"[{address}]" if ":" in address else address
        url = f"{self.origin.scheme}://{host_in_url}:{self.origin.port}{self.origin.base_path}{path}"
        send_headers = {
            "Host": self.origin.host if self.origin.port in (80, 443) else f"{self.origin.host}:{self.origin.port}",
            "Accept": "application/json",
        }
        if self.auth_header:
            send_headers[self.auth_header[0]] = self.auth_header[1]
        if self.episode:
            send_headers[EPISODE_HEADER] = self.episode
        send_headers.update(headers or {})
        timeout = httpx.Timeout(self.limits.read_s, connect=self.limits.connect_s)
        extensions = {"sni_hostname": self.origin.host} if self.origin.scheme == "https" else {}
        try:
            with (
                httpx.Client(timeout=timeout, follow_redirects=False, transport=self.transport) as client,
                client.stream(
                    method.upper(),
                    url,
                    params=query,
                    headers=send_headers,
                    json=body if body is not None else None,
                    extensions=extensions,
                ) as resp,
            ):
                if 300 <= resp.status_code < 400:
                    raise ApiError(
                        502,
                        f"the app answered with a redirect ({resp.status_code} to "
                        f"{resp.headers.get('location', '?')}); redirects are not followed",
                    )
                data = bytearray()
                for chunk in resp.iter_bytes():
                    data.extend(chunk)
                    if len(data) > self.limits.max_bytes:
                        raise ApiError(502, f"the app's response is larger than {self.limits.max_bytes} bytes")
                status, content_type = resp.status_code, resp.headers.get("content-type", "")
        except httpx.TimeoutException:
            raise ApiError(504, f"the app did not answer within {self.limits.read_s:g} s") from None
        except httpx.HTTPError as exc:
            raise ApiError(502, f"could not reach the app: {type(exc).__name__}") from None
        value = _decode(bytes(data), content_type)
        if status >= 400:
            message = value.get("detail") or value.get("message") or value if isinstance(value, dict) else value
            raise ApiError(status, f"the app answered {status}: {str(message)[:500]}")
        return value


def _decode(data: bytes, content_type: str) -> Any:
    if not data:
        return None
    if "json" in content_type:
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError(502, "the app's response claims to be JSON but is not") from None
    if content_type.startswith("text/") or not content_type:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(502, "the app's response is not text") from None
    raise ApiError(502, f"the app answered with {content_type!r}, not JSON or text")


def _call_operation(client: RemoteClient, op: Operation, args: dict[str, Any]) -> Any:
    path = op.path
    query: dict[str, Any] = {}
    headers: dict[str, str] = {}
    for p in op.parameters:
        if p["name"] not in args:
            continue
        value = args[p["name"]]
        if p["in"] == "path":
            path = path.replace("{" + p["name"] + "}", quote(str(value), safe=""))
        elif p["in"] == "query":
            query[p["name"]] = json.dumps(value) if isinstance(value, dict | list) else value
        else:
            headers[p["name"]] = str(value)
    body: Any = None
    if op.body_schema is not None:
        if op.flat_body:
            body = {k: v for k, v in args.items() if k in op.body_schema["properties"]}
        else:
            body = args.get("body")
    return client.request(op.method, path, query=query, headers=headers, body=body)


def remote_app(name: str, description: str, operations: list[Operation], client: RemoteClient) -> AppSpec:
    """An AppSpec whose handlers call the external app; the agentloop_* operations stay hidden."""
    spec = AppSpec(name=name, description=description, login=False)
    for op in operations:
        spec.apis[op.operation_id] = Api(
            app=name,
            name=op.operation_id,
            description=op.description,
            parameters=op.arguments_schema(),
            returns=op.returns,
            handler=_handler(client, op),
            hidden=op.operation_id in HIDDEN_OPS,
        )
    return spec


def _handler(client: RemoteClient, op: Operation) -> Callable[..., Any]:
    def handle(_ctx: CallContext, **args: Any) -> Any:
        return _call_operation(client, op, args)

    return handle


# --- environments (agentloop_tasks / reset / evaluate) -------------------------------------------


@dataclass
class RemoteEnvironment:
    """An external app usable for evaluation and training."""

    operations: dict[str, Operation]
    client: RemoteClient

    @classmethod
    def of(cls, operations: list[Operation], client: RemoteClient) -> RemoteEnvironment | None:
        ops = {o.operation_id: o for o in operations}
        return cls(ops, client) if RESET_OP in ops and EVALUATE_OP in ops else None

    def tasks(self) -> list[dict[str, Any]]:
        if TASKS_OP not in self.operations:
            raise ApiError(404, f"the app declares no {TASKS_OP} operation")
        value = _call_operation(self.client, self.operations[TASKS_OP], {})
        if not isinstance(value, list) or not all(isinstance(t, dict) and "task_ref" in t for t in value):
            raise ApiError(502, f"{TASKS_OP} must return a list of {{task_ref, instruction, split}}")
        return value

    def reset(self, task_ref: str) -> str:
        self.client.episode = None
        value = _call_operation(
            self.client,
            self.operations[RESET_OP],
            {"task_ref": task_ref} if self.operations[RESET_OP].flat_body else {"body": {"task_ref": task_ref}},
        )
        if not isinstance(value, dict) or not isinstance(value.get("episode"), str):
            raise ApiError(502, f'{RESET_OP} must return {{"episode": str}}')
        self.client.episode = value["episode"]
        return value["episode"]

    def evaluate(self, task_ref: str, answer: str | None) -> tuple[int, int]:
        args = {"task_ref": task_ref, "answer": answer}
        value = _call_operation(
            self.client,
            self.operations[EVALUATE_OP],
            args if self.operations[EVALUATE_OP].flat_body else {"body": args},
        )
        try:
            passed, total = int(value["passed"]), int(value["total"])
        except (TypeError, KeyError, ValueError):
            raise ApiError(502, f'{EVALUATE_OP} must return {{"passed": int, "total": int}}') from None
        if total <= 0 or not 0 <= passed <= total:
            raise ApiError(502, f"{EVALUATE_OP} returned passed={passed}, total={total}")
        return passed, total
