from quantkit.runtime.block_manager import NULL_BLOCK, BlockManager
from quantkit.runtime.sampling_params import SamplingParams
from quantkit.runtime.sequence import Sequence


def seq(tokens, rid="r"):
    return Sequence(rid, list(tokens), SamplingParams())


def computed(bm, s, num_tokens, hits=()):
    """Allocate for num_tokens and mark them computed, as a step would."""
    assert bm.allocate(s, num_tokens, list(hits))
    s.num_computed_tokens = num_tokens
    bm.cache_full_blocks(s)


def test_null_block_is_never_handed_out_and_ref_counts_balance():
    bm = BlockManager(num_blocks=5, block_size=4)
    a = seq(range(16))
    assert bm.num_free_blocks == 4 and bm.allocate(a, 16)
    assert NULL_BLOCK not in a.block_table and sorted(a.block_table) == [1, 2, 3, 4]
    assert all(bm.blocks[b].ref_count == 1 for b in a.block_table) and bm.usage == 1.0
    assert not bm.allocate(seq(range(3), "b"), 3)  # nothing left
    bm.free_blocks(a)
    assert bm.num_free_blocks == 4 and a.block_table == [] and bm.blocks[NULL_BLOCK].ref_count == 1


def test_prefix_hit_shares_blocks_and_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = seq(range(8))
    computed(bm, a, 8)
    b = seq(list(range(8)) + [99, 98])
    hits = bm.match_prefix(b)
    assert hits == a.block_table  # both full blocks of a
    computed(bm, b, 10, hits)
    assert b.block_table[:2] == a.block_table and all(bm.blocks[x].ref_count == 2 for x in hits)
    # A prompt that is exactly a's two blocks may reuse only the first: its last token must be computed.
    assert bm.match_prefix(seq(range(8), "c")) == a.block_table[:1]
    # A different first block breaks the chain even when the second block's tokens match.
    assert bm.match_prefix(seq([7, 1, 2, 3, 4, 5, 6, 7, 0], "d")) == []


def test_hit_is_verified_against_the_block_tokens():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = seq(range(8))
    computed(bm, a, 8)
    impostor = seq([9, 9, 9, 9, 1], "x")
    from quantkit.runtime.block_manager import block_hash

    bm.cached[block_hash(None, (9, 9, 9, 9))] = a.block_table[0]  # force a hash collision
    assert bm.match_prefix(impostor) == []


def test_freed_cached_blocks_are_reused_lru_and_revived_by_hits():
    bm = BlockManager(num_blocks=5, block_size=2)
    a = seq(range(6))
    computed(bm, a, 6)  # blocks 1, 2, 3 all full and cached
    first, second, third = a.block_table
    bm.free_blocks(a)
    assert bm.num_free_blocks == 4 and len(bm.cached) == 3
    # A hit revives a's blocks out of the free list.
    b = seq(list(range(6)) + [50], "b")
    hits = bm.match_prefix(b)
    assert hits == [first, second, third]
    computed(bm, b, 7, hits)
    assert bm.num_free_blocks == 0 and all(bm.blocks[x].ref_count == 1 for x in hits)
    bm.free_blocks(b)
    # New allocations take the unhashed block first, then evict from the tail of b's prefix.
    c = seq([70, 71, 72, 73, 74, 75], "c")
    assert bm.allocate(c, 6)
    assert c.block_table[0] not in hits and c.block_table[1:] == [third, second]
    assert bm.match_prefix(seq(list(range(6)) + [1], "d")) == [first]  # the head of the prefix survived


def test_duplicate_full_blocks_stay_private():
    bm = BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    a, b = seq([1, 2, 3]), seq([1, 2, 4], "b")
    computed(bm, a, 3)
    computed(bm, b, 3)  # computed without a hit (e.g. both admitted in one step)
    assert bm.cached[a.block_hashes[0]] == a.block_table[0]
    assert bm.blocks[b.block_table[0]].hash is None
    bm.free_blocks(b)
    assert bm.cached[a.block_hashes[0]] == a.block_table[0]


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=False)
    a = seq(range(5))
    computed(bm, a, 5)
    assert bm.match_prefix(seq(range(5), "b")) == [] and not bm.cached
