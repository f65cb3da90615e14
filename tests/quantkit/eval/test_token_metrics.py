import numpy as np
import pytest
import torch

from quantkit.eval import token_metrics as tm
from quantkit.eval.suite import BootstrapSpec
from quantkit.models import load_model


@pytest.fixture(scope="module")
def sequences():
    torch.manual_seed(0)
    return [torch.randint(0, 300, (n,)).tolist() for n in (20, 33, 9)]


def test_identical_models_agree_exactly(tiny_model, sequences):
    model = load_model(tiny_model)
    base = tm.baseline_pass(model, sequences, top_k=16)
    comp = tm.candidate_pass(model, sequences, base)
    assert comp.kl.shape == (19 + 32 + 8,) and float(comp.kl.max()) == 0.0 and comp.agree.all()
    rows = {m.metric: m for m in tm.measurements(comp, "all", BootstrapSpec(resamples=50))}
    assert rows["perplexity_increase_pct"].estimate.value == 0.0
    assert rows["top1_agreement"].estimate.value == 1.0 and rows["kl_p99"].estimate.high == 0.0
    assert rows["kl_mean"].tokens == 59 and rows["kl_mean"].estimate.n == 3


def test_perturbed_model_diverges(tiny_model, perturbed_model, sequences):
    base = tm.baseline_pass(load_model(tiny_model), sequences, top_k=16)
    comp = tm.candidate_pass(load_model(perturbed_model), sequences, base)
    rows = {m.metric: m for m in tm.measurements(comp, "all", BootstrapSpec(resamples=50))}
    assert rows["kl_mean"].estimate.value > 0.01
    assert rows["top1_agreement"].estimate.value < 1.0
    assert rows["kl_mean"].estimate.low <= rows["kl_mean"].estimate.value <= rows["kl_mean"].estimate.high


def test_bucketed_kl_is_exact_with_the_whole_vocabulary_and_a_lower_bound_otherwise():
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(5, 50), -1)
    logq = torch.log_softmax(torch.randn(5, 50), -1)
    exact = (logp.exp() * (logp - logq)).sum(-1).double().numpy()
    full = logp.topk(50, -1)
    assert np.allclose(tm.bucketed_kl(full.values, full.indices, logq), exact, atol=1e-5)
    top = logp.topk(5, -1)
    bucketed = tm.bucketed_kl(top.values, top.indices, logq)
    assert (bucketed <= exact + 1e-6).all() and (bucketed > 0).all()


def test_records_are_sampled_across_the_split_one_sequence_each():
    records = [[i] * (i % 7 + 1) for i in range(100)]  # records 0, 7, 14, ... have one token: unusable
    chosen = tm.sample_records(records, max_seq_len=4, records=10, seed=0)
    assert len(chosen) == 10 and all(2 <= len(ids) <= 4 for ids in chosen)
    firsts = [ids[0] for ids in chosen]
    assert firsts == sorted(firsts) and len(set(firsts)) == 10 and max(firsts) > 50  # not the split's start
    assert tm.sample_records(records, 4, 10, seed=0) == chosen and tm.sample_records(records, 4, 10, seed=1) != chosen
    assert len(tm.sample_records(records, 4, 1000, seed=0)) == 85  # every usable record
