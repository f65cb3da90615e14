"""Logits worker for `quantkit bench read-peer`: transformers (with compressed-tensors) reads a checkpoint
llm-compressor wrote, and computes logits, so quantkit's own reading of the format can be compared with it.

Runs under the llm-compressor venv's python (see quantkit/bench/peers.py), so it imports only torch,
transformers, safetensors and the standard library, never quantkit.

    python peer_llmcompressor_logits.py CHECKPOINT PROMPTS_JSON OUT_SAFETENSORS THREADS

PROMPTS_JSON is a file holding a list of token-id lists; OUT_SAFETENSORS gets float32 `logits_<i>` [tokens,
vocab] per prompt. Prints, last, one JSON line {"load_s", "forward_s", "linear_class"}, where linear_class
names what transformers made of a quantized layer (a dense Linear once decompressed).
"""

from __future__ import annotations

import json
import sys
import time

import torch


def main(checkpoint: str, prompts_file: str, out_file: str, threads: int) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    with open(prompts_file) as f:
        prompts = json.load(f)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    with torch.inference_mode():
        logits = {f"logits_{i}": model(input_ids=torch.tensor([ids])).logits[0].float().contiguous()
                  for i, ids in enumerate(prompts)}
    forward_s = time.perf_counter() - started
    save_file(logits, out_file)
    linear_class = type(model.model.layers[0].self_attn.q_proj).__name__
    print(json.dumps({"load_s": round(load_s, 2), "forward_s": round(forward_s, 2), "linear_class": linear_class}),
          flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
