"""The api_docs app: how the agent discovers the APIs of the apps it may use."""

from __future__ import annotations

from typing import Any

from agentloop.apps.base import ApiError, AppSpec, CallContext, string

app = AppSpec(
    name="api_docs",
    description="Documentation of every app: list apps, list an app's APIs, show one API's parameters.",
    login=False,
)


@app.api("List the apps you can use in this task.", returns="[{name, description}]")
def list_apps(ctx: CallContext) -> list[dict[str, str]]:
    return [{"name": n, "description": ctx.world.apps[n].description} for n in ctx.world.available]


@app.api(
    "List the APIs of one app.",
    params={"app_name": string("Name of the app, as listed by list_apps.")},
    required=["app_name"],
    returns="[{name, description}]",
)
def list_apis(ctx: CallContext, app_name: str) -> list[dict[str, str]]:
    spec = _app(ctx, app_name)
    return [{"name": a.name, "description": a.description} for a in spec.apis.values() if not a.hidden]


@app.api(
    "Show the full documentation of one API: its parameters, types and what it returns.",
    params={
        "app_name": string("Name of the app."),
        "api_name": string("Name of the API, as listed by list_apis."),
    },
    required=["app_name", "api_name"],
    returns="{app, api, description, parameters: [{name, type, required, description}], returns}",
)
def show_api_doc(ctx: CallContext, app_name: str, api_name: str) -> dict[str, Any]:
    return ctx.world.api_of(app_name, api_name).doc()


def _app(ctx: CallContext, app_name: str) -> Any:
    if app_name not in ctx.world.available:
        raise ApiError(404, f"There is no app named {app_name!r} here. Available: {', '.join(ctx.world.available)}.")
    return ctx.world.apps[app_name]
