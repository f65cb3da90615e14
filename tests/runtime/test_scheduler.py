from quantkit.runtime.block_manager import BlockManager
from quantkit.runtime.sampling_params import SamplingParams
from quantkit.runtime.scheduler import Scheduler
from quantkit.runtime.sequence import Sequence, SequenceStatus


def make(num_blocks=64, block_size=4, max_num_seqs=8, budget=16, prefix=True):
    return Scheduler(BlockManager(num_blocks, block_size, prefix), max_num_seqs, budget)


def add(sched, rid, n, start=0):
    s = Sequence(rid, list(range(start, start + n)), SamplingParams())
    sched.add(s)
    return s


def run_step(sched, token=7):
    """Schedule, pretend the forward ran, append a token to every sequence that completed."""
    scheduled = sched.schedule()
    sched.update(scheduled)
    for s, _ in scheduled:
        if s.num_computed_tokens == s.num_tokens:
            s.append_token(token)
    return [(s.request_id, n) for s, n in scheduled]


def test_one_budget_chunks_prefill_and_serves_running_first():
    sched = make(budget=16)
    a, b, c = (add(sched, rid, 10, start=100 * i) for i, rid in enumerate("abc"))
    assert run_step(sched) == [("a", 10), ("b", 6)]  # b's prefill is chunked, c waits
    assert b.num_computed_tokens == 6 and b.num_output_tokens == 0
    assert run_step(sched) == [("a", 1), ("b", 4), ("c", 10)]  # decode, rest of b, then c
    assert run_step(sched) == [("a", 1), ("b", 1), ("c", 1)]
    assert all(s.status is SequenceStatus.RUNNING for s in (a, b, c))


def test_max_num_seqs_caps_the_running_set():
    sched = make(max_num_seqs=2, budget=100)
    for i in range(3):
        add(sched, str(i), 3, start=10 * i)
    assert [rid for rid, _ in run_step(sched)] == ["0", "1"]
    assert len(sched.waiting) == 1


def test_recompute_preemption_when_blocks_run_out():
    # 4 usable blocks of 4 tokens; two 7-token prompts take 2 blocks each, the first decode needs a third.
    sched = make(num_blocks=5, block_size=4, budget=64)
    a, b = add(sched, "a", 7), add(sched, "b", 7, start=50)
    assert run_step(sched) == [("a", 7), ("b", 7)]
    assert run_step(sched) == [("a", 1), ("b", 1)]  # position 7 still fits in block 2
    # a's 9th token needs a new block: none free, so b (admitted last) is preempted by recompute.
    assert run_step(sched) == [("a", 1)]
    assert b.status is SequenceStatus.WAITING and sched.waiting[0] is b
    assert b.num_computed_tokens == 0 and b.block_table == [] and b.num_preemptions == 1
    assert sched.num_preemptions == 1 and b.num_tokens == 9  # its 2 generated tokens are kept, to be recomputed
    sched.finish(a, "stop")
    # Re-prefill of prompt + outputs; its first full block is still cached, so 4 of 9 tokens are hits.
    assert run_step(sched) == [("b", 5)]
    assert b.num_output_tokens == 3 and b.num_cached_prompt_tokens == 0  # metrics keep the first admission


def test_a_lone_sequence_preempts_itself_rather_than_crashing():
    sched = make(num_blocks=3, block_size=4, budget=64)  # 8 tokens of KV
    a = add(sched, "a", 7)
    run_step(sched)
    run_step(sched)  # a now has 9 tokens, 8 computed
    assert run_step(sched) == []  # the 9th token has no block: a is preempted, nothing runs
    assert a.status is SequenceStatus.WAITING and a.num_preemptions == 1


def test_waiting_admission_uses_prefix_hits_and_stops_on_preemption():
    sched = make(block_size=4, budget=64)
    a = add(sched, "a", 12)
    run_step(sched)
    b = add(sched, "b", 14)  # range(14) shares its first 12 tokens (3 full blocks) with a
    assert run_step(sched) == [("a", 1), ("b", 14 - 12)]
    assert b.num_cached_prompt_tokens == 12 and b.block_table[:3] == a.block_table[:3]
    assert sched.block_manager.prefix_hits == 12 and sched.block_manager.prefix_queries == 26


def test_finish_frees_blocks_from_either_queue():
    sched = make(num_blocks=8, block_size=4)
    a, b = add(sched, "a", 5), add(sched, "b", 5, start=9)
    sched.max_num_batched_tokens = 5
    run_step(sched)
    sched.finish(b, "abort")
    sched.finish(a, "abort")
    assert not sched.has_unfinished() and sched.block_manager.num_free_blocks == 7
    assert a.finish_reason == "abort" and a.is_finished
