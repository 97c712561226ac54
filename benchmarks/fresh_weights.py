"""A model directory with another one's architecture (config and head layout) and freshly initialised weights.

For speed benchmarks on a machine the trained weights cannot be copied to: a training or inference step costs the
same for any weight values, so `SRC` needs only its `config.json`, `prunetrain_layout.json` (a pruned model) and
tokenizer files. The model is built from the config, shrunk to the recorded layout (`shrink_to_layout`, the one
way prunetrain rebuilds a recorded shape) and saved with the tokenizer like any trained model.

    python benchmarks/fresh_weights.py SRC DST
    python benchmarks/fresh_weights.py SRC DST --d-model 512 --ffn-dim 2048   # the same layout at Transformer-base widths

`--d-model` / `--ffn-dim` widen a Marian-style config (the recipe's GPU setting, `marian_config_base`): the same
layers and heads kept, head_dim = d_model / heads — the model a GPU-sized step is measured on.
"""

from __future__ import annotations

import argparse
import copy

import torch
import transformers

from prunetrain import find_heads
from prunetrain.engine.heads import LAYOUT_CONFIG_KEY
from prunetrain.engine.persist import read_config, shrink_to_layout
from prunetrain.mt.text.data import load_tokenizer
from prunetrain.mt.evaluation.translation import find_tokenizer_dir, save_translation_model


def widen(config, d_model: int | None, ffn_dim: int | None) -> None:
    """Set a Marian-style config's width and feed-forward widths (in place); the width must split into its heads."""
    if d_model is not None:
        heads = {config.encoder_attention_heads, config.decoder_attention_heads}
        if any(d_model % h for h in heads):
            raise SystemExit(f"--d-model: {d_model} does not split into {sorted(heads)} heads per site.")
        config.d_model = d_model
    if ffn_dim is not None:
        config.encoder_ffn_dim = config.decoder_ffn_dim = ffn_dim


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", help="a model directory (its weights are not read)")
    p.add_argument("dst", help="the new model directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--d-model", type=int, default=None, help="model width (default: SRC's)")
    p.add_argument("--ffn-dim", type=int, default=None, help="feed-forward width of every layer (default: SRC's)")
    args = p.parse_args()
    config = read_config(args.src)
    recorded = getattr(config, LAYOUT_CONFIG_KEY, None)
    config = copy.deepcopy(config)
    widen(config, args.d_model, args.ffn_dim)
    if recorded is not None:
        delattr(config, LAYOUT_CONFIG_KEY)
    torch.manual_seed(args.seed)
    model = getattr(transformers, config.architectures[0])(config)
    shrink_to_layout(model, recorded)
    save_translation_model(model, load_tokenizer(find_tokenizer_dir(args.src)), args.dst)
    print(f"{args.dst}: {find_heads(model).summary()} with fresh weights")


if __name__ == "__main__":
    main()
