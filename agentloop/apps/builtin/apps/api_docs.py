"""The api_docs app: how the agent discovers the APIs of the apps it may use. However many APIs an app has,
its answers are sized for the observation cap: `list_apis` pages one line per API and filters by a query;
`show_api_doc` gives one API's full documentation, shortened (and saying so) only when it is very large."""

from __future__ import annotations

from typing import Any

from agentloop.apps.api_doc import fitted_api_doc
from agentloop.apps.base import Api, ApiError, AppSpec, CallContext, page_params, paginate, string

LIST_APIS_PAGE_LIMIT = 10  # default lines per page: about 500 tokens however long an app's names and summaries

app = AppSpec(
    name="api_docs",
    description="Documentation of every app: list apps, list an app's APIs, show one API's parameters.",
    login=False,
)


@app.api("List the apps you can use in this task.", returns="[{name, description}]")
def list_apps(ctx: CallContext) -> list[dict[str, str]]:
    return [{"name": n, "description": ctx.world.apps[n].description} for n in ctx.world.available]


@app.api(
    "List the APIs of one app, a page at a time, one line each (name: summary). With `query`, only the APIs "
    "whose name, summary or description contains every word of it.",
    params={
        "app_name": string("Name of the app, as listed by list_apps."),
        "query": string(
            "Words that must all appear in the API's name, summary or description (any case).", maxLength=200
        ),
        **page_params(LIST_APIS_PAGE_LIMIT),
    },
    required=["app_name"],
    returns="{app, query?, page: which APIs these are of how many, apis: ['name: summary'], next: how to go on}",
)
def list_apis(
    ctx: CallContext, app_name: str, page_index: int, page_limit: int, query: str | None = None
) -> dict[str, Any]:
    spec = _app(ctx, app_name)
    apis = [a for a in spec.apis.values() if not a.hidden]
    words = (query or "").lower().split()
    matching = [a for a in apis if all(w in _searchable(a) for w in words)]
    start = page_index * page_limit
    shown = paginate(matching, page_index, page_limit)
    end = start + len(shown)
    result: dict[str, Any] = {"app": app_name}
    if words:
        result["query"] = query
        of = f"of the {len(matching)} matching the query ({len(apis)} in all)"
    else:
        of = f"of {len(apis)}"
    if shown:
        result["page"] = f"APIs {start + 1}-{end} {of}"
    elif words and not matching:
        result["page"] = (
            f"No API of {app_name} matches {query!r}; try other words, or no query to list all {len(apis)}."
        )
    elif not matching:
        result["page"] = f"{app_name} has no APIs."
    else:
        last = (len(matching) - 1) // page_limit
        result["page"] = (
            f"No APIs on page {page_index}: there are {len(matching)}, on pages 0-{last} at this page_limit."
        )
    result["apis"] = [f"{a.name}: {a.summary_line}" for a in shown]
    if end < len(matching):
        same_query = " and the same query" if words else ""
        result["next"] = (
            f"For APIs {end + 1}-{min(end + page_limit, len(matching))}, call list_apis again with "
            f"page_index={page_index + 1}{same_query}."
        )
    else:
        result["next"] = "None: no more APIs. show_api_doc(app_name, api_name) shows an API's parameters."
    return result


@app.api(
    "Show the full documentation of one API: what it does, every parameter (nested objects and arrays written "
    "like {name: type, optional?: type}) and what it returns.",
    params={
        "app_name": string("Name of the app."),
        "api_name": string("Name of the API, as listed by list_apis."),
    },
    required=["app_name", "api_name"],
    returns="{app, api, shortened?: what was cut to fit, description, parameters: [{name, type, required, "
    "description, default?, enum?, schema?: nested parts}], returns}",
)
def show_api_doc(ctx: CallContext, app_name: str, api_name: str) -> dict[str, Any]:
    return fitted_api_doc(ctx.world.api_of(app_name, api_name))


def _searchable(api: Api) -> str:
    return f"{api.name} {api.summary} {api.description}".lower()


def _app(ctx: CallContext, app_name: str) -> Any:
    if app_name not in ctx.world.available:
        raise ApiError(
            404,
            f"There is no app named {app_name!r} here. Available: {', '.join(ctx.world.available)}.",
            kind="unknown_app",
        )
    return ctx.world.apps[app_name]
