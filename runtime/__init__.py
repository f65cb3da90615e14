"""quantkit.runtime: the paired serving runtime (paged KV cache, continuous batching, prefix caching).

    from quantkit.runtime import LLM, SamplingParams
    llm = LLM("smollm2-135m", kv_cache_dtype="fp8")
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))

LLMEngine (add_request / step / abort / stats) is the layer underneath, for servers.
"""

from quantkit.runtime.config import EngineConfig
from quantkit.runtime.engine import EngineStats, LLMEngine
from quantkit.runtime.llm import LLM
from quantkit.runtime.logprobs import TokenLogprob
from quantkit.runtime.outputs import RequestMetrics, RequestOutput
from quantkit.runtime.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "LLMEngine", "EngineConfig", "EngineStats", "RequestOutput", "RequestMetrics",
           "TokenLogprob"]
