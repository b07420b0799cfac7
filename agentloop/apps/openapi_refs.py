"""Local `$ref`s of an OpenAPI document, inlined within limits.

Each referenced component is resolved once and shared wherever it is used, so a document whose
schemas refer to each other twice per level costs time linear in its length, not in its expansion.
The expansion's size and depth are measured on that shared form (each shared part once) and checked
before anything is serialised; a recursive schema is cut where it refers back to itself. Every walk
uses an explicit stack, so no document can exhaust Python's recursion limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

if TYPE_CHECKING:
    from agentloop.settings import Settings


class AppRegistrationError(ValueError):
    """The document or URL cannot be used; the message says what to fix."""


class DocumentLimitExceeded(AppRegistrationError):
    """The document is over one of the `DocumentLimits`; `setting` names the field that raises it."""

    def __init__(self, message: str, setting: str, limit: int, unit: str) -> None:
        env = f"AGENTLOOP_{setting.upper()}"
        super().__init__(
            f"{message}; the limit is {limit} {unit} (setting {setting}: an operator can raise it with {env})"
        )
        self.setting = setting
        self.env = env
        self.limit = limit


@dataclass(frozen=True)
class DocumentLimits:
    """What one document may declare and expand to; the defaults and their env variables are in Settings."""

    max_operations: int
    max_ref_depth: int
    max_schema_depth: int
    max_operation_schema_bytes: int
    max_app_schema_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> DocumentLimits:
        return cls(
            max_operations=settings.openapi_max_operations,
            max_ref_depth=settings.openapi_max_ref_depth,
            max_schema_depth=settings.openapi_max_schema_depth,
            max_operation_schema_bytes=settings.openapi_max_operation_schema_bytes,
            max_app_schema_bytes=settings.openapi_max_app_schema_bytes,
        )


@dataclass
class _OpenRef:
    """A reference whose target is being resolved: every node under it is still on the stack."""

    ref: str
    parent: Any  # the dict or list the resolved target goes into, at `key`
    key: Any
    holder: list[Any]
    child_height: int = 0  # deepest chain of references met inside the target


def _scalar_bytes(value: Any) -> int:
    return len(json.dumps(value))


class RefResolver:
    """The `#/...` references of one document, each resolved once; raises AppRegistrationError."""

    def __init__(self, doc: dict[str, Any], limits: DocumentLimits) -> None:
        self.doc = doc
        self.limits = limits
        self._resolved: dict[str, Any] = {}  # ref -> its target with every reference inside inlined
        self._ref_height: dict[str, int] = {}  # ref -> longest chain of references its expansion follows
        self._measured: dict[int, tuple[int, int]] = {}  # id(node) -> (compact JSON bytes, nesting height)
        self._pinned: list[Any] = []  # keeps measured nodes alive, so no id is reused by another node

    def _ref_depth_error(self, where: str, ref: str) -> DocumentLimitExceeded:
        return DocumentLimitExceeded(
            f"{where}: {ref} is nested inside more $refs than allowed",
            "openapi_max_ref_depth",
            self.limits.max_ref_depth,
            "nested $refs",
        )

    def _schema_depth_error(self, where: str) -> DocumentLimitExceeded:
        return DocumentLimitExceeded(
            f"{where}: a schema nests objects/arrays too deeply once its $refs are expanded",
            "openapi_max_schema_depth",
            self.limits.max_schema_depth,
            "nested objects/arrays",
        )

    def target(self, ref: str) -> Any:
        """The raw node a local reference points at."""
        if not ref.startswith("#/"):
            raise AppRegistrationError(f"only local references are supported, not {ref!r}")
        node: Any = self.doc
        for raw in ref[2:].split("/"):
            # a $ref is a URI: its fragment is percent-decoded first, then read as a JSON pointer (RFC 6901 §6)
            part = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif (
                isinstance(node, list) and part.isdigit() and (part == "0" or part[0] != "0") and int(part) < len(node)
            ):
                node = node[int(part)]
            else:
                raise AppRegistrationError(f"reference {ref!r} points nowhere")
        return node

    def deref(self, node: Any, where: str) -> Any:
        """`node`, or what it refers to when it is itself a reference (a parameter, body or response)."""
        chain: list[str] = []
        while isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref in chain:
                raise AppRegistrationError(f"{where}: the references {' -> '.join([*chain, ref])} form a cycle")
            chain.append(ref)
            if len(chain) > self.limits.max_ref_depth:
                raise self._ref_depth_error(where, ref)
            node = self.target(ref)
        return node

    def schema(self, node: Any, where: str) -> Any:
        """`node` with every reference inside it inlined. Inlined targets are shared, not copied: treat the
        result as read-only. A reference back into a schema being expanded becomes an open schema."""
        max_ref, max_depth = self.limits.max_ref_depth, self.limits.max_schema_depth
        root: list[Any] = [None]
        open_refs: list[_OpenRef] = []  # outermost first
        on_path: set[str] = set()
        # (raw node, container its result goes into, key there, nesting depth) or a reference to close
        stack: list[tuple[Any, Any, Any, int] | _OpenRef] = [(node, root, 0, 1)]
        while stack:
            item = stack.pop()
            if isinstance(item, _OpenRef):  # everything under this reference is resolved
                open_refs.pop()
                on_path.discard(item.ref)
                height = item.child_height + 1
                self._resolved[item.ref], self._ref_height[item.ref] = item.holder[0], height
                item.parent[item.key] = item.holder[0]
                if open_refs:
                    open_refs[-1].child_height = max(open_refs[-1].child_height, height)
                continue
            value, parent, key, depth = item
            if isinstance(value, dict) and isinstance(value.get("$ref"), str):
                ref = value["$ref"]
                if ref in self._resolved:
                    height = self._ref_height[ref]
                    if len(open_refs) + height > max_ref:
                        raise self._ref_depth_error(where, ref)
                    if open_refs:
                        open_refs[-1].child_height = max(open_refs[-1].child_height, height)
                    parent[key] = self._resolved[ref]
                elif ref in on_path:
                    parent[key] = {"description": f"(recursive: the schema of {ref})"}
                else:
                    if len(open_refs) >= max_ref:
                        raise self._ref_depth_error(where, ref)
                    opened = _OpenRef(ref, parent, key, [None])
                    open_refs.append(opened)
                    on_path.add(ref)
                    stack.append(opened)
                    stack.append((self.target(ref), opened.holder, 0, depth))
            elif isinstance(value, dict | list):
                if depth > max_depth:
                    raise self._schema_depth_error(where)
                if isinstance(value, dict):
                    out: Any = dict.fromkeys(value)
                    stack.extend((v, out, k, depth + 1) for k, v in value.items())
                else:
                    out = [None] * len(value)
                    stack.extend((v, out, i, depth + 1) for i, v in enumerate(value))
                parent[key] = out
            else:
                parent[key] = value
        return root[0]

    def measure(self, node: Any) -> tuple[int, int]:
        """(compact JSON bytes, nesting height) of a resolved value; each shared part is measured once."""
        if not isinstance(node, dict | list):
            return _scalar_bytes(node), 0
        stack: list[tuple[Any, bool]] = [(node, False)]
        while stack:
            value, children_done = stack.pop()
            if id(value) in self._measured:
                continue
            children = list(value.values()) if isinstance(value, dict) else value
            if not children_done:
                stack.append((value, True))
                stack.extend((c, False) for c in children if isinstance(c, dict | list))
                continue
            size = 2 + max(len(children) - 1, 0)  # brackets and commas
            if isinstance(value, dict):
                size += sum(_scalar_bytes(k) + 1 for k in value)  # "key":
            height = 0
            for child in children:
                if isinstance(child, dict | list):
                    child_size, child_height = self._measured[id(child)]
                    size, height = size + child_size, max(height, child_height)
                else:
                    size += _scalar_bytes(child)
            self._measured[id(value)] = (size, height + 1)
            self._pinned.append(value)
        return self._measured[id(node)]

    def check_arguments(self, schemas: list[Any], where: str, app_bytes_so_far: int) -> int:
        """Bytes of one operation's argument schemas; raises when they, or the app's so far, are over a limit."""
        size = 0
        for schema in schemas:
            schema_size, height = self.measure(schema)
            if height > self.limits.max_schema_depth:
                raise self._schema_depth_error(where)
            size += schema_size
        if size > self.limits.max_operation_schema_bytes:
            raise DocumentLimitExceeded(
                f"{where}: the argument schemas expand to {size} bytes of JSON",
                "openapi_max_operation_schema_bytes",
                self.limits.max_operation_schema_bytes,
                "bytes per operation",
            )
        if app_bytes_so_far + size > self.limits.max_app_schema_bytes:
            raise DocumentLimitExceeded(
                f"{where}: the argument schemas of the operations up to this one expand to "
                f"{app_bytes_so_far + size} bytes of JSON",
                "openapi_max_app_schema_bytes",
                self.limits.max_app_schema_bytes,
                "bytes per app",
            )
        return size


class _Literal(str):
    """JSON text already written, as opposed to a value still to write."""


def json_preview(value: Any, limit: int) -> str:
    """The first `limit` characters of `value` as compact JSON, without writing the rest."""
    pieces: list[str] = []
    written = 0
    stack: list[Any] = [value]
    while stack and written < limit:
        item = stack.pop()
        if isinstance(item, _Literal):
            piece = str(item)
        elif isinstance(item, dict):
            piece = "{"
            stack.append(_Literal("}"))
            for i, (k, v) in reversed(list(enumerate(item.items()))):
                stack.extend((v, _Literal(("," if i else "") + json.dumps(k) + ":")))
        elif isinstance(item, list):
            piece = "["
            stack.append(_Literal("]"))
            for i, v in reversed(list(enumerate(item))):
                stack.extend((v, _Literal(",")) if i else (v,))
        else:
            piece = json.dumps(item)
        pieces.append(piece)
        written += len(piece)
    return "".join(pieces)[:limit]


def _index(part: str) -> int:
    """A JSON pointer's array index ("0", "12"; not "01", "-" or "x"), or a number no list reaches."""
    return int(part) if part.isdigit() and (part == "0" or part[0] != "0") else 1 << 62
