"""PEFT / LoRA: the head engine on a real `peft` model works exactly as on the model it wraps.

Tiny models built from configs, wrapped with peft's own `get_peft_model` (LoRA, DoRA, LoHa, prefix tuning): sites
are named as in the base model; masked == shrunk with the adapters sliced (q/k/v `lora_B` rows, output-projection
`lora_A` columns, their optimizer state); masks survive `merge_and_unload()`; an unmerged or merged model saves as a
pruned directory of the base architecture that `load_pruned` and `from_pretrained(trust_remote_code=True)` load;
under the HF Trainer, mask and shrink modes train the adapters on, resume from adapter-only checkpoints, and
Hard-Concrete gates finalise into a shrunk LoRA model; what cannot be exact is refused in one line.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from peft import LoraConfig, LoHaConfig, PrefixTuningConfig, get_peft_model  # a test dependency: never skipped
from transformers import TrainerCallback

import prunetrain as pt
from prunetrain.zoo import random_mask, tiny_inputs, tiny_model

TARGETS = {"marian": ["q_proj", "k_proj", "v_proj", "out_proj"], "gpt2": ["c_attn", "c_proj"],
           "llama": ["q_proj", "k_proj", "v_proj", "o_proj"], "bert": ["query", "key", "value", "dense"]}
TOL = 1e-5


def _lora(family: str, **options) -> torch.nn.Module:
    """A tiny zoo model of `family` with random LoRA adapters (B != 0, so the adapters change the output)."""
    torch.manual_seed(0)
    kwargs = dict(r=2, target_modules=TARGETS[family], init_lora_weights=False, lora_dropout=0.0,
                  fan_in_fan_out=family == "gpt2", **options)
    return get_peft_model(tiny_model(family), LoraConfig(**kwargs))


def _logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def _mask(model) -> pt.HeadMask:
    return random_mask(model, seed=1, soft=True, empty_site=0)


def test_sites_are_named_as_in_the_base_model():
    model = tiny_model("marian")
    wrapped = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=TARGETS["marian"]))
    assert pt.find_heads(wrapped).to_dict() == pt.find_heads(model).to_dict()
    assert not any(name.startswith("base_model") for name in pt.find_heads(wrapped).names)


@pytest.mark.parametrize("family", sorted(TARGETS))
def test_masked_equals_shrunk_with_the_adapters_sliced(family):
    model = _lora(family, lora_bias=family == "marian")
    inputs = tiny_inputs(family)
    mask = _mask(model)
    unmasked = _logits(model, inputs)
    with mask.applied(model):
        masked = _logits(model, inputs)
    assert (masked - unmasked).abs().max() > 1e-3  # the mask matters, adapters included
    pt.shrink(model, mask)
    assert (_logits(model, inputs) - masked).abs().max() <= TOL
    for site in pt.engine.heads.attention_sites(model):
        layer = site.out_proj
        width = site.info.num_heads * site.info.head_dim
        assert layer.lora_A["default"].weight.shape[1] == width == layer.in_features  # output projection: columns
        if family != "gpt2":
            assert layer.base_layer.in_features == width
    merged = model.merge_and_unload()
    assert (_logits(merged, inputs) - masked).abs().max() <= TOL


FFN_TARGETS = {"marian": ["fc1", "fc2", "q_proj", "out_proj"], "llama": ["gate_proj", "up_proj", "down_proj"],
               "gpt2": ["c_fc", "c_proj"]}


@pytest.mark.parametrize("family", sorted(FFN_TARGETS))
def test_lora_on_ffn_linears_is_sliced_with_the_neurons(family):
    """LoRA adapters on the FFN's projections: the up/gate adapters' `lora_B` rows and the down projection's `lora_A`
    columns go with the neurons, masked == shrunk, and the merged model equals it."""
    torch.manual_seed(0)
    model = get_peft_model(tiny_model(family), LoraConfig(r=2, target_modules=FFN_TARGETS[family],
                                                          init_lora_weights=False, lora_dropout=0.0,
                                                          fan_in_fan_out=family == "gpt2"))
    inputs = tiny_inputs(family)
    mask = random_mask(pt.find_sites(model), seed=2, soft=True, empty_site=None)
    unmasked = _logits(model, inputs)
    with mask.applied(model):
        masked = _logits(model, inputs)
    assert (masked - unmasked).abs().max() > 1e-3
    pt.shrink(model, mask)
    assert (_logits(model, inputs) - masked).abs().max() <= TOL
    for site in pt.engine.heads.live_sites(model, ("neurons",)):
        assert site.out_proj.lora_A["default"].weight.shape[1] == site.info.num_heads == mask.kept(site.info.name).__len__()
    assert (_logits(model.merge_and_unload(), inputs) - masked).abs().max() <= TOL


def test_shrink_slices_the_adapters_optimizer_state_and_they_keep_learning():
    model = _lora("marian")
    inputs = tiny_inputs("marian")
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    model(**inputs).loss.backward()
    optimizer.step()
    site = "model.encoder.layers.1.self_attn"
    attention = model.get_base_model().model.encoder.layers[1].self_attn
    q_b, out_a = attention.q_proj.lora_B["default"].weight, attention.out_proj.lora_A["default"].weight
    before = {"q_b": optimizer.state[q_b]["exp_avg"].clone(), "out_a": optimizer.state[out_a]["exp_avg"].clone()}
    pt.shrink(model, pt.HeadMask.from_heads(model, {site: [1, 2]}), optimizer=optimizer)
    d = attention.head_dim
    rows = torch.cat([torch.arange(0, d), torch.arange(3 * d, 4 * d)])  # heads 0 and 3 kept
    assert torch.equal(optimizer.state[q_b]["exp_avg"], before["q_b"][rows])
    assert torch.equal(optimizer.state[out_a]["exp_avg"], before["out_a"][:, rows])
    assert all(state["exp_avg"].shape == param.shape for param, state in optimizer.state.items())
    snapshot = q_b.detach().clone()
    optimizer.zero_grad()
    model(**inputs).loss.backward()
    optimizer.step()
    assert q_b.grad is not None and not torch.equal(q_b.detach(), snapshot)


def test_dora_on_queries_is_exact_and_on_an_output_projection_refused():
    torch.manual_seed(0)
    base = tiny_model("marian")
    inputs = tiny_inputs("marian")
    rows = get_peft_model(copy.deepcopy(base), LoraConfig(r=2, target_modules=["q_proj", "k_proj", "v_proj"],
                                                          use_dora=True, init_lora_weights=False))
    mask = _mask(rows)
    with mask.applied(rows):
        masked = _logits(rows, inputs)
    pt.shrink(rows, mask)
    assert (_logits(rows, inputs) - masked).abs().max() <= TOL
    columns = get_peft_model(copy.deepcopy(base), LoraConfig(r=2, target_modules=TARGETS["marian"], use_dora=True,
                                                             init_lora_weights=False))
    weights = {k: v.clone() for k, v in columns.state_dict().items()}
    with pytest.raises(ValueError, match=r"^model: shrink of site '[^']+' is refused: its output projection has a DoRA "
                                         r"adapter 'default' \(use_dora=True\).*merge_and_unload\(\) first") as err:
        pt.shrink(columns, _mask(columns))
    assert "\n" not in str(err.value)
    assert all(torch.equal(v, weights[k]) for k, v in columns.state_dict().items())  # refused before any edit


def test_other_peft_methods_are_refused_by_name():
    base = tiny_model("marian")
    loha = get_peft_model(copy.deepcopy(base), LoHaConfig(r=2, target_modules=["q_proj", "out_proj"]))
    with pytest.raises(ValueError, match=r"wrapped by peft's loha layer Linear, which prunetrain cannot slice by head"):
        pt.shrink(loha, _mask(loha))
    prefix = get_peft_model(copy.deepcopy(base), PrefixTuningConfig(num_virtual_tokens=3, task_type="SEQ_2_SEQ_LM"))
    with pytest.raises(ValueError, match=r"^model: this PeftModel uses peft's PREFIX_TUNING \(prompt learning\)"):
        pt.shrink(prefix, _mask(prefix))
    with pytest.raises(ValueError, match=r"is refused: the model is wrapped by a PeftModel with peft's PREFIX_TUNING"):
        pt.shrink(prefix.get_base_model(), _mask(prefix))  # reached without the wrapper (a callback's unwrapped model)


@pytest.mark.parametrize("ending", ["merge_and_unload", "unload", "merge_adapter"])
def test_masks_survive_merging(ending):
    model = _lora("llama")
    inputs = tiny_inputs("llama")
    mask = _mask(model)
    mask.attach(model)
    masked = _logits(model, inputs)
    if ending == "unload":  # the adapters dropped: the base model, still masked
        reference = tiny_model("llama")
        with mask.copy().applied(reference):
            masked = _logits(reference, inputs)
    result = model.merge_adapter() or model if ending == "merge_adapter" else getattr(model, ending)()
    assert (_logits(result, inputs) - masked).abs().max() <= TOL
    mask.detach()
    assert (_logits(result, inputs) - masked).abs().max() > 1e-3  # detaching still removes every hook


def test_a_mask_attached_before_wrapping_is_refused_then_moved_onto_the_adapter():
    inputs = tiny_inputs("marian")
    model = tiny_model("marian")
    mask = _mask(model)
    mask.attach(model)
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=TARGETS["marian"], init_lora_weights=False))
    with pytest.raises(RuntimeError, match=r"^model: the output projection 'out_proj' of MarianAttention was replaced "
                                           r"\(e.g. wrapped by peft's get_peft_model\)"):
        wrapped(**inputs)
    assert pt.attached_masks(wrapped) == [mask]  # moves its hooks onto the LoRA layers
    moved = _logits(wrapped, inputs)
    mask.detach()
    with mask.applied(wrapped):
        assert torch.equal(moved, _logits(wrapped, inputs))


@pytest.mark.parametrize("shrunk", [False, True])
def test_unmerged_and_merged_models_save_as_pruned_directories_of_the_base_architecture(shrunk, tmp_path):
    from safetensors.torch import load_file

    model = _lora("bert")
    inputs = tiny_inputs("bert")
    mask = _mask(model)
    mask.attach(model)
    masked = _logits(model, inputs)
    if shrunk:
        pt.shrink(model, mask)
    pt.save_pruned(model, tmp_path / "unmerged")
    assert model.get_base_model().bert.encoder.layer[0].attention.output.dense.merged is False  # left unmerged
    model.merge_and_unload().save_pretrained(tmp_path / "merged")
    for name in ("unmerged", "merged"):
        path = tmp_path / name
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"] == ["BertForMaskedLM"]  # the base class, not peft's
        layout = json.loads((path / "prunetrain_layout.json").read_text())
        assert [s["name"] for s in layout["sites"]] == [f"bert.encoder.layer.{i}.attention" for i in (0, 1)]
        assert (_logits(pt.load_pruned(path), inputs) - masked).abs().max() <= TOL
        remote = transformers.AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=True)
        assert (_logits(remote.eval(), inputs) - masked).abs().max() <= TOL
    ours, theirs = (load_file(tmp_path / n / "model.safetensors") for n in ("unmerged", "merged"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


# ---------------------------------------------------------------------------------------------------------------------
# under the HF Trainer
# ---------------------------------------------------------------------------------------------------------------------
STEPS = 6


def _classifier(**options):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, num_labels=2)
    return get_peft_model(transformers.BertForSequenceClassification(config),
                          LoraConfig(r=4, target_modules=TARGETS["bert"], task_type="SEQ_CLS", **options))


def _data():
    generator = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(1, 64, (10,), generator=generator), "labels": i % 2} for i in range(64)]
    return data, [transformers.default_data_collator(data[i:i + 8]) for i in (0, 8)]


class _Adapters(TrainerCallback):
    """The trainable (adapter) weights at every step end, registered after the pruning callback."""

    def __init__(self):
        self.at: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.at[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _train(out: Path, mode: str, resume: str | None = None, restore: bool = True, callbacks=None):
    model = _classifier()
    data, batches = _data()
    schedule = pt.Schedule(at_epochs=[], prune_steps={3: 0.5}, shrink_steps=[3] if mode == "shrink" else [])
    pruning = pt.HeadPruningCallback(schedule, importance=pt.Importance(batches=batches),
                                     output=pt.Output(tensorboard=False))
    if resume is not None and restore:
        pt.restore_layout(model, resume)
    args = transformers.TrainingArguments(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=8,
                                          learning_rate=1e-2, save_strategy="steps", save_steps=2, report_to=[],
                                          use_cpu=True, logging_steps=100, seed=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   data_collator=transformers.default_data_collator,
                                   callbacks=[pruning, *(callbacks or [])])
    trainer.train(resume_from_checkpoint=resume)
    return model.eval(), pruning, trainer, batches[0]


@pytest.mark.parametrize("mode", ["mask", "shrink"])
def test_trainer_prunes_a_lora_model_and_the_merged_model_equals_it(mode, tmp_path):
    adapters = _Adapters()
    model, pruning, trainer, batch = _train(tmp_path / "run", mode, callbacks=[adapters])
    kinds = [(e["step"], e["mode"], e["heads_after"]) for e in pruning.events]
    assert kinds == ([(3, "mask", 4), (3, "shrink", 4)] if mode == "shrink" else [(3, "mask", 4)])
    changed = [n for n in adapters.at[4] if not torch.equal(adapters.at[4][n], adapters.at[STEPS][n])]
    assert any(".lora_B." in n for n in changed) and any(".lora_A." in n for n in changed)  # adapters still learn
    state = trainer.optimizer.state
    assert all(s["exp_avg"].shape == p.shape for p, s in state.items())
    if mode == "shrink":
        assert pt.find_heads(model).total_heads == 4
        assert {n for n, p in model.named_parameters() if p.requires_grad and ".lora_B." in n and
                p.shape[0] == 16} != set()  # q/k/v adapters of a site with 2 of 4 heads left
    checkpoint = tmp_path / "run" / f"checkpoint-{STEPS}"
    assert (checkpoint / "adapter_model.safetensors").is_file() and (checkpoint / "prunetrain_peft.json").is_file()
    trained = _logits(model, batch)
    merged = model.merge_and_unload()
    assert (_logits(merged, batch) - trained).abs().max() <= TOL
    pt.save_pruned(merged, tmp_path / "final")
    assert (_logits(pt.load_pruned(tmp_path / "final"), batch) - trained).abs().max() <= TOL


@pytest.mark.parametrize("mode", ["mask", "shrink"])
def test_a_pruned_lora_run_resumes_from_its_adapter_checkpoint(mode, tmp_path):
    model, _, _, batch = _train(tmp_path / "a", mode)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / f"checkpoint-{STEPS}")
    checkpoint = pt.last_complete_checkpoint(tmp_path / "b")
    assert checkpoint == str(tmp_path / "b" / "checkpoint-4")  # after the pruning at step 3
    resumed, _, _, _ = _train(tmp_path / "b", mode, resume=checkpoint)
    ours, theirs = model.state_dict(), resumed.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert torch.equal(_logits(model, batch), _logits(resumed, batch))  # masks included
    if mode == "mask":
        return
    with pytest.raises(ValueError, match=r"^model: the weights being loaded have fewer attention heads than the "
                                         r"model .* prunetrain.restore_layout\(model, checkpoint\)") as err:
        _train(tmp_path / "c", "shrink", resume=checkpoint, restore=False)
    assert "\n" not in str(err.value)
    (Path(checkpoint) / "prunetrain_peft.json").unlink()
    with pytest.raises(ValueError, match=r"^checkpoint: '.*checkpoint-4' holds peft adapters only and no "
                                         r"prunetrain_peft.json"):
        pt.restore_layout(_classifier(), checkpoint)


def test_a_shrink_the_adapters_cannot_follow_is_refused_when_the_trainer_is_built(tmp_path):
    model = _classifier(use_dora=True)
    data, batches = _data()
    pruning = pt.HeadPruningCallback(pt.Schedule(at_epochs=[], prune_steps={3: 0.5}, shrink_steps=[3]),
                                     importance=pt.Importance(batches=batches), output=pt.Output(tensorboard=False))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=4, report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match=r"^mode: HeadPruningCallback would shrink this PEFT model, but site "
                                         r"'bert.encoder.layer.0.attention' cannot be shrunk: its output projection "
                                         r"has a DoRA adapter") as err:
        transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[pruning])
    assert "\n" not in str(err.value)


class _EvalBeforeFinalize(TrainerCallback):
    """Logits of the gated model as it evaluates, taken at train end before the gates callback finalises."""

    def __init__(self, batch):
        self.batch, self.logits = batch, None

    def on_train_end(self, args, state, control, model=None, **kwargs):
        model.eval()
        self.logits = _logits(model, self.batch)


def test_hard_concrete_gates_on_a_lora_model_finalise_into_a_shrunk_model(tmp_path):
    model = _classifier()
    data, batches = _data()
    probe = _EvalBeforeFinalize(batches[0])
    gates = pt.HardConcreteCallback(lam=0.01, finalize="shrink", training=pt.GateTraining(gate_lr=1e-6),
                                    output=pt.Output(tensorboard=False))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=8,
                                          save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   data_collator=transformers.default_data_collator, callbacks=[probe, gates])
    with torch.no_grad():  # close heads 1 and 2 of the first layer
        gates.gates.site_log_alpha("bert.encoder.layer.0.attention")[1:3] = -10.0
    trainer.train()
    assert pt.find_heads(model)["bert.encoder.layer.0.attention"].heads == (0, 3)
    assert (_logits(model.eval(), batches[0]) - probe.logits).abs().max() <= TOL
    assert (_logits(model.merge_and_unload(), batches[0]) - probe.logits).abs().max() <= TOL


def test_exporting_an_unmerged_peft_model_says_to_merge_first(tmp_path):
    from prunetrain.export import export

    model = _lora("llama")
    with pytest.raises(ValueError, match=r"^source: the model holds peft adapter layers; export "
                                         r"model.merge_and_unload\(\)"):
        export(model, tmp_path / "out", "remote-code")
    assert not (tmp_path / "out").exists()
