"""A model directory with another one's architecture (config and head layout) and freshly initialised weights.

For speed benchmarks on a machine the trained weights cannot be copied to: a training or inference step costs the
same for any weight values, so `SRC` needs only its `config.json`, `prunetrain_layout.json` (a pruned model) and
tokenizer files. The model is built from the config, shrunk to the recorded layout (`shrink_to_layout`, the one
way prunetrain rebuilds a recorded shape) and saved with the tokenizer like any trained model.

    python benchmarks/fresh_weights.py SRC DST
"""

from __future__ import annotations

import argparse
import copy

import torch
import transformers

from prunetrain import find_heads
from prunetrain.engine.heads import LAYOUT_CONFIG_KEY
from prunetrain.engine.persist import read_config, shrink_to_layout
from prunetrain.mt.data import load_tokenizer
from prunetrain.mt.translation import find_tokenizer_dir, save_translation_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", help="a model directory (its weights are not read)")
    p.add_argument("dst", help="the new model directory")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    config = read_config(args.src)
    recorded = getattr(config, LAYOUT_CONFIG_KEY, None)
    config = copy.deepcopy(config)
    if recorded is not None:
        delattr(config, LAYOUT_CONFIG_KEY)
    torch.manual_seed(args.seed)
    model = getattr(transformers, config.architectures[0])(config)
    shrink_to_layout(model, recorded)
    save_translation_model(model, load_tokenizer(find_tokenizer_dir(args.src)), args.dst)
    print(f"{args.dst}: {find_heads(model).summary()} with fresh weights")


if __name__ == "__main__":
    main()
