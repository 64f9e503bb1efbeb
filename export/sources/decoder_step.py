"""The decoder graph's one step, written once for every translation source: its 9 inputs, the
positions and self-attention mask, the loop over the layers and the graph's outputs.

Our model (export/sources/ours/source.py) and Marian (export/sources/marian/source.py) subclass
``DecoderStep`` with their own layers: the embedding, a layer's step over a growing cache, the
projections around the slot layout's attention operators and the output projection. What follows
is written once for both, so the two sources' graphs agree on I/O, shapes, dtypes and masks
(export/graphs/translation_layout.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from export.sources.cached_attention import (
    cache_lengths,
    folded_cross_attention,
    fused_qkv,
    slot_self_attention,
)

KeyValue = tuple[Tensor, Tensor]
Memory = tuple[Tensor, Tensor, Tensor]  # one layer's memory keys, values and the (·, 1, 1, S) mask
QKV = tuple[nn.Linear, nn.Linear, nn.Linear]  # a self-attention's query, key and value projections


def stack_kv(kv: Sequence[KeyValue]) -> KeyValue:
    """Per-layer (k, v) pairs of (B, h, T, d) → keys, values (n_layers, B, h, T, d)."""
    return torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv])


def step_outputs(logits: Tensor, presents: Sequence[KeyValue], cross_weights: Tensor) -> tuple[Tensor, ...]:
    """The decoder graph's outputs from one step's (B, V) logits, per-layer caches and (B, h, 1, S)
    last-layer cross-attention; log-softmax and alignments in float32 whatever the model dtype,
    so an fp16 graph keeps full-precision scores."""
    present_keys, present_values = stack_kv(presents)
    log_probs = logits.float().log_softmax(dim=-1)
    return log_probs, present_keys, present_values, cross_weights.float().mean(dim=1)[:, 0]


def step_positions(past_keys: Tensor, positions: Tensor, table: Tensor) -> tuple[Tensor, Tensor]:
    """One step's positional encodings (rows of ``table``) and self-attention mask over a growing
    cache: row b's cached keys are the last ``positions[b]`` of the past_len columns, so of the
    past_len + 1 keys (past and the new one) it sees columns ≥ past_len − positions[b]:
    encodings (B, 1, d), mask (B, 1, 1, past_len + 1)."""
    past_len = past_keys.shape[3]
    columns = torch.arange(past_len + 1, device=positions.device)
    return table[positions][:, None, :], (columns[None, :] >= (past_len - positions)[:, None])[
        :, None, None, :
    ]


class DecoderStep(nn.Module, ABC):
    """One cached decoder step with the I/O of either decoder layout.

    Built without ``projections`` (layout per_layer_kv_positions) each layer steps over a growing
    cache (``layer_step``), masked by ``step_positions``, its past and memory first gathered by
    row. With them (per_layer_kv_slots) self-attention runs on the slot cache, in place, and
    cross-attention on each sentence's memory with its beams folded together
    (export/sources/cached_attention.py).
    """

    def __init__(self, n_layers: int, n_heads: int, projections: Sequence[QKV] | None) -> None:
        """projections: each layer's self-attention Q, K, V, fused for the slot layout; None for
        the positions layout."""
        super().__init__()
        self.n_layers, self.n_heads = n_layers, n_heads
        self.qkv = None if projections is None else nn.ModuleList(fused_qkv(*p) for p in projections)

    def forward(
        self,
        input_ids: Tensor,
        source_mask: Tensor,
        memory_keys: Tensor,
        memory_values: Tensor,
        past_keys: Tensor,
        past_values: Tensor,
        positions: Tensor,
        first_rows: Tensor,
        second_rows: Tensor,
    ) -> tuple[Tensor, ...]:
        """One step of every row. The memory is held per sentence in both layouts; the last two
        inputs say which rows read what: per_layer_kv_positions' ``beam_rows`` (B,), the past
        row each row continues, and ``memory_rows`` (B,), its sentence; per_layer_kv_slots'
        ``sentence_rows`` (sentences, W) and ``beam_index`` (B,), the fold of the beams onto
        their sentence (export/graphs/translation_layout.py)."""
        if self.qkv is None:
            return self._positions_step(
                input_ids,
                (source_mask, memory_keys, memory_values),
                (past_keys, past_values),
                positions,
                (first_rows, second_rows),
            )
        cross_mask = (source_mask != 0)[:, None, None, :]  # (sentences, 1, 1, S)
        # row b's token sits at positions[b]; no mask (the operator masks)
        lengths, fold = cache_lengths(positions), (first_rows, second_rows)
        x = self.embed(input_ids, self.position_table()[positions][:, None, :])
        presents: list[KeyValue] = []
        cross_weights = memory_keys.new_zeros(0)
        for i in range(self.n_layers):
            memory, cache = (memory_keys[i], memory_values[i], cross_mask), (past_keys[i], past_values[i])
            x, kv, cross_weights = self._slot_layer_step(i, x, cache, lengths, memory, fold)
            presents.append(kv)
        return step_outputs(self.logits(x[:, 0]), presents, cross_weights)

    def _positions_step(
        self,
        input_ids: Tensor,
        memory: tuple[Tensor, Tensor, Tensor],
        past: KeyValue,
        positions: Tensor,
        rows: tuple[Tensor, Tensor],
    ) -> tuple[Tensor, ...]:
        """Each layer over a growing cache (``layer_step``), masked by ``step_positions``: the
        layer's past taken at ``beam_rows`` and the memory at ``memory_rows`` first, in the graph,
        so that a beam's reorder costs no run of its own."""
        source_mask, memory_keys, memory_values = memory
        past_keys, past_values = past
        beam_rows, memory_rows = rows
        cross_mask = (source_mask[memory_rows] != 0)[:, None, None, :]  # (B, 1, 1, S)
        pe, self_mask = step_positions(past_keys, positions, self.position_table())
        x = self.embed(input_ids, pe)
        presents: list[KeyValue] = []
        cross_weights = memory_keys.new_zeros(0)
        for i in range(self.n_layers):
            cache = past_keys[i][beam_rows], past_values[i][beam_rows]
            layer_memory = memory_keys[i][memory_rows], memory_values[i][memory_rows], cross_mask
            x, kv, cross_weights = self.layer_step(i, x, cache, self_mask, layer_memory)
            presents.append(kv)
        return step_outputs(self.logits(x[:, 0]), presents, cross_weights)

    def _slot_layer_step(
        self,
        i: int,
        x: Tensor,
        cache: KeyValue,
        lengths: tuple[Tensor, Tensor],
        memory: Memory,
        fold: tuple[Tensor, Tensor],
    ) -> tuple[Tensor, KeyValue, Tensor]:
        """Layer ``i``: self-attention over the slot cache (written in place), cross-attention
        with the beams folded onto their sentence's memory, then the rest of the layer."""
        assert self.qkv is not None
        heads, kv = slot_self_attention(
            self.self_attention_input(i, x), self.qkv[i], cache, lengths, self.n_heads
        )
        x = self.after_self_attention(i, x, heads)
        q, shape, scale = self.cross_query(i, x)
        heads, cross_weights = folded_cross_attention(q, memory, fold, shape, scale)
        return self.after_cross_attention(i, x, heads), kv, cross_weights

    @abstractmethod
    def position_table(self) -> Tensor:
        """The (max_len, d_model) positional encodings."""

    @abstractmethod
    def embed(self, input_ids: Tensor, pe: Tensor) -> Tensor:
        """(B, 1) ids and their positional encodings → the first layer's input (B, 1, d_model)."""

    @abstractmethod
    def layer_step(
        self, i: int, x: Tensor, past: KeyValue, self_mask: Tensor, memory: Memory
    ) -> tuple[Tensor, KeyValue, Tensor]:
        """Layer ``i`` over a growing cache → its output, the cache one column longer and the
        cross-attention weights (B, h, 1, S)."""

    def self_attention_input(self, i: int, x: Tensor) -> Tensor:
        """What layer ``i``'s self-attention projects: its input (post-LN layers), or a norm of it
        (pre-LN layers, as M2M-100's)."""
        return x

    @abstractmethod
    def after_self_attention(self, i: int, x: Tensor, heads: Tensor) -> Tensor:
        """Layer ``i``'s input and its self-attention's concatenated heads → the cross-attention's input."""

    @abstractmethod
    def cross_query(self, i: int, x: Tensor) -> tuple[Tensor, tuple[int, int], float]:
        """Layer ``i``'s projected cross-attention queries (B, 1, h·d), (h, d) and the scale."""

    @abstractmethod
    def after_cross_attention(self, i: int, x: Tensor, heads: Tensor) -> Tensor:
        """Layer ``i``'s cross-attention input and concatenated heads → the layer's output."""

    @abstractmethod
    def logits(self, x: Tensor) -> Tensor:
        """The last layer's (B, d_model) → (B, V) logits."""
