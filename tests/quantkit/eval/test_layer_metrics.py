import math

import torch

from quantkit.eval import layer_metrics as lm
from quantkit.eval.suite import BootstrapSpec
from quantkit.models import load_model

SAMPLES = [list(range(5, 25)), list(range(40, 52))]


def test_identical_models_infinite_sqnr_zero_shift(tiny_model):
    model = load_model(tiny_model)
    comp = lm.candidate_pass(model, SAMPLES, lm.baseline_pass(model, SAMPLES))
    assert comp.js.shape == (2, 2)  # samples x layers
    assert (comp.attention_shift() == 0).all() and all(math.isinf(x) for x in comp.sqnr_db())
    rows = {m.metric: m for m in lm.measurements(comp, BootstrapSpec(resamples=20))}
    assert rows["layer_sqnr_min_db"].estimate.value == math.inf


def test_perturbed_model_has_finite_sqnr_and_attention_shift(tiny_model, perturbed_model):
    base = lm.baseline_pass(load_model(tiny_model), SAMPLES)
    comp = lm.candidate_pass(load_model(perturbed_model), SAMPLES, base)
    assert (comp.attention_shift() > 0).all()
    sqnr = comp.sqnr_db()
    assert all(math.isfinite(x) and x < 40 for x in sqnr)


def test_attention_implementation_is_restored(tiny_model):
    model = load_model(tiny_model)
    before = model.config._attn_implementation
    lm.baseline_pass(model, SAMPLES[:1])
    assert model.config._attn_implementation == before


def test_js_divergence_bounds():
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    q = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    js = lm.js_divergence(p, q)
    assert abs(float(js[0]) - math.log(2)) < 1e-6 and float(js[1]) == 0.0
