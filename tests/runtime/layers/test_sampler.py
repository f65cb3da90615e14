import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.runtime.layers.sampler import sample
from quantkit.runtime.sampling_params import SamplingParams

LOGITS = torch.tensor([[0.0, 3.0, 2.0, 1.0, -1.0]] * 2)


def draws(params, n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {sample(LOGITS[:1], [params], [g])[0] for _ in range(n)}


def test_greedy_and_degenerate_filters_pick_the_argmax():
    assert sample(LOGITS, [SamplingParams(temperature=0)] * 2, [None, None]) == [1, 1]
    assert draws(SamplingParams(top_k=1)) == {1}
    assert draws(SamplingParams(top_p=0.01)) == {1}


def test_top_k_and_top_p_bound_the_support():
    assert draws(SamplingParams(top_k=2)) == {1, 2}
    # softmax([3, 2, 1, 0, -1]) = .64 .24 .09 .03 .01: top_p 0.8 keeps the first two, 0.9 the first three
    assert draws(SamplingParams(top_p=0.8)) == {1, 2}
    assert draws(SamplingParams(top_p=0.9)) == {1, 2, 3}
    assert draws(SamplingParams(temperature=5.0), n=400) == {0, 1, 2, 3, 4}


def test_a_seed_fixes_a_rows_draws_whatever_its_neighbours():
    params = SamplingParams(temperature=2.0, seed=3)

    def row_draws(other_generator):
        g = torch.Generator().manual_seed(3)
        return [sample(LOGITS, [params, SamplingParams(temperature=2.0)], [g, other_generator])[0]
                for _ in range(20)]

    assert row_draws(None) == row_draws(torch.Generator().manual_seed(99))


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2),
                                 dict(max_tokens=0)])
def test_bad_sampling_params_are_refused(bad):
    with pytest.raises(QuantkitError):
        SamplingParams(**bad)


def test_a_single_stop_string_becomes_a_list():
    assert SamplingParams(stop="\n").stop == ["\n"]
