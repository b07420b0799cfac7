"""Tenants learn apart: each tenant's adapters are its own (listed, activated, served), the shared adapter and
every run are the operator's, and a matrix of admin and app routes x roles over REST and gRPC."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import grpc
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.api.auth import create_key
from agentloop.learner.adapters import directory_sha256
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.settings import get_settings
from agentloop.store import adapters as adapter_store
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import Adapter, App, Tenant, TrainingRun
from tests.factories import bearer, make_keys
from tests.grpc.conftest import ServerThread, auth

ROLES = ("operator", "tenant_a_admin", "tenant_b_admin", "tenant_a_client")


def tenant_id(name: str) -> str:
    with session_scope() as s:
        return s.scalar(sa.select(Tenant.id).where(Tenant.name == name))


def add_adapter(root, version: int, status: str, tenant: str | None) -> str:
    """A version owned by `tenant` (None: the shared one), with real files and checksum."""
    path = root / f"v{version}"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 4, "version": version}))
    name = f"{get_settings().model_name}@v{version}"
    with session_scope() as s:
        s.add(
            Adapter(
                name=name,
                base_model=get_settings().model_name,
                version=version,
                tenant_id=tenant_id(tenant) if tenant else None,
                path=str(path),
                sha256=directory_sha256(path),
                status=status,
                metrics={},
            )
        )
    return name


def add_run(tenant: str | None) -> str:
    with session_scope() as s:
        run = TrainingRun(
            algo="loop", status="queued", trigger="test", config={}, tenant_id=tenant_id(tenant) if tenant else None
        )
        s.add(run)
        s.flush()
        return run.id


def serving(tenant: str) -> str | None:
    with session_scope() as s:
        row = adapter_store.serving_adapter(s, get_settings().model_name, tenant_id(tenant))
        return row.name if row else None


@dataclass
class World:
    keys: dict[str, str]
    a: str  # tenant-a's adapter (active)
    b: str  # tenant-b's (candidate)
    shared: str  # the deployment's (active)
    shared_next: str  # the deployment's (candidate)
    runs: dict[str, str]  # whose -> a queued run's id


@pytest.fixture
def world(sqlite_db, tmp_path) -> World:
    with get_sessionmaker()() as s:
        keys = make_keys(s)
        create_key(s, "tenant-c", "admin")  # a tenant with no adapter of its own
        s.commit()
    a = add_adapter(tmp_path, 1, "active", "tenant-a")
    b = add_adapter(tmp_path, 2, "candidate", "tenant-b")
    shared = add_adapter(tmp_path, 3, "active", None)
    shared_next = add_adapter(tmp_path, 4, "candidate", None)
    runs = {who: add_run(None if who == "shared" else who) for who in ("tenant-a", "tenant-b", "shared")}
    return World(vars(keys), a, b, shared, shared_next, runs)


def test_each_tenant_is_served_its_own_adapter_else_the_shared_one_else_the_base_model(world):
    client = TestClient(create_app())
    a_admin, b_admin = bearer(world.keys["tenant_a_admin"]), bearer(world.keys["tenant_b_admin"])
    assert (serving("tenant-a"), serving("tenant-b"), serving("tenant-c")) == (world.a, world.shared, world.shared)

    assert [x["name"] for x in client.get("/v1/admin/adapters", headers=a_admin).json()] == [world.a]
    assert [x["name"] for x in client.get("/v1/admin/adapters", headers=b_admin).json()] == [world.b]
    every = client.get("/v1/admin/adapters", headers=bearer(world.keys["operator"])).json()
    assert {(x["name"], x["shared"]) for x in every} == {
        (world.a, False),
        (world.b, False),
        (world.shared, True),
        (world.shared_next, True),
    }

    resp = client.post(f"/v1/admin/adapters/{world.b}/activate", headers=b_admin)
    assert resp.status_code == 200 and resp.json()["status"] == "active" and not resp.json()["shared"]
    # one owner's activation leaves the others' active versions alone
    assert (serving("tenant-a"), serving("tenant-b"), serving("tenant-c")) == (world.a, world.b, world.shared)
    assert client.get("/v1/admin/tenant", headers=b_admin).json() == {
        "name": "tenant-b",
        "share_training": False,
        "serving": world.b,
    }

    resp = client.post("/v1/admin/adapters/base/activate", headers=a_admin)
    assert resp.status_code == 200 and resp.json() == {
        "name": "base",
        "base_model": get_settings().model_name,
        "status": "active",
    }
    assert serving("tenant-a") is None  # the base model: not the shared adapter either
    assert client.get("/v1/admin/tenant", headers=a_admin).json()["serving"] == "base"
    assert client.post(f"/v1/admin/adapters/{world.a}/activate", headers=a_admin).status_code == 200
    assert serving("tenant-a") == world.a  # activating a version again ends the choice of the base model

    # the operator's "base" is the deployment's: tenants without a version of their own get the base model
    assert client.post("/v1/admin/adapters/base/activate", headers=bearer(world.keys["operator"])).status_code == 200
    assert (serving("tenant-a"), serving("tenant-b"), serving("tenant-c")) == (world.a, world.b, None)
    with session_scope() as s:
        assert {r.name: r.status for r in s.scalars(sa.select(Adapter))} == {
            world.a: "active",
            world.b: "active",
            world.shared: "retired",
            world.shared_next: "candidate",
        }


def test_share_training_is_the_tenants_own_setting_and_off_until_turned_on(world):
    client = TestClient(create_app())
    a_admin = bearer(world.keys["tenant_a_admin"])
    assert client.get("/v1/admin/tenant", headers=a_admin).json()["share_training"] is False
    resp = client.patch("/v1/admin/tenant", json={"share_training": True}, headers=a_admin)
    assert resp.status_code == 200 and resp.json()["share_training"] is True
    b_admin = bearer(world.keys["tenant_b_admin"])
    assert client.get("/v1/admin/tenant", headers=b_admin).json()["share_training"] is False
    assert client.patch("/v1/admin/tenant", json={"share_training": "yes"}, headers=a_admin).status_code == 422
    assert client.patch("/v1/admin/tenant", json={"other": 1}, headers=a_admin).status_code == 422
    a_client = bearer(world.keys["tenant_a_client"])
    assert client.patch("/v1/admin/tenant", json={"share_training": False}, headers=a_client).status_code == 403
    with session_scope() as s:
        assert dict(s.execute(sa.select(Tenant.name, Tenant.share_training)).all()) == {
            "tenant-a": True,
            "tenant-b": False,
            "tenant-c": False,
        }


# --- the matrix: REST ----------------------------------------------------------------------------


def by_role(codes: str) -> dict[str, int]:
    """Expected statuses in ROLES order: operator, tenant A admin, tenant B admin, tenant A client."""
    return dict(zip(ROLES, map(int, codes.split()), strict=True))


def rest_checks(w: World) -> list[tuple[str, str, dict | None, dict[str, int]]]:
    """(method, path, body, expected status per role). 404: another owner's object; 403: the role."""
    a_run, b_run, shared_run = w.runs["tenant-a"], w.runs["tenant-b"], w.runs["shared"]
    shared_train = {"shared": True, "config": {"world": "nowhere"}}  # past the role check: 422, nothing queued
    return [
        ("GET", "/v1/admin/training-runs", None, by_role("200 200 200 403")),
        ("GET", f"/v1/admin/training-runs/{a_run}", None, by_role("200 200 404 403")),
        ("GET", f"/v1/admin/training-runs/{b_run}", None, by_role("200 404 200 403")),
        ("GET", f"/v1/admin/training-runs/{shared_run}", None, by_role("200 404 404 403")),
        ("GET", "/v1/admin/adapters", None, by_role("200 200 200 403")),
        ("GET", "/v1/admin/tenant", None, by_role("200 200 200 403")),
        ("GET", "/metrics", None, by_role("200 403 403 403")),
        ("POST", "/v1/admin/train", shared_train, by_role("422 403 403 403")),
        ("GET", "/v1/apps/crm/apis", None, by_role("200 200 404 200")),
        ("DELETE", "/v1/apps/nothing-here", None, by_role("404 404 404 404")),
    ]


