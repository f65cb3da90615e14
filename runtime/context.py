"""ForwardContext: the batch layout one forward needs, built by the model runner, read by attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardContext:
    positions: torch.Tensor  # [T] position of each scheduled token
    slot_mapping: torch.Tensor  # [T] cache slot each token's K/V is written to
    query_index: torch.Tensor  # [T] flat index of each token in the padded [B * max_query_len] layout
    key_slots: torch.Tensor  # [B, max_context_len] slots to read; padding points into the null block
    attn_mask: torch.Tensor  # [B, 1, group * max_query_len, max_context_len] bool, True attends
    batch_size: int
    max_query_len: int
