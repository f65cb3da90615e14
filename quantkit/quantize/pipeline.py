"""The sequential pipeline: for each decoder layer, load its weights, let the recipe's method quantize it
on the cached activations of all calibration samples, keep its outputs as the next layer's inputs,
hand its tensors to the checkpoint writer and drop them. Peak memory: one layer plus the activations
(and what the writer buffers, at most one shard).

With a kv_cache_scheme, each layer's K/V absmax is measured after quantization, with the weights the
checkpoint will hold, on the same inputs the method saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from quantkit.architectures import architecture_of
from quantkit.calibration.layerwise import LayerwiseModel
from quantkit.errors import QuantkitError
from quantkit.algorithms import fp8
from quantkit.formats.quantized import Fp8Weight, QuantizedWeight
from quantkit.memory import release_freed_memory
from quantkit.models import describe_model, head_dim, stored_dtype
from quantkit.quantize.activations import ActivationStore, InMemory
from quantkit.quantize.methods import LinearReport
from quantkit.quantize.staged import StagedLayer
from quantkit.recipes import Recipe

LayerCallback = Callable[[int, int], None]
# Receives each finished piece of the model: (dense tensors in the model dtype, module name -> quantized weight).
LayerSink = Callable[[dict[str, torch.Tensor], dict[str, QuantizedWeight | Fp8Weight]], None]


@dataclass
class QuantizeSummary:
    """What the pipeline learned besides the tensors, which went to the sink as they were made."""
    reports: list[LinearReport] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # decoder linears the recipe leaves dense
    routed_tokens: dict[str, list[int]] = field(default_factory=dict)  # MoE layer -> calibration tokens per expert
    warnings: list[str] = field(default_factory=list)


def check_group_size(model_path: Path, recipe: Recipe) -> None:
    """Refuse before any work when the group size does not divide a targeted layer's input size.
    Llama-family layers all have layer 0's shapes."""
    group = recipe.weights.group_size
    if group == -1:
        return
    info = describe_model(model_path)
    misfits = [name for name, (_, fan_in) in info.linear_shapes.items()
               if fan_in % group and recipe.is_quantized(f"model.layers.0.{name}")]
    if misfits:
        fits = ", ".join(str(g) for g in info.group_sizes_that_fit) or "none of 32/64/128/256"
        raise QuantkitError(
            f"group size {group} does not divide the input size of {', '.join(misfits)} in {model_path}",
            hint=f"group sizes that fit every layer: {fits}, or -1 (per channel)",
        )


def quantize_model(model_path: Path, recipe: Recipe, samples: list[list[int]] | None, sink: LayerSink,
                   on_layer: LayerCallback | None = None, scale_dtype: torch.dtype | None = None,
                   activations: ActivationStore | None = None) -> QuantizeSummary:
    """Quantize layer by layer, giving ``sink`` each layer's tensors (with its KV-cache scales
    "model.layers.N.self_attn.k_scale" / "v_scale" when the recipe has a kv_cache_scheme), then the
    embedding, final norm and lm_head. scale_dtype: what the checkpoint stores scales in (default: the
    model dtype). activations: where the calibration activations are kept (default: in memory)."""
    activations = activations or InMemory()
    model = LayerwiseModel(model_path)
    config = model.config
    config_dict = config.to_dict()
    architecture = architecture_of(config_dict, str(model_path))
    # The layer-wise model computes in float32 (and says so in its config); the checkpoint keeps the
    # source's dtype for dense tensors and scales.
    dtype = stored_dtype(model_path)
    method_class = recipe.method_class
    if recipe.needs_calibration and not samples:
        raise QuantkitError(f"recipe {recipe.name} ({recipe.quantization.method}) needs calibration data",
                            hint="pass --calib DIR or --dataset SET")
    hidden = rotary = reference_hidden = None
    if recipe.needs_calibration:
        hidden = activations.keep(h[0] for h in model.embed_each(samples))
        rotary_tables = {}  # by rotary_kind: layers of one kind share their tables
        # The full-precision model's hidden states, for methods that fit its outputs (GPTQ fp_targets), on
        # the samples they ask for.
        picks = reference_picks(recipe, len(samples))
        if picks is not None:
            reference_hidden = activations.keep(hidden[i] for i in picks)
    summary = QuantizeSummary()
    for index in range(model.num_layers):
        prefix = f"model.layers.{index}"
        if recipe.needs_calibration:
            rotary_kind = model.rotary_kind(index)
            if rotary_kind not in rotary_tables:
                rotary_tables[rotary_kind] = _rotary_by_sample(model, samples, index)
            rotary = rotary_tables[rotary_kind]
        with model.layer(index) as layer:
            method = method_class(recipe, prefix, scale_dtype=scale_dtype or dtype, keep=activations.keep)
            staged = StagedLayer(layer, config.num_attention_heads, config.num_key_value_heads, head_dim(config),
                                 reuse_rotated=not activations.offloaded, forward_dtype=method.forward_dtype(),
                                 architecture=architecture, window=architecture.layer_window(config_dict, index))
            done = method.quantize_layer(staged, hidden, rotary, reference_hidden=reference_hidden)
            dense = {}
            if recipe.kv_cache_scheme is not None:
                _load_quantized(staged, done.quantized)
                dense.update(_kv_scales(staged, prefix, hidden, rotary))
                if done.outputs is None:  # a method without data: the next layer still needs inputs
                    done.outputs = activations.keep(staged.forward(h, r) for h, r in zip(hidden, rotary))
            hidden, reference_hidden = done.outputs, done.reference_outputs
            _note_routing(staged, prefix, done.reports, summary)
            for name, tensor in layer.state_dict().items():
                module, kind = name.rsplit(".", 1)
                if module not in done.quantized or kind != "weight":  # a quantized linear's bias stays dense
                    dense[f"{prefix}.{name}"] = tensor.detach().to(dtype).clone()
            # the checkpoint's names (Mixtral's MoE block is stored under another name than transformers gives it)
            stored = architecture.stored_name
            sink({stored(n): t for n, t in dense.items()},
                 {stored(f"{prefix}.{n}"): w for n, w in done.quantized.items()})
            summary.ignored += [stored(f"{prefix}.{n}") for n, m in layer.named_modules()
                                if isinstance(m, torch.nn.Linear) and n not in done.quantized]
            if architecture.experts:  # routers stay 16-bit: say so to loaders that would take them for linears
                summary.ignored.append(stored(f"{prefix}.{architecture.experts.block}.{architecture.experts.router}"))
        summary.reports += done.reports
        del done, dense
        release_freed_memory(collect_cycles=False)  # else the heap fragments and resident memory grows layer by layer
        if on_layer:
            on_layer(index + 1, model.num_layers)
    sink(_outside_layers(model), {})
    return summary


