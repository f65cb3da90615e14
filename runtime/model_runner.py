"""ModelRunner: the only place where batch tensors are built. Loads the model, owns the paged KV cache,
turns a scheduled batch into a ForwardContext, runs the forward, samples, and scores prompt tokens."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from quantkit.errors import QuantkitError
from quantkit.memory import available_memory
from quantkit.models import stored_dtype
from quantkit.runtime.block_manager import NULL_BLOCK
from quantkit.runtime.config import EngineConfig
from quantkit.runtime.context import ForwardContext
from quantkit.runtime.layers import sampler
from quantkit.runtime.layers.logprobs import token_logprobs
from quantkit.runtime.logprobs import TokenLogprob
from quantkit.runtime.models.loader import load_model
from quantkit.runtime.sequence import Sequence

log = logging.getLogger("quantkit.runtime")
CPU_DEFAULT_KV_GB = 4.0  # the CPU budget when none is given: RAM is shared with everything else
GIB = 1 << 30
# Prompt positions scored per lm_head product: the [rows, vocab] float32 logits and log-softmax of one slice
# stay ~100 MB each at SmolLM2's 49,152 tokens, however many positions a step scores.
SCORED_ROWS_PER_SLICE = 512


@dataclass(frozen=True)
class KVCapacity:
    dtype: str
    bytes_per_token: int
    num_blocks: int  # usable blocks (the null block excluded)
    block_size: int
    max_model_len: int

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        return self.num_tokens / self.max_model_len

    def describe(self, num_layers: int, num_kv_heads: int, head_dim: int, elem_bytes: int) -> str:
        return (f"KV cache {self.dtype}: {self.bytes_per_token:,} bytes/token (2 x {num_layers} layers x "
                f"{num_kv_heads} KV heads x {head_dim} x {elem_bytes} B), {self.num_blocks:,} blocks x "
                f"{self.block_size} = {self.num_tokens:,} tokens "
                f"({self.num_tokens * self.bytes_per_token / (1 << 20):,.1f} MiB); "
                f"max concurrency at max_model_len {self.max_model_len}: {self.max_concurrency:.2f}x")


@dataclass(frozen=True)
class StepOutput:
    """What one forward gives each scheduled sequence, in batch order."""
    tokens: list[int | None]  # the sampled token of each sequence whose tokens are all computed, else None
    logprobs: list[TokenLogprob | None]  # the sampled token's record, where its request asked for logprobs
    prompt_logprobs: list[list[TokenLogprob]]  # the prompt positions this step scored (empty: none)


class ModelRunner:
    def __init__(self, config: EngineConfig, path: Path):
        self.config = config
        self.device = _device(config.device)
        self.dtype = _dtype(config.dtype, self.device, path)
        self.model, kv_scales = load_model(path, self.dtype, self.device, config.kernels)
        cfg = self.model.config
        self.max_model_len = config.max_model_len or cfg.max_position_embeddings
        if self.max_model_len > cfg.max_position_embeddings:
            raise QuantkitError(f"max_model_len {self.max_model_len} exceeds the model's "
                                f"max_position_embeddings {cfg.max_position_embeddings}")
        if cfg.window is not None and self.max_model_len > cfg.window:
            raise QuantkitError(f"{path} attends over a sliding window of {cfg.window} tokens, which the runtime does "
                                f"not bound attention to yet: max_model_len {self.max_model_len} would go past it",
                                hint=f"pass max_model_len <= {cfg.window}, or serve the model with vLLM")
        self.block_size = config.block_size
        fp8 = config.kv_cache_dtype == "fp8"
        elem_bytes = 1 if fp8 else self.dtype.itemsize
        bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem_bytes
        num_blocks = self._num_blocks(bytes_per_token)
        self.capacity = KVCapacity("fp8_e4m3" if fp8 else str(self.dtype).removeprefix("torch."),
                                   bytes_per_token, num_blocks - 1, self.block_size, self.max_model_len)
        self.num_blocks = num_blocks
        self._allocate_cache(num_blocks, fp8, kv_scales)
        self.model.use_native_ops(config.kernels != "reference")
        if self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16) and config.kernels == "auto":
            # Build (or load) the native CPU kernels now, not inside the first request's steps.
            from quantkit.runtime.kernels import cpu_attention, cpu_fused

            cpu_attention.available()
            cpu_fused.available()
        log.info(self.capacity.describe(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, elem_bytes))

    def _num_blocks(self, bytes_per_token: int) -> int:
        cfg = self.config
        per_seq = -(-self.max_model_len // self.block_size)
        if cfg.num_kv_blocks is not None:
            blocks = cfg.num_kv_blocks
        else:
            budget = cfg.kv_cache_memory_gb * GIB if cfg.kv_cache_memory_gb else self._default_budget()
            # More than every sequence at full length can never be used.
            blocks = min(int(budget // (bytes_per_token * self.block_size)), cfg.max_num_seqs * per_seq + 1)
        if blocks - 1 < per_seq:
            raise QuantkitError(
                f"the KV cache holds {(blocks - 1) * self.block_size} tokens ({blocks - 1} blocks), fewer than "
                f"one sequence of max_model_len {self.max_model_len}",
                hint="lower max_model_len or raise kv_cache_memory_gb / memory_utilization")
        return blocks

    def _default_budget(self) -> float:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return free * self.config.memory_utilization
        return min(CPU_DEFAULT_KV_GB * GIB, _available_ram() * self.config.memory_utilization)

    def _allocate_cache(self, num_blocks: int, fp8: bool, kv_scales: dict[int, tuple[float, float]]) -> None:
        cfg = self.model.config
        layers = self.model.attention_layers()
        if fp8 and len(kv_scales) != len(layers):
            warnings.warn("kv_cache_dtype='fp8' but the checkpoint has no KV-cache scales for every layer: each "
                          "layer takes its scales from its first batch (2 x max |K| or |V| / 448); calibrated "
                          "scales (a recipe with kv_cache_scheme) are steadier", stacklevel=3)
            kv_scales = {}
        shape = (2, len(layers), num_blocks * self.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = _zeros(shape, torch.uint8 if fp8 else self.dtype, self.device)
        for i, attn in enumerate(layers):
            attn.k_cache, attn.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]
            attn.kernels = self.config.kernels
            if fp8:
                attn.k_scale, attn.v_scale = kv_scales.get(i, (None, None))  # None: set by the first batch

    def prepare(self, scheduled: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, ForwardContext, list[int]]:
        """Flattened input ids, the forward context, and the row of each sequence's last token."""
        bs, group = self.block_size, self.model.config.num_heads // self.model.config.num_kv_heads
        max_q = max(n for _, n in scheduled)
        max_blocks = max(len(seq.block_table) for seq, _ in scheduled)
        ids, positions, query_index, slots, last_rows = [], [], [], [], []
        tables = torch.full((len(scheduled), max_blocks), NULL_BLOCK, dtype=torch.long)
        query_pos = torch.zeros(len(scheduled), max_q, dtype=torch.long)
        for b, (seq, n) in enumerate(scheduled):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            query_index.extend(range(b * max_q, b * max_q + n))
            slots.extend(seq.block_table[p // bs] * bs + p % bs for p in range(start, end))
            last_rows.append(len(ids) - 1)
            tables[b, :len(seq.block_table)] = torch.tensor(seq.block_table, dtype=torch.long)
            query_pos[b, :n] = torch.arange(start, end)
        # Keys past a query's position (its future, other sequences' padding) are masked; padded queries
        # see key 0 only, so no row is empty.
        mask = torch.arange(max_blocks * bs)[None, None, :] <= query_pos[:, :, None]
        mask = mask.repeat(1, group, 1).unsqueeze(1)
        dev = self.device
        ctx = ForwardContext(positions=torch.tensor(positions, device=dev), slot_mapping=torch.tensor(slots, device=dev),
                             query_index=torch.tensor(query_index, device=dev), block_tables=tables.to(dev),
                             attn_mask=mask.to(dev), batch_size=len(scheduled), max_query_len=max_q, block_size=bs)
        return torch.tensor(ids, dtype=torch.long, device=dev), ctx, last_rows

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]]) -> StepOutput:
        """One forward over the batch; see StepOutput."""
        input_ids, ctx, last_rows = self.prepare(scheduled)
        hidden = self.model(input_ids, ctx)
        logits = self.model.compute_logits(hidden[last_rows]).float()
        tokens = self.sample(scheduled, logits)
        return StepOutput(tokens, self._sampled_logprobs(scheduled, logits, tokens),
                          self._prompt_logprobs(scheduled, hidden))

    def sample(self, scheduled: list[tuple[Sequence, int]], logits: torch.Tensor) -> list[int | None]:
        """From float32 logits at the last scheduled token of every sequence, [B, vocab]: a token for each
        sequence whose tokens are now all computed, None for the others (mid-prefill chunks)."""
        done = [i for i, (seq, n) in enumerate(scheduled) if seq.num_computed_tokens + n == seq.num_tokens]
        out: list[int | None] = [None] * len(scheduled)
        if done:
            seqs = [scheduled[i][0] for i in done]
            tokens = sampler.sample(logits[done], [s.params for s in seqs], [self._generator(s) for s in seqs])
            for i, token in zip(done, tokens):
                out[i] = token
        return out

    def _sampled_logprobs(self, scheduled: list[tuple[Sequence, int]], logits: torch.Tensor,
                          tokens: list[int | None]) -> list[TokenLogprob | None]:
        rows = [i for i, (token, (seq, _)) in enumerate(zip(tokens, scheduled))
                if token is not None and seq.params.logprobs is not None]
        out: list[TokenLogprob | None] = [None] * len(scheduled)
        if rows:
            records = self._token_logprobs(logits[rows], [tokens[i] for i in rows],
                                           [scheduled[i][0].params.logprobs for i in rows])
            for i, record in zip(rows, records):
                out[i] = record
        return out

    def _prompt_logprobs(self, scheduled: list[tuple[Sequence, int]],
                         hidden: torch.Tensor) -> list[list[TokenLogprob]]:
        """Only the rows that score a prompt token pay for the lm_head and the log-softmax over the vocabulary."""
        rows, targets, owners = scored_positions(scheduled)
        out: list[list[TokenLogprob]] = [[] for _ in scheduled]
        for lo in range(0, len(rows), SCORED_ROWS_PER_SLICE):
            part = slice(lo, lo + SCORED_ROWS_PER_SLICE)
            logits = self.model.compute_logits(hidden[rows[part]]).float()
            records = self._token_logprobs(logits, targets[part],
                                           [scheduled[b][0].params.prompt_logprobs for b in owners[part]])
            for b, record in zip(owners[part], records):
                out[b].append(record)
        return out

    def _token_logprobs(self, logits: torch.Tensor, targets: list[int], num_top: list[int]) -> list[TokenLogprob]:
        """One record per row of logits [R, vocab]: its target's log-probability, its argmax and its num_top[r]
        most likely tokens."""
        chosen, argmax, top_ids, top_logprobs = token_logprobs(
            logits, torch.tensor(targets, device=self.device), max(num_top))
        return [TokenLogprob(token, logprob, best, tuple(zip(ids[:k], logprobs[:k])))
                for token, k, logprob, best, ids, logprobs in zip(targets, num_top, chosen.tolist(), argmax.tolist(),
                                                                  top_ids.tolist(), top_logprobs.tolist())]

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        if seq.params.seed is None or seq.params.greedy:
            return None
        if seq.generator is None:
            seq.generator = torch.Generator(device=self.device).manual_seed(seq.params.seed)
        return seq.generator


