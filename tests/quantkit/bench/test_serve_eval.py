"""bench serve-eval plumbing on the tiny model: lm-eval's local-completions talks to the server and its items
are scored like the in-process run's (a random model scores 0 on both; this guards the path, the SmolLM2
numbers are in docs/serving.md)."""

from __future__ import annotations

import pytest

from quantkit.errors import QuantkitError
from tests.conftest import build_tiny_model


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-long"), max_positions=1024)


def test_local_completions_against_the_server(long_tiny):
    from quantkit.bench.serve_eval import run

    result = run(str(long_tiny), "meeting_owner_gen", limit=3, num_concurrent=2, max_model_len=1024)
    assert result.items == 3 and result.metric == "exact_match"
    assert result.items_that_agree == 3 and result.server_accuracy == result.in_process_accuracy


def test_multiple_choice_through_the_server_scores_as_in_process(long_tiny):
    from quantkit.bench.serve_eval import run

    result = run(str(long_tiny), "support_intent_mc", limit=3, num_concurrent=2, max_model_len=1024)
    assert result.items == 3 and result.metric == "acc"
    assert result.items_that_agree == 3 and result.server_accuracy == result.in_process_accuracy


def test_unknown_task_is_refused():
    from quantkit.bench.serve_eval import run

    with pytest.raises(QuantkitError, match="neither a benchmark nor shipped"):
        run("smollm2-135m", "no_such_task", limit=1)
