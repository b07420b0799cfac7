"""An API's documentation as the agent reads it through `api_docs`: one line per API for `list_apis`, and
for `show_api_doc` the full description, every parameter (nested objects and arrays written compactly,
TypeScript-like: `{id: integer, tags?: [string]}`, `?` marking what is optional) and what it returns, fitted
into a size budget with a note of what was shortened.

Sizes are tokens of the JSON the agent is shown (`render_observation` writes a result with
`json.dumps(indent=1)`), estimated from the text alone (`text_size`). Against the default tokenizer
(SmolLM2's), on the built-in docs, a 200-operation app's docs and list pages, the estimate is 10-40% above
the real count for English and about equal for CJK text; only text like random 64-character names is
under-counted (by a quarter). So DOC_MAX_SIZE keeps a doc within about 850 tokens of the default 1,024-token
observation cap, whatever the language of an app's documentation.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentloop.apps.base import Api

SUMMARY_SIZE = 25  # of an API's summary in list_apis (about 100 characters of English)
INDEX_SIZE = 250  # of an app's API index in the prompt (`api_index`): about 20 APIs with their parameters
DOC_MAX_SIZE = 950  # of one show_api_doc result
OUTLINE_MAX_DEPTH = 12  # nested schemas written out; deeper ones are "…"
ELLIPSIS = "…"
# a run of ASCII letters (with the space before it), a digit or punctuation mark, a run of spaces, any other character
_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[!-/:-@\[-`{-~]|\s+|[^\x00-\x7f]")
_LETTERS_PER_TOKEN = 7


def text_size(text: str) -> int:
    """Estimated tokens of `text`: a token per 7 letters of a word, per digit, per punctuation mark and per
    run of spaces; 2 for any other character (a CJK character is 1.7 tokens with the default tokenizer)."""
    size = 0
    for piece in _PIECE.findall(text):
        last = piece[-1]
        if last.isascii() and last.isalpha():
            size += -(-len(piece.lstrip(" ")) // _LETTERS_PER_TOKEN)
        else:
            size += 1 if last.isascii() else 2
    return size


def json_size(value: Any) -> int:
    """Size of `value` as the agent is shown it."""
    return text_size(json.dumps(value, ensure_ascii=False, indent=1))


def clip(text: str, max_size: int | None) -> str:
    """`text` within `max_size` (None: all of it), cut at a word when one is near, ending in "…"."""
    if max_size is None or text_size(text) <= max_size:
        return text
    room = max_size - text_size(ELLIPSIS)
    low, high = 0, len(text)  # the longest prefix that fits, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        if text_size(text[:mid]) <= room:
            low = mid
        else:
            high = mid - 1
    cut = text[:low]
    space = cut.rfind(" ")
    if not text[low].isspace() and space >= len(cut) // 2:  # the cut is inside a word: end at the one before
        cut = cut[:space]
    return cut.rstrip(" ,;:") + ELLIPSIS


def one_line(text: str, max_size: int = SUMMARY_SIZE) -> str:
    """A summary on one line: all of `text` if it fits, else its first sentence if that fits, else cut."""
    line = " ".join(text.split())
    if text_size(line) <= max_size:
        return line
    sentence = re.match(r"(.+?(?:[.!?](?=\s)|。))", line)
    if sentence and text_size(sentence.group(1)) <= max_size:
        return sentence.group(1)
    return clip(line, max_size)


def api_signature(api: Api) -> str:
    """`name(param, optional?, ...)`: an API's parameters by name, `?` marking the optional ones; the access
    token a logged-in API takes is left out (the world's rules say how to get one)."""
    props = api.parameters.get("properties") or {}
    required = set(api.parameters.get("required") or ())
    names = [n if n in required else f"{n}?" for n in props if not (api.login_required and n == "access_token")]
    return f"{api.name}({', '.join(names)})"


def api_index(apis: list[Api], max_size: int | None = INDEX_SIZE) -> str:
    """An app's APIs on one line, in `list_apis` order, each with its parameters (`api_signature`). Past
    `max_size`, an API keeps its parameters only while every later one still fits by name, and when even
    the names do not fit the line ends in "… (N more)". Hidden APIs are never listed."""
    shown = [a for a in apis if not a.hidden]
    full = [api_signature(a) for a in shown]
    if max_size is None or text_size(", ".join(full)) <= max_size:
        return ", ".join(full)
    names = [a.name for a in shown]
    fit = len(names)  # the most APIs that fit by name, with the note of how many more there are
    while (
        fit
        and text_size(", ".join(names[:fit]) + (f", {ELLIPSIS} ({len(names) - fit} more)" if fit < len(names) else ""))
        > max_size
    ):
        fit -= 1
    more = f"{ELLIPSIS} ({len(names) - fit} more)" if fit < len(names) else ""
    parts: list[str] = []
    for i in range(fit):
        with_params = ", ".join([*parts, full[i], *names[i + 1 : fit], *([more] if more else [])])
        parts.append(full[i] if text_size(with_params) <= max_size else names[i])
    return ", ".join([*parts, *([more] if more else [])])


def type_name(schema: Any) -> Any:
    """A parameter's `type`: the schema's own, else what its variants or keywords imply."""
    if not isinstance(schema, dict):
        return "any"
    if "type" in schema:
        return schema["type"]
    for key, sep in (("anyOf", "|"), ("oneOf", "|"), ("allOf", "&")):
        variants = schema.get(key)
        if isinstance(variants, list) and variants:
            return sep.join(str(type_name(v)) for v in variants)
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "enum" if "enum" in schema else "any"


def _compound(schema: Any) -> bool:
    """Whether a schema has parts of its own worth an outline (objects, arrays, variants)."""
    if not isinstance(schema, dict):
        return False
    raw = schema.get("type")
    kinds = {str(k) for k in raw} if isinstance(raw, list) else {str(raw)}
    return bool({"object", "array"} & kinds) or any(
        k in schema for k in ("properties", "items", "additionalProperties", "anyOf", "oneOf", "allOf")
    )


def _literal(value: Any) -> str:
    """A value in an outline; strings in single quotes, which JSON text does not have to escape."""
    if isinstance(value, str) and "'" not in value and "\\" not in value:
        return f"'{value}'"
    return json.dumps(value, ensure_ascii=False)


class _Full(Exception):
    """The outline reached its budget."""


class _Outline:
    """A schema written compactly on one line, stopping at size `limit`."""

    def __init__(self, descriptions: int | None, enum: int | None, limit: int | None) -> None:
        self.descriptions = descriptions  # size of each nested field's description; 0 leaves them out
        self.enum = enum  # values of an enum written out
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.cut = False  # something was left out: enum values, deep parts, the end
        self.dropped_descriptions = False
        self.clipped_descriptions = False

    def put(self, text: str) -> None:
        self.parts.append(text)
        self.size += text_size(text)
        if self.limit is not None and self.size > self.limit:
            raise _Full

    def text(self, schema: Any) -> str:
        try:
            self.schema(schema, 0)
        except _Full:
            self.cut = True
            written = "".join(self.parts)  # can measure a little less than its parts: cut it anyway
            return clip(written, min(self.limit or 0, text_size(written) - 1))
        return "".join(self.parts)

    def schema(self, schema: Any, depth: int) -> None:
        if not isinstance(schema, dict):
            self.put("any")
            return
        described = schema.get("description")
        if isinstance(described, str) and described.startswith("(recursive:"):  # openapi_refs' placeholder
            self.put(described)
            return
        if depth > OUTLINE_MAX_DEPTH:
            self.cut = True
            self.put(ELLIPSIS)
            return
        enum = schema.get("enum")
        if isinstance(enum, list):
            self.values(enum)
            return
        if "const" in schema:
            self.put(_literal(schema["const"]))
            return
        for key, sep in (("anyOf", "|"), ("oneOf", "|"), ("allOf", "&")):
            variants = schema.get(key)
            if isinstance(variants, list) and variants:
                for i, variant in enumerate(variants):
                    self.put(sep if i else "")
                    self.schema(variant, depth + 1)
                return
        raw = schema.get("type")
        kinds = [str(k) for k in raw] if isinstance(raw, list) else [] if raw is None else [str(raw)]
        rest = [k for k in kinds if k not in ("object", "array")]
        if "object" in kinds or (not kinds and isinstance(schema.get("properties"), dict)):
            self.object(schema, depth)
        elif "array" in kinds or (not kinds and "items" in schema):
            self.put("[")
            self.schema(schema.get("items", {}), depth + 1)
            self.extras(schema.get("items"))
            self.put("]")
        else:
            self.put("|".join(rest) or "any")
            if isinstance(schema.get("format"), str):
                self.put(f"<{schema['format']}>")
            return
        if rest:
            self.put("|" + "|".join(rest))

    def values(self, values: list[Any]) -> None:
        shown = values if self.enum is None else values[: self.enum]
        self.put("|".join(_literal(v) for v in shown) or "never")
        if len(shown) < len(values):
            self.cut = True
            self.put(f"|…({len(values) - len(shown)} more)")

    def object(self, schema: dict[str, Any], depth: int) -> None:
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        required = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        extra = schema.get("additionalProperties")
        if not props and not isinstance(extra, dict):
            self.put("object")
            return
        self.put("{")
        for i, (name, sub) in enumerate(props.items()):
            self.put(f"{', ' if i else ''}{name}{'' if name in required else '?'}: ")
            self.schema(sub, depth + 1)
            self.extras(sub)
        if isinstance(extra, dict):
            self.put(f"{', ' if props else ''}[key]: ")
            self.schema(extra, depth + 1)
        self.put("}")

    def extras(self, schema: Any) -> None:
        """A nested field's default and description, after its type."""
        if not isinstance(schema, dict):
            return
        if "default" in schema:
            self.put(f" = {_literal(schema['default'])}")
        described = schema.get("description")
        if isinstance(described, str) and described and not described.startswith("(recursive:"):
            if self.descriptions == 0:
                self.dropped_descriptions = True
            else:
                text = " ".join(described.split())
                shown = clip(text, self.descriptions)
                self.clipped_descriptions |= shown != text
                self.put(f" ({shown})")


def schema_outline(schema: Any, limit: int | None = None, descriptions: int | None = 0) -> str:
    """`schema` written compactly on one line, within `limit` (an ending "…" marks a cut); nested fields'
    descriptions within `descriptions` each (0: left out)."""
    return _Outline(descriptions, None, limit).text(schema)


@dataclass(frozen=True)
class Detail:
    """How much of each part of a doc is written (None: all of it)."""

    description: int | None = None  # size of the API's description
    param_descriptions: int | None = None  # size of each parameter's description; 0 leaves them out
    nested_descriptions: int | None = None  # size of each nested field's description; 0 leaves them out
    outline: int | None = None  # size of each parameter's nested schema; 0: its type's name alone
    enum: int | None = None  # values of each enum
    returns: int | None = None  # size of the return description
    one_line_params: bool = False  # each parameter as one line of text instead of an object


FULL = Detail()
SHORTER = (  # tried in order until the doc fits
    Detail(nested_descriptions=20),
    Detail(description=500, param_descriptions=80, nested_descriptions=0, outline=160, enum=30, returns=160),
    Detail(
        description=400,
        param_descriptions=40,
        nested_descriptions=0,
        outline=100,
        enum=20,
        returns=100,
        one_line_params=True,
    ),
    Detail(
        description=200,
        param_descriptions=16,
        nested_descriptions=0,
        outline=40,
        enum=8,
        returns=50,
        one_line_params=True,
    ),
    Detail(
        description=160,
        param_descriptions=10,
        nested_descriptions=0,
        outline=16,
        enum=3,
        returns=40,
        one_line_params=True,
    ),
    Detail(
        description=120,
        param_descriptions=0,
        nested_descriptions=0,
        outline=0,
        enum=0,
        returns=30,
        one_line_params=True,
    ),
)


SHORTENED = "Shortened to fit (… marks a cut): "


class _Cuts:
    """What a rendering left out, for the doc's `shortened` note."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.counts: Counter[str] = Counter()  # a template with {n} -> parameters it applies to

    def note(self) -> str | None:
        what = [*self.parts, *(label.format(n=n, s="s" * (n > 1)) for label, n in self.counts.items())]
        return f"{SHORTENED}{'; '.join(what)}." if what else None


def _smaller(budget: int | None, limit: int | None) -> int | None:
    return limit if budget is None else budget if limit is None else min(budget, limit)


def _parameter(name: str, schema: Any, required: bool, detail: Detail, cuts: _Cuts, limit: int | None) -> Any:
    """One parameter's entry: an object (name, type, required, description, default, enum, schema...) or,
    with `detail.one_line_params`, one line of text."""
    schema = schema if isinstance(schema, dict) else {}
    outline = _Outline(detail.nested_descriptions, detail.enum, _smaller(detail.outline, limit))
    if detail.outline == 0:
        kind = type_name(schema)
        nested: str | None = "|".join(map(str, kind)) if isinstance(kind, list) else str(kind)
        outline.cut = _compound(schema) or "enum" in schema
    elif _compound(schema) or detail.one_line_params:
        nested = outline.text(schema)
    else:
        nested = None
    if outline.cut:
        cuts.counts["the schema{s} of {n} parameter{s}"] += 1
    if outline.dropped_descriptions:
        cuts.counts["nested fields' descriptions, left out in {n} parameter{s}"] += 1
    elif outline.clipped_descriptions:
        cuts.counts["nested fields' descriptions, in {n} parameter{s}"] += 1
    described = schema.get("description")
    description = " ".join(described.split()) if isinstance(described, str) else None
    if description and detail.param_descriptions is not None:
        shown = clip(description, detail.param_descriptions) if detail.param_descriptions else None
        if shown != description:
            cuts.counts["the description{s} of {n} parameter{s}"] += 1
            description = shown
    enum = schema.get("enum")
    if isinstance(enum, list) and detail.enum is not None and len(enum) > detail.enum:
        enum = enum[: detail.enum]
        if not detail.one_line_params:  # a one-line parameter's enum is in its outline, counted there
            cuts.counts["the enum values of {n} parameter{s}"] += 1
    if detail.one_line_params:
        line = f"{name}{'' if required else '?'}: {nested}"
        if "minimum" in schema or "maximum" in schema:
            line += f" {schema.get('minimum', '')}..{schema.get('maximum', '')}"
        if "default" in schema:
            line += f" = {_literal(schema['default'])}"
        return line + (f" ({description})" if description else "")
    entry: dict[str, Any] = {"name": name, "type": type_name(schema), "required": required}
    if description is not None:
        entry["description"] = description
    for key in ("default", "minimum", "maximum", "format"):
        if key in schema:
            entry[key] = schema[key]
    if isinstance(enum, list):
        entry["enum"] = enum
    if nested is not None:
        entry["schema"] = nested
    return entry


def api_doc(api: Api, detail: Detail = FULL, limit: int | None = None) -> dict[str, Any]:
    """The documentation of `api` written with `detail`; no nested schema is written past size `limit`."""
    cuts = _Cuts()
    description = clip(api.description, detail.description)
    if description != api.description:
        cuts.parts.append(f"the description, to {len(description)} of {len(api.description)} characters")
    props = api.parameters.get("properties")
    props = props if isinstance(props, dict) else {}
    required = api.parameters.get("required")
    required = set(required) if isinstance(required, list) else set()
    params = [_parameter(n, s, n in required, detail, cuts, limit) for n, s in props.items()]
    returns = clip(api.returns, detail.returns)
    if returns != api.returns:
        cuts.parts.append("what it returns")
    doc: dict[str, Any] = {"app": api.app, "api": api.name}
    if note := cuts.note():
        doc["shortened"] = note
    doc.update(description=description, parameters=params, returns=returns)
    return doc


def fitted_api_doc(api: Api, max_size: int = DOC_MAX_SIZE) -> dict[str, Any]:
    """The most complete doc of `api` within `max_size`; the doc's `shortened` says what was cut."""
    doc: dict[str, Any] = {}
    for detail in (FULL, *SHORTER):
        doc = api_doc(api, detail, max_size)
        if json_size(doc) <= max_size:
            return doc
    return _fewer_parameters(doc, max_size)


def _fewer_parameters(doc: dict[str, Any], max_size: int) -> dict[str, Any]:
    """The doc with as many of its (one-line) parameters as fit, the others named in its note."""
    params = doc["parameters"]

    def with_first(k: int) -> dict[str, Any]:
        names = [str(p).split(":", 1)[0].rstrip("?") for p in params[k:]]
        left_out = clip(f"{len(names)} parameters left out: {', '.join(names)}", 80)
        earlier = doc.get("shortened")
        end = "" if left_out.endswith(ELLIPSIS) else "."
        note = f"{earlier[:-1]}; {left_out}{end}" if earlier else f"{SHORTENED}{left_out}{end}"
        rest = {key: value for key, value in doc.items() if key not in ("app", "api", "shortened")}
        return {"app": doc["app"], "api": doc["api"], "shortened": note, **rest, "parameters": params[:k]}

    low, high = 0, len(params)  # the most parameters that fit, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        if json_size(with_first(mid)) <= max_size:
            low = mid
        else:
            high = mid - 1
    return with_first(low)
