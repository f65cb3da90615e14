"""Paged KV blocks: pre-allocated, reference counted, full blocks hash-chained for prefix caching.

Block 0 is the null block: never handed out, it pads block tables. Free blocks sit in one LRU list:
a freed block that holds a cached (hashed) full block goes to the tail, a freed unhashed one to the
head, allocation takes the head. A cached block keeps its hash while free and can be revived by a
prefix hit; its hash is dropped only when the block is reallocated. Block tables are append-only.
"""

from __future__ import annotations

from collections import OrderedDict

from quantkit.runtime.sequence import Sequence

NULL_BLOCK = 0


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "parent_hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.parent_hash: int | None = None
        self.token_ids: tuple[int, ...] = ()

    def reset(self) -> None:
        self.hash, self.parent_hash, self.token_ids = None, None, ()


def block_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((-1 if parent_hash is None else parent_hash, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.blocks[NULL_BLOCK].ref_count = 1  # pinned forever
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.prefix_queries = 0  # tokens of admitted sequences looked up (vLLM counts tokens)
        self.prefix_hits = 0  # of those, tokens found in the cache

    @property
    def num_usable_blocks(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_usable_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks that equal seq's leading full blocks, within its cacheable tokens (at least the last
        token, and any position whose prompt log-probability is pending, stays to compute)."""
        if not self.enable_prefix_caching:
            return []
        hits, parent = [], None
        for index in range(seq.num_cacheable_tokens // self.block_size):
            tokens = tuple(seq.block_tokens(index, self.block_size))
            h = block_hash(parent, tokens)
            block_id = self.cached.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != tokens or block.parent_hash != parent:  # a hash collision, not a hit
                break
            hits.append(block_id)
            parent = h
        return hits

    def allocate(self, seq: Sequence, num_tokens: int, hits: list[int] = ()) -> bool:
        """Grow seq's table (starting with `hits` when empty) to hold num_tokens; False if blocks run out."""
        fresh = self.blocks_for(num_tokens) - len(seq.block_table) - len(hits)
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        if fresh + revived > len(self.free):
            return False
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(block.hash)
        for _ in range(max(fresh, 0)):
            seq.block_table.append(self._take_free())
        return True

    def _take_free(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.cached.get(block.hash) == block_id:
            del self.cached[block.hash]
        block.reset()
        block.ref_count = 1
        return block_id

    def free_blocks(self, seq: Sequence) -> None:
        """Release seq's blocks, last first, so a prompt's tail is evicted before its head."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
                if block.hash is None:
                    self.free.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.block_hashes = []

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Hash the blocks that became full (all their K/V computed) and publish them for prefix hits."""
        if not self.enable_prefix_caching:
            return
        for index in range(len(seq.block_hashes), seq.num_computed_tokens // self.block_size):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            tokens = tuple(seq.block_tokens(index, self.block_size))
            h = block_hash(parent, tokens)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[index]]
            if h not in self.cached and block.hash is None:  # duplicates of a cached block stay private
                block.hash, block.parent_hash, block.token_ids = h, parent, tokens
                self.cached[h] = block.block_id
