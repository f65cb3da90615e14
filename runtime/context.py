"""ForwardContext: the batch layout one forward needs, built by the model runner, read by attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardContext:
    positions: torch.Tensor  # [T] position of each scheduled token
    slot_mapping: torch.Tensor  # [T] cache slot each token's K/V is written to
    query_index: torch.Tensor  # [T] flat index of each token in the padded [B * max_query_len] layout
    block_tables: torch.Tensor  # [B, max_blocks] block ids, padded with the null block
    attn_mask: torch.Tensor  # [B, 1, group * max_query_len, max_blocks * block_size] bool, True attends
    batch_size: int
    max_query_len: int
    block_size: int
    # [B] tokens each sequence attends to after this step (computed + scheduled); None: the decode kernel
    # takes positions + 1, which is the same for one query per sequence.
    context_lens: torch.Tensor | None = None
