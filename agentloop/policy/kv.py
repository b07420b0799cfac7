"""A decode cache that grows in place.

transformers' DynamicLayer appends a step's keys/values with `torch.cat`, which copies the whole cache at
every decoded token: for 16 rows of 3k tokens that is ~75 MB per layer and ~2 GB per step over 30 layers,
more memory traffic than the step's weights. `with_room` gives each layer a buffer with room for the tokens
still to come; a step writes its slot and the layer's keys/values are a view of the filled part. Imported
where transformers already is (the decode loop), so importing the policy package stays light.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys/values live in a preallocated buffer (batch, heads, capacity, head_dim)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        super().__init__()
        self.device = keys.device
        self.length = keys.shape[-2]
        self._keys = self._buffer(keys, self.length + max(room, 1))
        self._values = self._buffer(values, self.length + max(room, 1))
        self._expose()
        self.is_initialized = True

    @classmethod
    def wrap(cls, keys: torch.Tensor, values: torch.Tensor, length: int) -> GrowingLayer:
        """A layer over buffers already filled up to `length` (no copy): the rest is its room."""
        layer = cls.__new__(cls)
        DynamicLayer.__init__(layer)
        layer.device = keys.device
        layer.length = length
        layer._keys, layer._values = keys, values
        layer._expose()
        layer.is_initialized = True
        return layer

    @staticmethod
    def _buffer(filled: torch.Tensor, capacity: int) -> torch.Tensor:
        B, H, n, D = filled.shape
        out = filled.new_empty((B, H, capacity, D))
        out[:, :, :n] = filled
        return out

    def _expose(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        if self.length + n > self._keys.shape[-2]:  # more than the room asked for: grow, doubling
            capacity = max(2 * self._keys.shape[-2], self.length + n)
            self._keys = self._buffer(self._keys[:, :, : self.length], capacity)
            self._values = self._buffer(self._values[:, :, : self.length], capacity)
        self._keys[:, :, self.length : self.length + n] = key_states
        self._values[:, :, self.length : self.length + n] = value_states
        self.length += n
        self._expose()
        return self._keys[:, :, : self.length], self._values[:, :, : self.length]


def with_room(cache: Any, room: int) -> Any:
    """`cache` (a DynamicCache) with each layer moved into a GrowingLayer with room for `room` more tokens."""
    for i, layer in enumerate(cache.layers):  # one layer at a time: the old one is freed as its copy is made
        cache.layers[i] = GrowingLayer(layer.keys, layer.values, room)
    return cache
