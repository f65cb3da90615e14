"""Model architectures, one declaration each (see spec.Architecture); look one up by a config's architecture."""

from __future__ import annotations

from quantkit.architectures.llama_family import DECLARATIONS
from quantkit.architectures.spec import Architecture, InputGroup
from quantkit.errors import QuantkitError

ARCHITECTURES: dict[str, Architecture] = {hf: arch for arch in DECLARATIONS for hf in arch.hf_architectures}


def architecture_of(config: dict, where: str = "config.json") -> Architecture:
    """The declaration for an HF config (a dict); QuantkitError naming what is supported otherwise."""
    name = (config.get("architectures") or ["?"])[0]
    if name not in ARCHITECTURES:
        raise QuantkitError(f"architecture {name} of {where} is not supported yet",
                            hint=f"supported: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


__all__ = ["ARCHITECTURES", "Architecture", "InputGroup", "architecture_of"]
