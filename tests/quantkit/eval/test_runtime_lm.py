"""RuntimeLM (lm-eval over quantkit.runtime) against lm-eval's HFLM on the same tiny random model, float32."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.eval.lm_tasks import go_offline

go_offline()

from lm_eval.api.instance import Instance  # noqa: E402

PAIRS = [
    ("How do I reset my password?", " Go to settings, then security"),
    ("Your order 12345 shipped", " yesterday and should arrive on Friday."),
    ("The meeting decided to move the launch to ", "March"),  # the trailing space moves to the continuation
    ("", "The storage API returns 429"),  # empty context: the prefix token (BOS) conditions it
    ("def add(a, b):\n", "    return a + b\n"),
]
TEXTS = ["How do I reset my password? Go to settings, then security, then reset. " * 3,
         "退款会在三到五个工作日内原路返回。", "def add(a, b):\n    return a + b\n"]


def instances(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


@pytest.fixture(scope="module")
def hf_lm(tiny_model):
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM

    from quantkit.models import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    return HFLM(pretrained=model, tokenizer=load_tokenizer(tiny_model), batch_size=2, max_length=24)


@pytest.fixture(scope="module")
def runtime_lm(tiny_model):
    from quantkit.eval.runtime_lm import RuntimeLM

    return RuntimeLM(tiny_model, max_length=24, dtype="float32", max_model_len=64, block_size=4,
                     max_num_batched_tokens=32)


def greedy_pair(lm, context: str) -> tuple[str, str]:
    """(context, the model's own greedy continuation): a pair that is_greedy must call greedy."""
    from quantkit.runtime import SamplingParams

    out = lm.llm.generate([lm.tok_encode(context)], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    return context, lm.tok_decode(out.token_ids)


def test_loglikelihood_equals_hflm(hf_lm, runtime_lm):
    pairs = PAIRS + [greedy_pair(runtime_lm, "Your order")]
    pairs.append(("word " * 30, " again and again"))  # over max_length: both cut the context on the left
    expected = hf_lm.loglikelihood(instances("loglikelihood", pairs), disable_tqdm=True)
    got = runtime_lm.loglikelihood(instances("loglikelihood", pairs), disable_tqdm=True)
    assert [g for _, g in got] == [g for _, g in expected]
    assert got[-2][1], "the model's own greedy continuation must be greedy"
    torch.testing.assert_close(torch.tensor([s for s, _ in got]), torch.tensor([s for s, _ in expected]),
                               rtol=0, atol=1e-4)


def test_loglikelihood_rolling_equals_hflm(hf_lm, runtime_lm):
    args = [(t,) for t in TEXTS]  # the first is several windows of max_length
    expected = hf_lm.loglikelihood_rolling(instances("loglikelihood_rolling", args), disable_tqdm=True)
    got = runtime_lm.loglikelihood_rolling(instances("loglikelihood_rolling", args), disable_tqdm=True)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=0, atol=1e-4)


def test_generate_until_equals_hflm(hf_lm, runtime_lm):
    args = [("How do I reset", {"until": ["."], "max_gen_toks": 8, "do_sample": False}),
            ("Your order", {"until": ["\n\n"], "max_gen_toks": 6}),
            ("def add(a, b):" * 4, {"until": [], "max_gen_toks": 5})]  # the context loses tokens on the left
    expected = hf_lm.generate_until(instances("generate_until", args), disable_tqdm=True)
    got = runtime_lm.generate_until(instances("generate_until", args), disable_tqdm=True)
    assert got == expected


def test_task_scores_equal_hflm(tiny_model, eval_task, runtime_lm):
    """Through lm-eval's evaluator: per-item scores on a multiple-choice task equal HFLM's."""
    from quantkit.eval.lm_tasks import TaskRunner, read_task
    from quantkit.models import load_model, load_tokenizer

    runner = TaskRunner([read_task(eval_task)])
    try:
        served = runner.run_lm(runtime_lm)["tiny_mc"].scores
        reference = runner.run(load_model(tiny_model), load_tokenizer(tiny_model))["tiny_mc"].scores
    finally:
        runner.close()
    assert served == reference and len(served) == 4


def test_contexts_take_turns():
    from quantkit.eval import runtime_lm

    contexts = [(1,), (1,), (1,), (2,), (2,), (3,)]
    assert runtime_lm.context_turns(contexts) == [0, 3, 5, 1, 4, 2]


def test_max_length_must_fit_the_engine(tiny_model):
    from quantkit.eval.runtime_lm import RuntimeLM

    with pytest.raises(QuantkitError, match="max_length 63"):
        RuntimeLM(tiny_model, max_length=63, dtype="float32", max_model_len=64)


def test_an_int4_checkpoint_is_scored_on_the_runtimes_int4_layers(tiny_model, tmp_path):
    """The checkpoint as served (Int4Linear, the runtime's INT4 kernels) against HFLM on its dequantized weights:
    equal up to the INT4 kernels' own rounding."""
    from lm_eval.models.huggingface import HFLM

    from quantkit.eval.runtime_lm import RuntimeLM
    from quantkit.models import load_model, load_tokenizer
    from quantkit.quantize.run import QuantizeOptions, quantize
    from quantkit.runtime.layers.linear import Int4Linear

    checkpoint = tmp_path / "int4"
    quantize(QuantizeOptions(model=str(tiny_model), recipe="rtn-w4a16-g64", out=checkpoint))
    lm = RuntimeLM(checkpoint, dtype="float32", max_model_len=64)
    assert isinstance(lm.llm.engine.runner.model.model.layers[0].mlp.down_proj, Int4Linear)
    hf = HFLM(pretrained=load_model(checkpoint), tokenizer=load_tokenizer(checkpoint), batch_size=2)
    expected = hf.loglikelihood(instances("loglikelihood", PAIRS), disable_tqdm=True)
    got = lm.loglikelihood(instances("loglikelihood", PAIRS), disable_tqdm=True)
    torch.testing.assert_close(torch.tensor([s for s, _ in got]), torch.tensor([s for s, _ in expected]),
                               rtol=1e-4, atol=5e-3)
