"""What a tenant is served and what it falls back to (store/adapters.py), on SQLite and PostgreSQL."""

from datetime import timedelta

from agentloop.api.auth import get_or_create_tenant
from agentloop.store import adapters as adapter_store
from agentloop.store.db import session_scope
from agentloop.store.models import Adapter, Tenant, utcnow

BASE = "m"


def add(version: int, status: str, tenant: str | None, activated_minutes_ago: int | None) -> str:
    when = None if activated_minutes_ago is None else utcnow() - timedelta(minutes=activated_minutes_ago)
    with session_scope() as s:
        s.add(
            Adapter(
                name=f"{BASE}@v{version}",
                base_model=BASE,
                version=version,
                tenant_id=tenant,
                path=f"/adapters/v{version}",
                sha256="0" * 64,
                status=status,
                metrics={},
                activated_at=when,
            )
        )
    return f"{BASE}@v{version}"


def chain(tenant: str | None) -> list[str]:
    with session_scope() as s:
        return [a.name for a in adapter_store.serving_chain(s, BASE, tenant)]


def served(tenant: str | None) -> str | None:
    with session_scope() as s:
        row = adapter_store.serving_adapter(s, BASE, tenant)
        return row.name if row else None


def test_the_served_version_heads_the_chain_of_fallbacks(db_url):
    with session_scope() as s:
        a, b, c = (get_or_create_tenant(s, name).id for name in ("a", "b", "c"))
    shared_old = add(1, "retired", None, 50)
    shared = add(2, "active", None, 40)
    a_old = add(3, "retired", a, 30)
    a_older = add(4, "retired", a, 35)
    a_now = add(5, "active", a, 10)
    add(6, "candidate", a, None)  # never activated: never a fallback
    add(7, "rejected", b, None)
    b_now = add(8, "active", b, None)  # active with no activation time (written by hand): still served first

    assert chain(a) == [a_now, a_old, a_older, shared, shared_old]
    assert chain(b) == [b_now, shared, shared_old]
    assert chain(c) == [shared, shared_old]  # nothing of its own: the deployment's
    assert chain(None) == [shared, shared_old]
    assert [served(t) for t in (a, b, c, None)] == [a_now, b_now, shared, shared]

    with session_scope() as s:  # c chose the base model: no shared adapter either
        s.get(Tenant, c).serve_base = True
    assert chain(c) == [] and served(c) is None
