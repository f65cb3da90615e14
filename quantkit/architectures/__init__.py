"""Model architectures, one declaration each (see spec.Architecture); look one up by a config's architecture."""

from __future__ import annotations

from quantkit.architectures.llama_family import DECLARATIONS
from quantkit.architectures.spec import Architecture, Experts, InputGroup
from quantkit.errors import QuantkitError

ARCHITECTURES: dict[str, Architecture] = {hf: arch for arch in DECLARATIONS for hf in arch.hf_architectures}


def architecture_of(config: dict, where: str = "config.json") -> Architecture:
    """The declaration for an HF config (a dict); QuantkitError naming what is supported otherwise."""
    name = (config.get("architectures") or ["?"])[0]
    if name not in ARCHITECTURES:
        raise QuantkitError(f"architecture {name} of {where} is not supported yet",
                            hint=f"supported: {', '.join(ARCHITECTURES)}")
    architecture = ARCHITECTURES[name]
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise QuantkitError(f"{where}: rotary embedding on part of each head (partial_rotary_factor "
                            f"{config['partial_rotary_factor']}) is not supported yet")
    if architecture.experts and (config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1):
        raise QuantkitError(f"{where}: {name} with dense MLP layers among the sparse ones is not supported yet",
                            hint="supported: every decoder layer sparse (decoder_sparse_step 1, no mlp_only_layers)")
    return architecture


__all__ = ["ARCHITECTURES", "Architecture", "Experts", "InputGroup", "architecture_of"]
