"""The glue every translation source's decoder-step wrapper shares: the graph's outputs from one
step and the positions of rows that joined a running batch later.

Our model (export/sources/ours/source.py) and Marian (export/sources/marian/source.py) wrap their own
layers into the decoder I/O of export/graphs/translation_layout.py; what follows is written once
for both, so the two sources' graphs agree on shapes, dtypes and masks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def stack_kv(kv: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Per-layer (k, v) pairs of (B, h, T, d) → keys, values (n_layers, B, h, T, d)."""
    return torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv])


def step_outputs(
    logits: Tensor, presents: Sequence[tuple[Tensor, Tensor]], cross_weights: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The decoder graph's outputs from one step's (B, V) logits, per-layer caches and (B, h, 1, S)
    last-layer cross-attention; log-softmax and alignments in float32 whatever the model dtype,
    so an fp16 graph keeps full-precision scores."""
    present_keys, present_values = stack_kv(presents)
    log_probs = logits.float().log_softmax(dim=-1)
    return log_probs, present_keys, present_values, cross_weights.float().mean(dim=1)[:, 0]


def step_positions(
    past_keys: Tensor, positions: Tensor | None, table: Tensor
) -> tuple[Tensor, Tensor | None]:
    """One decoder step's positional encodings (rows of ``table``) and self-attention mask.

    Without ``positions`` every row has decoded past_len tokens: one position for all (1, d),
    no mask (the single new query may see every cached key). With ``positions`` (B,), row b's
    cached keys are the last ``positions[b]`` of the past_len columns, so of the past_len + 1
    keys (past and the new one) it sees columns ≥ past_len − positions[b]: encodings (B, 1, d),
    mask (B, 1, 1, past_len + 1).
    """
    past_len = past_keys.shape[3]
    if positions is None:
        return table[past_len], None
    columns = torch.arange(past_len + 1, device=positions.device)
    return table[positions][:, None, :], (columns[None, :] >= (past_len - positions)[:, None])[
        :, None, None, :
    ]
