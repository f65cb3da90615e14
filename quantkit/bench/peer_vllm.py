"""vLLM worker for `quantkit bench vllm`: greedy continuations of given token ids from a checkpoint as vLLM
loads it, to compare with quantkit's own model.

Runs under the vLLM venv's python (see quantkit/bench/peers.py), so it imports only vllm and the standard
library, never quantkit.

    python peer_vllm.py CHECKPOINT PROMPTS_JSON NEW_TOKENS {auto|fp8} THREADS [DTYPE [prefill]]

PROMPTS_JSON is a file holding a list of token-id lists. Prints, last, one JSON line: {"token_ids" (one list
per prompt), "token_logprobs" (per prompt, the log-probability of each token of prompt + continuation after
the first, teacher-forced), "load_s", "generate_s", "tokens_per_s", "scale_log" (what vLLM logged about k/v or other
scales, such as "Using KV cache scaling factor 1.0"), "w4a16_fallback_layers" (INT4 layers run through the
dense fallback below, 0 where vLLM's own kernel runs), "loaded_rss_mib", "peak_rss_mib"}. DTYPE defaults to bfloat16. Some vLLM CPU runs abort at process exit after
printing it; the caller trusts a complete line over the exit code.

generate_s is timed after a warm-up (the first two prompts, two tokens each), as quantkit's offline rows are.
With "prefill" the line also has "prefill_s": after the timed run, the same prompts with their first token one
id higher (so the prefix cache serves nothing from that run) generate one token each, timed (quantkit's
bench offline splits prefill from decode with it).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time


class ScaleLog(logging.Handler):
    """Keeps vLLM's log messages that mention scales: whether it used the checkpoint's k/v scales or 1.0."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "scal" in message.lower() and message not in self.messages:
            self.messages.append(message)


def pin_environment(threads: int) -> None:
    """Before importing vllm: the engine in this process (so its logs reach ScaleLog and its threads are
    the ones pinned), OpenMP threads bound to the first `threads` cores, a small KV cache (GiB)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if threads == 1 else f"0-{threads - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def install_w4a16_fallback(replaced: list[str], dtype: str) -> None:
    """vllm-cpu 0.32's AVX2 library lacks cpu_gemm_wna16, the op behind its only CPU INT4 (W4A16) kernel, so on
    an AVX2-only CPU every INT4 layer fails at its first forward; on AVX-512 the op exists but refuses float32
    activations ("not implemented for 'Float'"). Where the op is missing or the dtype is float32, dequantize each
    layer once at load, with vLLM's own unpacking of the tensors its loaders produced, and multiply densely in the
    compute dtype:
    reading the checkpoint (names, packing, scales, zero points) stays vLLM's; only the GEMM is replaced.
    Replaced layers are counted in `replaced`, and the result line says so."""
    import torch
    from vllm.model_executor.kernels.linear.mixed_precision.cpu import CPUWNA16LinearKernel
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32

    process, apply = CPUWNA16LinearKernel._process_gptq_weights_w4a16, CPUWNA16LinearKernel.apply_weights

    def dequantize(self, layer: torch.nn.Module) -> None:
        if hasattr(torch.ops._C, "cpu_gemm_wna16") and dtype != "float32":
            return process(self, layer)
        # Here vLLM has laid the weights out GPTQ-style: packed [in/8, out], scales and zero points [groups, out].
        packed, scales, packed_zero = self._get_weight_params(layer)
        q = unpack_quantized_values_into_int32(packed.data, self.config.weight_type, 0)
        if packed_zero is None:  # symmetric: the stored nibble is q + bias (8 for uint4b8)
            zero = torch.full(scales.shape, self.config.weight_type.bias, dtype=torch.int32)
        else:
            zero = unpack_quantized_values_into_int32(packed_zero.data, self.config.weight_type, 1)
        group = torch.arange(q.shape[0]) // (q.shape[0] // scales.shape[0])
        weight = (q - zero[group]).float() * scales.data.float()[group]
        layer.dense_weight = torch.nn.Parameter(weight.t().contiguous().to(scales.dtype), requires_grad=False)
        replaced.append(self.w_q_name)

    def matmul(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not hasattr(layer, "dense_weight"):
            return apply(self, layer, x, bias)
        return torch.nn.functional.linear(x, layer.dense_weight, bias)

    CPUWNA16LinearKernel._process_gptq_weights_w4a16 = dequantize
    CPUWNA16LinearKernel.apply_weights = matmul


def main(checkpoint: str, prompts_file: str, new_tokens: int, kv_cache_dtype: str, threads: int,
         dtype: str = "bfloat16", prefill_pass: bool = False) -> None:
    pin_environment(threads)
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    torch.set_num_threads(threads)
    scale_log = ScaleLog()
    logging.getLogger("vllm").addHandler(scale_log)
    replaced: list[str] = []
    install_w4a16_fallback(replaced, dtype)
    with open(prompts_file) as f:
        prompts = json.load(f)
    started = time.perf_counter()
    # bf16 is what vLLM's CPU kernels are built for; eager mode skips ~30 s of torch.compile at startup.
    llm = LLM(model=checkpoint, dtype=dtype, enforce_eager=True, kv_cache_dtype=kv_cache_dtype,
              max_model_len=max(map(len, prompts)) + new_tokens + 1, seed=0)  # + 1: the scoring pass
    load_s = time.perf_counter() - started
    loaded_rss_mib = next((int(line.split()[1]) / 1024 for line in open("/proc/self/status")
                           if line.startswith("VmRSS:")), None)
    # ignore_eos: both sides produce exactly new_tokens, so an end-of-text token is compared like any other.
    llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts[:2]],
                 SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)  # warm up
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
    generate_s = time.perf_counter() - started
    prefill_s = None
    if prefill_pass:
        started = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=[ids[0] + 1, *ids[1:]]) for ids in prompts],
                     SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False)
        prefill_s = round(time.perf_counter() - started, 3)
    token_ids = [list(out.outputs[0].token_ids) for out in outputs]
    # Teacher-forced: the log-probability vLLM gives each token of prompt + its own continuation, so the two
    # engines are compared position by position even where one near-tie has sent the greedy runs apart.
    sequences = [ids + new for ids, new in zip(prompts, token_ids)]
    scored = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in sequences],
                          SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    token_logprobs = [[step[token].logprob for step, token in zip(out.prompt_logprobs[1:], ids[1:])]
                      for out, ids in zip(scored, sequences)]
    result = {"token_ids": token_ids, "load_s": round(load_s, 2), "generate_s": round(generate_s, 3),
              "prefill_s": prefill_s,
              "tokens_per_s": round(sum(map(len, token_ids)) / generate_s, 1), "token_logprobs": token_logprobs,
              "scale_log": scale_log.messages,
              "w4a16_fallback_layers": len(replaced),
              "loaded_rss_mib": loaded_rss_mib,
              "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if len(sys.argv) not in (6, 7, 8) or sys.argv[7:] not in ([], ["prefill"]):
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), *sys.argv[6:7],
         prefill_pass=sys.argv[7:] == ["prefill"])
