"""What an export reads: the model it is given (unwrapped, refused when it holds peft adapter layers) or a saved model
directory, loaded eagerly."""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from prunetrain.engine.heads import unwrap_model
from prunetrain.engine.peft_support import has_tuner_layers


def load_source(source: str | os.PathLike | nn.Module) -> nn.Module:
    """A model as given (its modes too: `export` runs it in eval mode and puts them back), or a saved directory
    loaded eagerly (`load_pruned` for a prunetrain layout, else its HF class)."""
    if isinstance(source, nn.Module):
        if has_tuner_layers(unwrap_model(source)):  # the formats write the base architecture's weights
            raise ValueError("source: the model holds peft adapter layers; export model.merge_and_unload() (or the "
                             "directory prunetrain.save_pruned(model, dir) writes, merged) instead.")
        return unwrap_model(source)
    from prunetrain.engine.model_dir import load_model_dir

    return load_model_dir(Path(source), argument="source")


__all__ = ["load_source"]
