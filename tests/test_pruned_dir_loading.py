"""How a directory written by `prunetrain.save_pruned` loads without prunetrain (issue 63, item 7).

(a) The tokenizer saved beside a pruned model loads with `AutoTokenizer` and no remote code: no `auto_map` entry
points a tokenizer at remote code, and `AutoTokenizer.from_pretrained(dir, trust_remote_code=False)` loads it, with
stdin not a terminal, without transformers' "run the custom code?" prompt.
(b) Phi-3 and OLMo 2, whose shrunk attention runs code only prunetrain has: `AutoModelForCausalLM.from_pretrained(dir,
trust_remote_code=True)` fails with one sentence naming `prunetrain.load_pruned` (it said "update Transformers"), in
a process that cannot import prunetrain; `prunetrain.load_pruned` loads them bit-identically.

Real parts: tiny models from the zoo's configs, shrunk by the engine, a tokenizer trained on Multi30k, transformers'
own loaders in a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

import prunetrain as pt
from prunetrain.zoo import random_mask, tiny_inputs, tiny_model

PRUNETRAIN_ONLY = ("this model was pruned by prunetrain and has a different number of attention heads per layer, in "
                   "attention code only prunetrain has; load it with prunetrain.load_pruned(path)")


def _shrunk(family: str):
    model = tiny_model(family)
    pt.shrink(model, random_mask(model, seed=3, soft=True, empty_site=0))
    return model


def _without_prunetrain(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run `code` in a Python that sees transformers' site-packages but not prunetrain (`-I -S`), stdin not a
    terminal, its own module cache."""
    site_packages = str(Path(transformers.__file__).parents[1])
    prelude = f"import sys; sys.path.append({site_packages!r})\n"
    return subprocess.run([sys.executable, "-I", "-S", "-c", prelude + code], cwd=tmp_path, capture_output=True,
                          check=False, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("family", ["phi3", "olmo2"])
def test_trust_remote_code_on_a_prunetrain_only_directory_names_load_pruned(family, tmp_path):
    model = _shrunk(family)
    path = pt.save_pruned(model, tmp_path / family)
    assert "PrunedModelMixin" not in (path / "modeling_prunetrain.py").read_text()  # no model code: a refusal
    code = f"""
import transformers
try:
    import prunetrain
    print("PRUNETRAIN IMPORTABLE")
except ImportError:
    pass
for auto in ("AutoConfig", "AutoModelForCausalLM", "AutoModel"):
    try:
        getattr(transformers, auto).from_pretrained({str(path)!r}, trust_remote_code=True)
        print(auto, "LOADED")
    except Exception as err:
        print(auto, type(err).__name__, repr(str(err)))
"""
    run = _without_prunetrain(code, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "PRUNETRAIN IMPORTABLE" not in run.stdout
    lines = run.stdout.strip().splitlines()
    assert lines == [f"{auto} ValueError {PRUNETRAIN_ONLY!r}" for auto in ("AutoConfig", "AutoModelForCausalLM",
                                                                           "AutoModel")], run.stdout
    loaded = pt.load_pruned(path, attn_implementation="eager")
    inputs = {k: v for k, v in tiny_inputs(family).items() if k != "labels"}
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)
    # the directory's other readers are unchanged: the plain class is refused by the guard, load_pruned's config
    # reading drops the auto_map
    from prunetrain.engine.persist import read_config

    assert "auto_map" not in read_config(path).to_dict()


@pytest.fixture(scope="module")
def translation_dir(m30k_tokenizer, tmp_path_factory):
    """A shrunk Marian saved with its tokenizer (`save_translation_model`: save_pruned + the tokenizer)."""
    from transformers import MarianMTModel

    from prunetrain.mt.evaluation.translation import save_translation_model
    from prunetrain.mt.text.data import marian_config

    torch.manual_seed(0)
    model = MarianMTModel(marian_config(m30k_tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4,
                                        max_position_embeddings=64, dropout=0.0)).eval()
    pt.shrink(model, random_mask(model, seed=1, empty_site=None))
    return save_translation_model(model, m30k_tokenizer, tmp_path_factory.mktemp("marian") / "pruned")


def test_no_auto_map_points_a_tokenizer_at_remote_code(translation_dir):
    config = json.loads((translation_dir / "config.json").read_text())
    assert "AutoConfig" in config["auto_map"]  # the model loads with trust_remote_code=True
    assert not any("Tokenizer" in key for key in config["auto_map"]), config["auto_map"]
    tokenizer_config = json.loads((translation_dir / "tokenizer_config.json").read_text())
    assert "auto_map" not in tokenizer_config and "modeling_prunetrain" not in json.dumps(tokenizer_config)


def test_the_tokenizer_loads_without_remote_code_and_without_a_prompt(translation_dir, m30k_tokenizer, tmp_path):
    sentences = ["Ein Mann fährt mit dem Fahrrad durch die Stadt.", "Zwei Hunde spielen im Schnee."]
    code = f"""
import json, transformers
tokenizer = transformers.AutoTokenizer.from_pretrained({str(translation_dir)!r}, trust_remote_code=False)
print("IDS " + json.dumps(tokenizer({sentences!r})["input_ids"]))
"""
    run = _without_prunetrain(code, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    output = run.stdout + run.stderr
    assert "custom code" not in output and "[y/N]" not in output, output  # no prompt, no refusal
    ids = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("IDS "))[4:])
    assert ids == m30k_tokenizer(sentences)["input_ids"]
