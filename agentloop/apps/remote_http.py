"""Requests to an external app's registered origin, and its operations called through them.

Calls go only to the registered origin; every resolved address is checked (`addresses.py`: only global
addresses, and the private networks an operator named for the app) and the connection is made to the
checked address itself, so a DNS answer cannot change between the check and the request.
Redirects are not followed; timeouts and a response-size cap apply. Any failure becomes an
`ApiError`, which the episode turns into an observation; an outage (the app unreachable, too slow, or
answering 5xx) is an `AppUnreachable`, so that reset and evaluation can retry it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from agentloop.apps.addresses import IPNetwork, refusal
from agentloop.apps.base import ApiError
from agentloop.apps.openapi import EPISODE_HEADER, RESERVED_HEADERS, Operation
from agentloop.apps.openapi_refs import AppRegistrationError


class AppUnreachable(ApiError):
    """The app could not be reached, did not answer in time, or answered with a server error (5xx): an
    outage, which may be over soon. An agent's call sees it as any other error observation."""


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
        try:
            port = parts.port
        except ValueError:  # urllib: "Port out of range 0-65535", or not a number
            port = 0
        if port == 0:
            raise AppRegistrationError(f"base_url's port must be a number from 1 to 65535, not in {base_url!r}")
        port = port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    def checked_addresses(self, allowed: Sequence[IPNetwork] = ()) -> list[str]:
        """The host's addresses, every one of them allowed (else AppRegistrationError naming why not)."""
        addresses = resolve(self.host, self.port)
        refused = [(a, why) for a in addresses if (why := refusal(a, allowed)) is not None]
        if refused:
            named = ", ".join(f"{a} ({why})" for a, why in refused)
            raise AppRegistrationError(
                f"{self.host} resolves to {named}: not a global address and not in the app's allowed_networks "
                "(which only an operator key can set; link-local, multicast, broadcast and 0.0.0.0/8 are never "
                "allowed)"
            )
        return addresses


@dataclass
class HttpLimits:
    connect_s: float = 3.0  # httpx's default is 5 s for every phase; an agent turn should not wait that long
    read_s: float = 10.0
    max_bytes: int = 1_000_000


@dataclass
class RemoteClient:
    """Requests to one registered origin, with the checks of the module docstring."""

    origin: Origin
    allowed: tuple[IPNetwork, ...]  # private networks it may call besides global addresses
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
            address = self.origin.checked_addresses(self.allowed)[0]
        except AppRegistrationError as exc:
            raise ApiError(403, f"refused to call {self.origin.host}: {exc}") from None
        host_in_url = f"[{address}]" if ":" in address else address
        url = f"{self.origin.scheme}://{host_in_url}:{self.origin.port}{self.origin.base_path}{path}"
        # the operation's header arguments first, then the service's own, which no argument can replace
        managed = {*RESERVED_HEADERS, *([self.auth_header[0].lower()] if self.auth_header else [])}
        send_headers = {k: v for k, v in (headers or {}).items() if k.lower() not in managed}
        send_headers["Host"] = (
            self.origin.host if self.origin.port in (80, 443) else f"{self.origin.host}:{self.origin.port}"
        )
        send_headers["Accept"] = "application/json"
        if self.auth_header:
            send_headers[self.auth_header[0]] = self.auth_header[1]
        if self.episode:
            send_headers[EPISODE_HEADER] = self.episode
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
            raise AppUnreachable(504, f"the app did not answer within {self.limits.read_s:g} s") from None
        except httpx.HTTPError as exc:
            where = f"{self.origin.host}:{self.origin.port}"
            raise AppUnreachable(502, f"could not reach the app at {where} ({type(exc).__name__}: {exc})") from None
        try:
            value = _decode(bytes(data), content_type)
        except ApiError:
            if status < 500:
                raise
            value = ""  # a server error with an unreadable body is still an outage
        if status >= 400:
            message = value.get("detail") or value.get("message") or value if isinstance(value, dict) else value
            error = AppUnreachable if status >= 500 else ApiError
            raise error(status, f"the app answered {status}: {str(message)[:500]}")
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


def path_segment(name: str, value: Any) -> str:
    """A path parameter's value as one segment under the app's base path: never `.` or `..` (which climb
    out of it once a server or proxy resolves them), no `/` or `\\` (more segments), no control character."""
    text = str(value)
    if text in ("", ".", "..") or any(c in text for c in "/\\") or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ApiError(
            400,
            f"path parameter {name!r} is {text!r}: it must be one path segment, not empty, '.' or '..', without "
            "'/', '\\' or control characters",
        )
    return text


def call_operation(client: RemoteClient, op: Operation, args: dict[str, Any]) -> Any:
    path = op.path
    query: dict[str, Any] = {}
    headers: dict[str, str] = {}
    for p in op.parameters:
        if p["name"] not in args:
            continue
        value = args[p["name"]]
        if p["in"] == "path":
            path = path.replace("{" + p["name"] + "}", quote(path_segment(p["name"], value), safe=""))
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