def changing_checks(w: World) -> list[tuple[str, str, dict[str, int]]]:
    """Routes that change something: (method, path, expected per role), each role on a fresh copy of the
    objects; a refused call must leave them as they were."""
    return [
        ("POST", f"/v1/admin/training-runs/{w.runs['tenant-a']}/cancel", by_role("200 200 404 403")),
        ("POST", f"/v1/admin/training-runs/{w.runs['shared']}/cancel", by_role("200 404 404 403")),
        ("POST", f"/v1/admin/adapters/{w.b}/activate", by_role("200 404 200 403")),
        ("POST", f"/v1/admin/adapters/{w.shared_next}/activate", by_role("200 404 404 403")),
        ("DELETE", "/v1/apps/crm", by_role("204 204 404 204")),
    ]


def add_app(tenant: str) -> None:
    doc = {
        "openapi": "3.0.3",
        "info": {"title": "crm", "version": "1"},
        "paths": {"/ping": {"get": {"operationId": "ping", "responses": {"200": {"description": "pong"}}}}},
    }
    with session_scope() as s:
        s.add(App(tenant_id=tenant_id(tenant), name="crm", spec=doc, base_url="https://crm.example.com"))


def state() -> dict[str, object]:
    with session_scope() as s:
        return {
            "runs": sorted(s.execute(sa.select(TrainingRun.id, TrainingRun.status, TrainingRun.cancel_requested))),
            "adapters": sorted(s.execute(sa.select(Adapter.name, Adapter.status)).all()),
            "apps": sorted(s.execute(sa.select(App.tenant_id, App.name)).all()),
        }


