"""Text no store can hold, refused at the door: NUL (PostgreSQL's text and jsonb refuse it) and lone UTF-16
surrogates (JSON may escape one, `"\\ud800"`, but no UTF-8 encoder writes it). REST checks the path, the
query and the JSON body before a route runs; gRPC checks each request message. Either way the caller gets
INVALID_ARGUMENT / 422 naming where the character is, and nothing is written."""

from __future__ import annotations

from typing import Any

from agentloop.api.errors import InvalidRequest


def _refused(text: str) -> str | None:
    """Why `text` cannot be stored, or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which cannot be stored"
    for ch in text:
        if "\ud800" <= ch <= "\udfff":
            return f"contains a lone surrogate (\\u{ord(ch):04x}), which is not valid Unicode text"
    return None


def check_text(value: Any, where: str) -> None:
    """InvalidRequest naming the first string (or object key) in `value` (JSON-like: dicts, lists, strings,
    numbers) that cannot be stored; `where` is its root's name ("body", "path", ...). Walked without
    recursion: a body's depth is bounded by its size only."""
    stack: list[tuple[Any, list[str]]] = [(value, [where])]
    while stack:
        item, loc = stack.pop()
        if isinstance(item, str):
            reason = _refused(item)
            if reason is not None:
                _raise(loc, reason)
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and (reason := _refused(key)) is not None:
                    _raise([*loc, key.encode("unicode_escape").decode()], f"this key {reason}")
                stack.append((child, [*loc, str(key)]))
        elif isinstance(item, list | tuple):
            stack.extend((child, [*loc, str(i)]) for i, child in enumerate(item))


def check_message(message: Any) -> None:
    """`check_text` over a protobuf message: its string fields, map keys and values, repeated and nested
    messages (google.protobuf.Struct and Value included: they are messages too)."""
    from google.protobuf.descriptor import FieldDescriptor

    stack: list[tuple[Any, list[str]]] = [(message, ["request"])]
    while stack:
        msg, loc = stack.pop()
        for field, value in msg.ListFields():
            here = [*loc, field.name]
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                for key, item in value.items():
                    if isinstance(key, str) and (reason := _refused(key)) is not None:
                        _raise(here, f"a key {reason}")
                    if isinstance(item, str):
                        check_text(item, ".".join([*here, str(key)]))
                    elif hasattr(item, "ListFields"):
                        stack.append((item, [*here, str(key)]))
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                items = list(value) if _repeated(field) else [value]
                stack.extend((item, [*here, str(i)] if _repeated(field) else here) for i, item in enumerate(items))
            elif field.type == FieldDescriptor.TYPE_STRING:
                for i, text in enumerate(list(value) if _repeated(field) else [value]):
                    if (reason := _refused(text)) is not None:
                        _raise([*here, str(i)] if _repeated(field) else here, reason)


def _repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.29; `label` before it
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED


def _raise(loc: list[str], reason: str) -> None:
    where = ".".join(loc)
    raise InvalidRequest(f"{where}: {reason}", [{"loc": loc, "message": reason, "type": "text_not_storable"}])
