"""bench calibration-match's pieces that need no quantization: the split, the held-out file, the suite."""

from quantkit.bench.calibration_match import split_traffic, write_records, write_suite
from quantkit.data.readers import read_records
from quantkit.eval.suite import load_suite


def test_split_is_disjoint_seeded_and_halves():
    records = read_records("code_python_en:eval")
    seen, held = split_traffic(records, seed=0)
    assert len(seen) == len(records) // 2 and len(seen) + len(held) == len(records)
    assert not {r.where for r in seen} & {r.where for r in held}
    assert split_traffic(records, seed=0) == (seen, held) and split_traffic(records, seed=1) != (seen, held)


def test_held_out_file_reads_back_and_the_suite_loads(tmp_path):
    records = read_records("coqa_chat_en:eval")[:3] + read_records("wiki_rag_en:eval")[:3]
    write_records(records, tmp_path / "held.jsonl")
    back = read_records(str(tmp_path / "held.jsonl"))
    assert [(r.shape, r.messages, r.prompt, r.completion, r.task) for r in back] == \
           [(r.shape, r.messages, r.prompt, r.completion, r.task) for r in records]
    write_suite(tmp_path / "held.jsonl", 6, 256, tmp_path / "suite.yaml")
    suite, _ = load_suite(str(tmp_path / "suite.yaml"))
    assert suite.token_metrics.datasets == [str(tmp_path / "held.jsonl")] and suite.tasks == {"arc_easy": 120}
