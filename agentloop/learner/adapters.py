"""Versioned LoRA adapters: `<base>@v<N>` directories written atomically (temp dir, fsync, sha256,
rename), a row per version (candidate -> active | rejected; active -> retired), the promotion gate and
admin activation (rollback). A version belongs to the tenant whose run trained it, or to the deployment
(the shared adapter); activation replaces only its owner's active version. Activation is announced;
serving policies load the new version for episodes that start after it."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agentloop import events, faults
from agentloop.store.adapters import owned_by
from agentloop.store.models import Adapter, Tenant, utcnow


def adapter_name(base_model: str, version: int) -> str:
    return f"{base_model}@v{version}"


def _safe(base_model: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", base_model.strip("/")) or "model"


def directory_sha256(path: Path) -> str:
    """Hash of every file's relative name and bytes, in name order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def next_version(session: Session, base_model: str) -> int:
    current = session.scalar(sa.select(sa.func.max(Adapter.version)).where(Adapter.base_model == base_model))
    return int(current or 0) + 1


def save_adapter(
    session: Session,
    model: Any,
    adapters_dir: Path,
    base_model: str,
    *,
    parent: str | None,
    training_run_id: str | None,
    metrics: dict[str, Any] | None = None,
    tenant_id: str | None = None,
) -> Adapter:
    """Write the model's LoRA weights as the next version and add its `candidate` row (not committed), owned
    by `tenant_id` (None: the deployment's). A crash before the rename leaves only a `.tmp-*` directory,
    which is never loaded, and no row."""
    root = adapters_dir / _safe(base_model)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a crashed save
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        model.save_pretrained(tmp)
        faults.crash_point("adapter_save")
        _fsync_tree(tmp)
        digest = directory_sha256(tmp)
        for _ in range(5):  # another learner may take the same version number: retry with the next
            version = next_version(session, base_model)
            final = root / f"v{version}"
            if final.exists():  # a directory without a row: a save that crashed after its rename
                shutil.rmtree(final)
            try:
                with session.begin_nested():
                    row = Adapter(
                        name=adapter_name(base_model, version),
                        base_model=base_model,
                        tenant_id=tenant_id,
                        version=version,
                        parent=parent,
                        training_run_id=training_run_id,
                        path=str(final),
                        sha256=digest,
                        status="candidate",
                        metrics=metrics or {},
                    )
                    session.add(row)
                    session.flush()
            except IntegrityError:
                continue
            os.replace(tmp, final)
            _fsync_dir(root)
            return row
        raise RuntimeError(f"could not allocate an adapter version for {base_model}")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def verify(row: Adapter) -> None:
    """Refuse to serve an adapter whose files are missing or changed since they were written."""
    verify_files(row.name, row.path, row.sha256)


def verify_files(name: str, path_text: str, sha256: str) -> None:
    """FileNotFoundError when the adapter's files are missing, ValueError when they changed."""
    path = Path(path_text)
    if not (path / "adapter_config.json").exists():
        raise FileNotFoundError(f"adapter {name}: {path} is missing")
    if directory_sha256(path) != sha256:
        raise ValueError(f"adapter {name}: files at {path} do not match their sha256")


def activate(session: Session, row: Adapter) -> None:
    """Make `row` its owner's active version of its base model (the owner's previous one retires; a tenant
    that had chosen the base model is served this again). Not committed; call `announce` after the commit."""
    verify(row)
    row.damage, row.damaged_at = None, None
    _retire_active(session, row.base_model, row.tenant_id, keep=row.id)
    if row.tenant_id is not None:
        session.execute(sa.update(Tenant).where(Tenant.id == row.tenant_id).values(serve_base=False))
    row.status = "active"
    row.activated_at = utcnow()


def activate_base(session: Session, base_model: str, tenant_id: str | None) -> None:
    """The owner's episodes run on the base model: its active version retires, and a tenant no longer falls
    back to the shared adapter either (until it activates a version again). Not committed."""
    _retire_active(session, base_model, tenant_id)
    if tenant_id is not None:
        session.execute(sa.update(Tenant).where(Tenant.id == tenant_id).values(serve_base=True))


def _retire_active(session: Session, base_model: str, tenant_id: str | None, keep: int | None = None) -> None:
    where = [Adapter.base_model == base_model, Adapter.status == "active", owned_by(tenant_id)]
    if keep is not None:
        where.append(Adapter.id != keep)
    session.execute(
        sa.update(Adapter).where(*where).values(status="retired").execution_options(synchronize_session=False)
    )


def announce(row: Adapter | None, base_model: str | None = None, tenant_id: str | None = None) -> None:
    """Tell serving processes that an owner's active version changed (`row` None: to the base model)."""
    events.publish(
        events.ADAPTERS_CHANNEL,
        {
            "type": "activated",
            "adapter": row.name if row else None,
            "base_model": row.base_model if row else base_model,
            "tenant_id": row.tenant_id if row else tenant_id,
        },
    )


def gate(candidate_tgc: float, active_tgc: float, tolerance: float) -> bool:
    """The promotion rule: the candidate's dev TGC is at least the active one's minus the tolerance."""
    return candidate_tgc >= active_tgc - tolerance


def promote_or_reject(
    session: Session, candidate: Adapter, dev_tgc: float, baseline_tgc: float, tolerance: float
) -> bool:
    """Apply the gate; the candidate becomes active (returns True) or rejected. Not committed."""
    candidate.metrics = {**(candidate.metrics or {}), "dev_tgc": dev_tgc, "baseline_dev_tgc": baseline_tgc}
    if gate(dev_tgc, baseline_tgc, tolerance):
        activate(session, candidate)
        return True
    candidate.status = "rejected"
    return False
