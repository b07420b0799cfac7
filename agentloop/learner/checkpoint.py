"""A run's checkpoint: written whole or not at all, so that a learner lost at any point resumes from the
last finished iteration."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentloop import faults
from agentloop.learner.config import LoopConfig


def write_atomically(target: Path, write: Callable[[Path], None]) -> None:
    """`write` fills a fresh directory, which then replaces `target` in one rename."""
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write(tmp)
    faults.crash_point("checkpoint_save")
    old = target.with_name(target.name + ".old")
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    if old.exists():
        shutil.rmtree(old)


@dataclass
class Checkpoint:
    """Self-describing: the adapter weights, the optimizer, the next iteration, the config, the RNG, and
    whatever the algorithm keeps between iterations (`extra`)."""

    path: Path

    @property
    def exists(self) -> bool:
        return (self.path / "state.json").exists()

    @property
    def adapter_path(self) -> Path:
        return self.path / "adapter"

    @property
    def optimizer_path(self) -> Path:
        return self.path / "optimizer.pt"

    def save(
        self,
        model: Any,
        optimizer: torch.optim.Optimizer,
        next_iteration: int,
        config: LoopConfig,
        rng: random.Random,
        extra: dict[str, Any],
        files: dict[str, Any] | None = None,
    ) -> None:
        """`files`: more torch state (e.g. a discriminator) saved beside the optimizer as <name>.pt."""

        def write(tmp: Path) -> None:
            model.save_pretrained(tmp / "adapter")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            for name, value in (files or {}).items():
                torch.save(value, tmp / f"{name}.pt")
            state = {"next_iteration": next_iteration, "config": config.to_dict(), "rng": rng.getstate(), **extra}
            (tmp / "state.json").write_text(json.dumps(state, default=list))

        write_atomically(self.path, write)

    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.path / "state.json").read_text()))

    def load_file(self, name: str) -> Any | None:
        path = self.path / f"{name}.pt"
        return torch.load(path, weights_only=False) if path.exists() else None


def rng_state(value: Any) -> Any:
    """JSON turned the RNG state's tuples into lists; random.setstate wants them back."""
    version, internal, gauss = value
    return (version, tuple(internal), gauss)