def scored_positions(scheduled: list[tuple[Sequence, int]]) -> tuple[list[int], list[int], list[int]]:
    """The rows of the flattened batch whose logits score a prompt token (the row of position p - 1 scores the
    token at p), the tokens they score, and the batch index of each. Integers only."""
    rows: list[int] = []
    targets: list[int] = []
    owners: list[int] = []
    offset = 0
    for b, (seq, n) in enumerate(scheduled):
        first, start = seq.next_scored_position, seq.num_computed_tokens
        if first is not None:
            # Sequence.num_cacheable_tokens keeps position first - 1 out of prefix-cache hits: it is computed in
            # this step or a later one, never skipped.
            assert first - 1 >= start, f"request {seq.request_id}: position {first - 1} was skipped"
            end = min(start + n + 1, seq.num_prompt_tokens)
            if end > first:
                rows.extend(range(offset + first - 1 - start, offset + end - 1 - start))
                targets.extend(seq.token_ids[first:end])
                owners.extend([b] * (end - first))
        offset += n
    return rows, targets, owners


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed cache. On CPU through calloc (numpy), so pages are only backed once blocks are written:
    a 4 GiB budget does not cost 4 GiB of RAM up front. Zeros matter: masked slots are still read."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import math

    import numpy as np

    raw = torch.from_numpy(np.zeros(math.prod(shape) * dtype.itemsize, dtype=np.uint8))
    return raw.view(dtype).view(shape)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise QuantkitError("device='cuda' but no CUDA device is available", hint="use device='cpu' or 'auto'")
    return torch.device(name)


def _dtype(name: str, device: torch.device, path: Path) -> torch.dtype:
    if name != "auto":
        return getattr(torch, name)
    # CPU matmuls in fp16 are slow and lossy; the stored dtype is right on a GPU.
    return stored_dtype(path) if device.type == "cuda" else torch.float32


def _available_ram() -> float:
    return available_memory() or 8 * GIB