def _note_routing(staged: StagedLayer, prefix: str, reports: list[LinearReport], summary: QuantizeSummary) -> None:
    """Tokens routed to each expert of an MoE layer, and a warning (and a note on its linears' reports) for each
    expert that was calibrated on every token because too few were routed to it."""
    if not staged.routed_tokens:
        return
    summary.routed_tokens[prefix] = staged.routed_tokens
    top_k = staged.layer.get_submodule(f"{staged.experts.block}.{staged.experts.router}").top_k
    total = sum(staged.routed_tokens) // top_k
    for expert in staged.forced_experts:
        routed, width = staged.routed_tokens[expert], staged.expert_linear(expert, "gate").in_features
        summary.warnings.append(f"{prefix}: expert {expert} was routed {routed} calibration tokens, fewer than its "
                                f"{width} inputs: calibrated on all {total} tokens of the layer instead (forced routing)")
        names = {f"{prefix}.{staged.experts.linear(expert, n)}" for n in (staged.experts.gate, staged.experts.up,
                                                                          staged.experts.down)}
        for report in reports:
            if report.name in names:
                report.note = "; ".join(filter(None, [report.note, f"forced routing: {routed} tokens routed"]))


def reference_picks(recipe: Recipe, num_samples: int) -> list[int] | None:
    """The calibration samples the recipe's method runs the full-precision model's stream on, or None."""
    return recipe.method_class(recipe, "model.layers.0").reference_picks(num_samples)


def _rotary_by_sample(model: LayerwiseModel, samples: list[list[int]],
                      layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each sample's rotary cos/sin for one layer, in the model's compute dtype. They depend on positions only,
    so samples of one length share them."""
    by_length = {}
    for ids in samples:
        if len(ids) not in by_length:
            by_length[len(ids)] = model.position_embeddings(torch.zeros(1, len(ids), 1, dtype=model.dtype), layer)
    return [by_length[len(ids)] for ids in samples]


def _load_quantized(staged: StagedLayer, quantized: dict[str, QuantizedWeight | Fp8Weight]) -> None:
    """Put the weights the checkpoint will hold into the layer (methods may leave originals there)."""
    for name, weight in quantized.items():
        linear = staged.linear(name)
        linear.weight.data = weight.dequantize(linear.weight.dtype)


def _kv_scales(staged: StagedLayer, prefix: str, hidden: list[torch.Tensor],
               rotary: list) -> dict[str, torch.Tensor]:
    """Per-tensor FP8 KV-cache scales of one layer: absmax over every calibration token / 448."""
    k_max = v_max = 0.0
    for h, r in zip(hidden, rotary):
        k, v = staged.key_value_absmax(h, r)
        k_max, v_max = max(k_max, k), max(v_max, v)
    return {f"{prefix}.self_attn.k_scale": fp8.scale_for(torch.tensor([k_max])),
            f"{prefix}.self_attn.v_scale": fp8.scale_for(torch.tensor([v_max]))}


def _outside_layers(model: LayerwiseModel) -> dict[str, torch.Tensor]:
    """Embedding, final norm and (when not tied) lm_head, copied as stored."""
    names = [n for n in model.store.names() if ".layers." not in n]
    return model.store.load(names)
