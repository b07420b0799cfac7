"""Requests to an external app's registered origin, and its operations called through them.

Calls go only to the registered origin; every resolved address is checked (`addresses.py`: only global
addresses, and the private networks an operator named for the app) and the connection is made to the
checked address itself, so a DNS answer cannot change between the check and the request.
Redirects are not followed and a response-size cap applies. Each request has one deadline for the whole
of it (connecting, sending, every byte of the answer: an app that trickles its answer cannot hold a call
longer) and runs in a thread of its own, so the caller gets its answer or a 504 at the deadline whatever
the socket is doing; at most `max_concurrent` requests to one app are in flight per process, so a slow app
holds its own slots and no one else's. Any failure becomes an `ApiError`, which the episode turns into an
observation; an outage (the app unreachable, too slow, or answering 5xx) is an `AppUnreachable`, so that
reset and evaluation can retry it.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import httpx

from agentloop.apps.addresses import IPNetwork, refusal
from agentloop.apps.base import ApiError
from agentloop.apps.openapi import EPISODE_HEADER, RESERVED_HEADERS, Operation
from agentloop.apps.openapi_refs import AppRegistrationError

if TYPE_CHECKING:
    from agentloop.settings import Settings


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
    total_s: float = 10.0  # the whole request: connecting, sending, every byte of the answer
    max_bytes: int = 1_000_000
    max_concurrent: int = 8  # requests to one app (origin and base path) in flight at once in this process
    max_calls: int = 200  # an agent's calls to one app in one episode

    @classmethod
    def from_settings(cls, s: Settings) -> HttpLimits:
        return cls(
            total_s=s.app_call_timeout_s,
            max_concurrent=s.app_max_concurrent_calls,
            max_calls=s.app_max_calls_per_episode,
        )


def configured_limits() -> HttpLimits:
    from agentloop.settings import get_settings

    return HttpLimits.from_settings(get_settings())


_SLOTS: dict[tuple[str, str, int, str, int], threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def _slots(origin: Origin, size: int) -> threading.BoundedSemaphore:
    """The process's request slots for one app (its origin and base path), `size` of them."""
    key = (origin.scheme, origin.host, origin.port, origin.base_path, size)
    with _SLOTS_LOCK:
        return _SLOTS.setdefault(key, threading.BoundedSemaphore(size))


@dataclass
class RemoteClient:
    """Requests to one registered origin, with the checks of the module docstring."""

    origin: Origin
    allowed: tuple[IPNetwork, ...]  # private networks it may call besides global addresses
    auth_header: tuple[str, str] | None = None
    limits: HttpLimits = field(default_factory=configured_limits)
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
        limits = self.limits
        deadline = time.monotonic() + limits.total_s
        slots = _slots(self.origin, limits.max_concurrent)
        if not slots.acquire(timeout=limits.total_s):
            raise AppUnreachable(
                503,
                f"the app already has {limits.max_concurrent} requests in flight from this worker and none ended "
                f"within {limits.total_s:g} s",
            )
        timeout = httpx.Timeout(limits.total_s, connect=min(limits.connect_s, limits.total_s))
        client = httpx.Client(timeout=timeout, follow_redirects=False, transport=self.transport)
        extensions = {"sni_hostname": self.origin.host} if self.origin.scheme == "https" else {}
        done: queue.Queue[tuple[int, str, bytes] | BaseException] = queue.Queue(maxsize=1)

        def exchange() -> None:  # in a thread of its own: the caller waits for it until the deadline only
            outcome: tuple[int, str, bytes] | BaseException = RuntimeError("the request ended without an answer")
            try:
                with (
                    client,
                    client.stream(
                        method.upper(), url, params=query, headers=send_headers, json=body, extensions=extensions
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
                        if len(data) > limits.max_bytes:
                            raise ApiError(502, f"the app's response is larger than {limits.max_bytes} bytes")
                        if time.monotonic() > deadline:
                            raise httpx.ReadTimeout("past the call's deadline")
                    outcome = (resp.status_code, resp.headers.get("content-type", ""), bytes(data))
            except BaseException as exc:  # handed to the caller, who raises it
                outcome = exc
            finally:
                slots.release()  # when the exchange ends, not when the caller stops waiting: the slot bounds threads
                done.put(outcome)

        threading.Thread(target=exchange, name=f"app-call {self.origin.host}", daemon=True).start()
        try:
            outcome = done.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            client.close()  # its connection closes: the exchange ends at its next read, within total_s
            raise AppUnreachable(504, f"the app did not answer within {limits.total_s:g} s") from None
        if isinstance(outcome, httpx.TimeoutException):
            raise AppUnreachable(504, f"the app did not answer within {limits.total_s:g} s") from None
        if isinstance(outcome, httpx.HTTPError):
            where = f"{self.origin.host}:{self.origin.port}"
            raise AppUnreachable(
                502, f"could not reach the app at {where} ({type(outcome).__name__}: {outcome})"
            ) from None
        if isinstance(outcome, BaseException):
            raise outcome
        status, content_type, data = outcome
        try:
            value = _decode(data, content_type)
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
        except RecursionError:  # arrays or objects nested deeper than the decoder goes
            raise ApiError(502, "the app's response is JSON nested too deeply to read") from None
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
