"""Demonstration data functions against SQLite and PostgreSQL: what the learner reads, tenant scoping, and a
demonstration of the schema before 0006 kept through the migration."""

import sqlalchemy as sa

from agentloop.api.auth import get_or_create_tenant
from agentloop.store import demonstrations as demo_store
from agentloop.store.db import normalise_url, session_scope
from agentloop.store.migrate import upgrade

STEP = {"app": "supervisor", "api": "complete_task", "args": {}, "observation": "Task marked as complete."}


def add(tenant: str | None, world: str = "builtin", task_ref: str | None = "t-1") -> str:
    with session_scope() as s:
        tenant_id = get_or_create_tenant(s, tenant).id if tenant else None
        row = demo_store.create_demonstration(
            s,
            tenant_id,
            world=world,
            task_ref=task_ref,
            instruction="Do it.",
            apps=["notes"],
            steps=[STEP],
            replayed=True,
        )
        return row.id


def test_for_training_reads_the_named_tenants_and_the_deployments_demonstrations_of_a_world_oldest_first(db_url):
    a1, b1, a2, deployment = add("a"), add("b"), add("a"), add(None)
    add("a", world="toy")
    with session_scope() as s:
        tenant_a, tenant_b = get_or_create_tenant(s, "a").id, get_or_create_tenant(s, "b").id
        assert [d.id for d in demo_store.for_training(s, [tenant_a], "builtin")] == [a1, a2, deployment]
        assert [d.id for d in demo_store.for_training(s, [tenant_a, tenant_b], "builtin")] == [a1, b1, a2, deployment]
        assert [d.id for d in demo_store.for_training(s, [], "builtin")] == [deployment]
        assert demo_store.for_training(s, [tenant_a], "mars") == []
        row = demo_store.for_training(s, [tenant_a], "builtin")[0]
        assert (row.steps, row.replayed, row.meta, row.seed) == ([STEP], True, {}, 0)


def test_get_and_delete_are_tenant_scoped(db_url):
    demo_id = add("a")
    with session_scope() as s:
        tenant_a, tenant_b = get_or_create_tenant(s, "a").id, get_or_create_tenant(s, "b").id
        assert demo_store.get_demonstration(s, demo_id, tenant_b) is None
        assert demo_store.delete_demonstration(s, demo_id, tenant_b) is False
        assert demo_store.get_demonstration(s, demo_id, tenant_a) is not None
        assert demo_store.delete_demonstration(s, demo_id, tenant_a) is True
        assert demo_store.get_demonstration(s, demo_id, tenant_a) is None


def test_a_demonstration_stored_before_0006_keeps_its_actions_as_steps(db_url):
    """db_url is at head: go back to 0005, store a row of that schema, upgrade again."""
    from alembic import command

    from agentloop.store.migrate import alembic_config

    command.downgrade(alembic_config(db_url), "0005")
    engine = sa.create_engine(normalise_url(db_url))
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO demonstrations"
                " (id, world, task_ref, instruction, apps, actions, answer, source, created_at) VALUES"
                " ('d1', 'builtin', 't-1', 'Do it.', '[\"notes\"]', :actions, NULL, 'upload', :created)"
            ),
            {"actions": '[{"app": "notes", "api": "list_notes", "args": {}}]', "created": "2026-01-01 00:00:00+00:00"},
        )
    engine.dispose()
    upgrade(db_url)
    with session_scope() as s:
        (row,) = demo_store.for_training(s, [], "builtin")
        assert row.steps == [{"app": "notes", "api": "list_notes", "args": {}}]
        assert (row.replayed, row.meta, row.seed, row.tenant_id) == (False, {}, 0, None)