def test_rest_admin_and_app_routes_by_role_and_tenant(world):
    client = TestClient(create_app())
    add_app("tenant-a")
    before = state()
    for method, path, body, expected in rest_checks(world):
        for role in ROLES:
            resp = client.request(method, path, json=body, headers=bearer(world.keys[role]))
            assert resp.status_code == expected[role], (role, method, path, resp.text)
    assert state() == before  # nothing above changes anything

    visible = {
        role: {r["id"] for r in client.get("/v1/admin/training-runs", headers=bearer(world.keys[role])).json()}
        for role in ROLES[:3]
    }
    assert visible == {
        "operator": set(world.runs.values()),
        "tenant_a_admin": {world.runs["tenant-a"]},
        "tenant_b_admin": {world.runs["tenant-b"]},
    }


@pytest.mark.parametrize("role", ROLES)
def test_rest_routes_that_change_things_change_only_what_the_role_and_tenant_may(world, role):
    client = TestClient(create_app())
    add_app("tenant-a")
    for method, path, expected in changing_checks(world):
        before = state()
        resp = client.request(method, path, headers=bearer(world.keys[role]))
        assert resp.status_code == expected[role], (role, method, path, resp.text)
        if resp.status_code >= 400:
            assert state() == before, (role, method, path)
        else:
            assert state() != before, (role, method, path)


# --- the matrix: gRPC ----------------------------------------------------------------------------


def grpc_checks(w: World) -> list[tuple[str, object, dict[str, str]]]:
    """(method, request, expected status per role, in ROLES order: OK, NF not found, PD permission denied,
    IA invalid argument)."""
    short = {"OK": "OK", "NF": "NOT_FOUND", "PD": "PERMISSION_DENIED", "IA": "INVALID_ARGUMENT"}

    def codes(names: str) -> dict[str, str]:
        return dict(zip(ROLES, (short[n] for n in names.split()), strict=True))

    a_run, b_run, shared_run = w.runs["tenant-a"], w.runs["tenant-b"], w.runs["shared"]
    shared_train = pb.TrainRequest(shared=True)
    shared_train.config.update({"world": "nowhere"})  # past the role check: INVALID_ARGUMENT, nothing queued
    return [
        ("GetTrainingRun", pb.GetTrainingRunRequest(run_id=a_run), codes("OK OK NF PD")),
        ("GetTrainingRun", pb.GetTrainingRunRequest(run_id=b_run), codes("OK NF OK PD")),
        ("GetTrainingRun", pb.GetTrainingRunRequest(run_id=shared_run), codes("OK NF NF PD")),
        ("ListAdapters", pb.ListAdaptersRequest(), codes("OK OK OK PD")),
        ("GetTenant", pb.GetTenantRequest(), codes("OK OK OK PD")),
        ("Train", shared_train, codes("IA PD PD PD")),
        ("ActivateAdapter", pb.ActivateAdapterRequest(name=w.b), codes("OK NF OK PD")),
        ("ActivateAdapter", pb.ActivateAdapterRequest(name=w.shared_next), codes("OK NF NF PD")),
        ("CancelTrainingRun", pb.CancelTrainingRunRequest(run_id=b_run), codes("OK NF OK PD")),
    ]


@pytest.mark.parametrize("role", ROLES)
def test_grpc_admin_service_by_role_and_tenant(world, role):
    """Each role on its own server and data; a refused call changes nothing."""
    server = ServerThread()

    async def call(method: str, request: object) -> grpc.StatusCode:
        async with server.connect() as c:
            try:
                await getattr(c.admin, method)(request, metadata=auth(world.keys[role]))
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

    try:
        for method, request, expected in grpc_checks(world):
            before = state()
            got = asyncio.run(call(method, request)).name
            assert got == expected[role], (role, method, request, got)
            if got != "OK":
                assert state() == before, (role, method, request)
    finally:
        server.close()
