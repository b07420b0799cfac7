"""One forward whose rows run on different LoRA adapters, with two matrix products per layer whatever the
number of adapters.

PEFT's own mixed batch (`adapter_names=`) runs, in every LoRA layer, a gather, two products and a scatter
per adapter present: hundreds of small operations per decode step, which cost more than the step itself on
a small model. Here each layer's adapters are stacked once per batch, A as (Σr, in) and B·scaling as
(out, Σr); a row's mask keeps only its own adapter's slice of the rank dimension, so

    delta = ((x @ A_all.T) * mask_row) @ B_all.T

is exactly the row's own LoRA term (zero for rows on the base model). The LoRA layers themselves run with
adapters disabled (their base weights only) and a forward hook adds the delta.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

MAX_ROUTES = 256  # row-to-adapter layouts whose masks are kept


def supported(model: Any, names: Sequence[str]) -> bool:
    """Plain LoRA on Linear layers, unmerged, no dropout at inference: what the stacked form computes."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if not isinstance(module, LoraLayer):
            continue
        if not isinstance(module, LoraLinear) or module.merged:
            return False
        for name in names:
            if name in module.lora_A and (module.use_dora.get(name) or name in getattr(module, "lora_variant", {})):
                return False
    return True


class MixedLora:
    """Context manager: while open, forwards of `model` run row b on the adapter `route` named for it (None:
    the base model); `route` is called before each forward with the names of that forward's rows."""

    def __init__(self, model: Any, names: Sequence[str | None]) -> None:
        from peft.tuners.lora import LoraLayer

        self.model = model
        present = [n for n in dict.fromkeys(names) if n is not None]
        self.layers: list[tuple[Any, torch.Tensor, torch.Tensor, list[str]]] = []
        for module in model.modules():
            if not isinstance(module, LoraLayer) or not any(n in module.lora_A for n in present):
                continue
            a_parts: list[torch.Tensor] = []
            b_parts: list[torch.Tensor] = []
            owner: list[str] = []
            for n in present:
                if n in module.lora_A:
                    a = cast(torch.Tensor, module.lora_A[n].weight)  # (r, in)
                    a_parts.append(a)
                    b_parts.append(module.lora_B[n].weight * module.scaling[n])  # (out, r)
                    owner += [n] * a.shape[0]
            self.layers.append((module, torch.cat(a_parts), torch.cat(b_parts, dim=1), owner))
        self._masks: dict[tuple[str | None, ...], list[torch.Tensor]] = {}
        self._current: list[torch.Tensor] = []
        self._handles: list[Any] = []
        self._disabled: Any = None

    def route(self, names: Sequence[str | None]) -> None:
        key = tuple(names)
        if key not in self._masks:
            if len(self._masks) >= MAX_ROUTES:  # a continuous batch's row sets keep changing: keep the table small
                self._masks.clear()
            self._masks[key] = [
                torch.tensor([[float(o == n) for o in owner] for n in key], dtype=a_all.dtype, device=a_all.device)
                for _, a_all, _, owner in self.layers
            ]
        self._current = self._masks[key]

    def __enter__(self) -> MixedLora:
        self._disabled = self.model.disable_adapter()
        self._disabled.__enter__()
        for i, (module, a_all, b_all, _) in enumerate(self.layers):
            self._handles.append(module.register_forward_hook(self._hook(i, a_all, b_all)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._disabled.__exit__(*exc)

    def _hook(self, layer: int, a_all: torch.Tensor, b_all: torch.Tensor) -> Any:
        def add_delta(_module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
            x = args[0]
            mask = self._current[layer]  # (rows, Σr)
            low = (x.to(a_all.dtype) @ a_all.T) * mask.view(mask.shape[0], *([1] * (x.dim() - 2)), -1)
            return output + (low @ b_all.T).to(output.dtype)

        return add_delta
