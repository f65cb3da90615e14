"""RuntimeLM (lm-eval over quantkit.runtime) against HFLM on the real SmolLM2, float32: the same choice on
every item of arc_easy and piqa, loglikelihoods within float rounding."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e
ITEMS = 20


def recorded(lm) -> dict:
    """Every loglikelihood answer lm gives, by its (context, continuation)."""
    answers, original = {}, lm.loglikelihood

    def loglikelihood(requests, disable_tqdm=False):
        out = original(requests, disable_tqdm=True)
        answers.update({r.args: a for r, a in zip(requests, out)})
        return out

    lm.loglikelihood = loglikelihood
    return answers


def test_runtime_lm_scores_like_hflm(smollm2):
    import torch

    from quantkit.eval.lm_tasks import TaskRunner, benchmark_task, go_offline

    go_offline()
    from lm_eval.models.huggingface import HFLM

    from quantkit.eval.runtime_lm import RuntimeLM
    from quantkit.models import load_model, load_tokenizer

    runtime = RuntimeLM(smollm2)
    hf = HFLM(pretrained=load_model(smollm2, torch.float32), tokenizer=load_tokenizer(smollm2), batch_size=8)
    ours, theirs = recorded(runtime), recorded(hf)
    runner = TaskRunner([benchmark_task("arc_easy"), benchmark_task("piqa")])
    try:
        served, reference = runner.run_lm(runtime, limit=ITEMS), runner.run_lm(hf, limit=ITEMS)
    finally:
        runner.close()
    for task, scores in reference.items():
        agree = sum(served[task].scores[d] == s for d, s in scores.scores.items())
        assert agree >= 0.99 * len(scores.scores), f"{task}: {agree}/{len(scores.scores)} items agree"
    assert ours.keys() == theirs.keys()
    assert max(abs(ours[k][0] - theirs[k][0]) for k in ours) < 1e-3
    assert all(ours[k][1] == theirs[k][1] for k in ours)
