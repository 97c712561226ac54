"""Training compute that does not drift: the exact matmul FLOPs of every training step from the real batch shapes
(`prunetrain.bench.step_flops`), counted by the training clock over real Trainer runs (shrinks, gradient accumulation,
budgets, FLOP points), checked against torch's `FlopCounterMode` and an independent closed form."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from transformers import MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

import prunetrain as pt
from prunetrain.bench.step_flops import BatchShape, StepFlopModel, batch_shape, measured_step_flops
from prunetrain.mt.text.data import build_dataset, collate_batches, make_collator, marian_config, read_parallel, \
    train_tokenizer
from prunetrain.training.callbacks import HeadPruningCallback
from prunetrain.training.compute import TrainingFlopMeter
from prunetrain.training.metric_points import MetricPointsCallback
from prunetrain.zoo import tiny_inputs, tiny_model


@pytest.fixture(scope="module")
def tiny_mt(multi30k_dir):
    pairs = read_parallel(multi30k_dir, "train", limit=256)
    return pairs, train_tokenizer(pairs, vocab_size=300)


def _marian(tokenizer, seed=0):
    torch.manual_seed(seed)
    return MarianMTModel(marian_config(tokenizer, d_model=32, ffn_dim=64, layers=2, heads=4, dropout=0.1,
                                       attn_implementation="eager"))


def _batches(tiny_mt, model, size=16):
    pairs, tokenizer = tiny_mt
    return collate_batches(build_dataset(pairs[:96], tokenizer, max_length=40), make_collator(tokenizer, model), size)


def closed_form_marian(model, shape: BatchShape) -> int:
    """Training-step matmul FLOPs of a Marian model written out by hand (forward × 3: the backward computes the
    gradients of both operands of every product): every projection, QKᵀ and AV per site with its own heads, the
    FFNs and the tied output layer."""
    config, (b, s, t) = model.config, (shape.batch, shape.source, shape.target)
    d, f, v = config.d_model, config.encoder_ffn_dim, config.vocab_size
    forward = 0
    for site in pt.find_heads(model):
        width = site.num_heads * site.head_dim
        query_len, key_len = {"encoder_self": (s, s), "decoder_self": (t, t), "cross": (t, s)}[site.kind]
        forward += 2 * b * query_len * d * width * 2  # q and output projections
        forward += 2 * b * key_len * d * width * 2  # k and v projections
        forward += 2 * b * site.num_heads * query_len * key_len * site.head_dim * 2  # QKᵀ and AV
    forward += config.encoder_layers * 2 * b * s * d * f * 2 + config.decoder_layers * 2 * b * t * d * f * 2
    forward += 2 * b * t * d * v
    return 3 * forward


def test_step_flops_polynomial_equals_flop_counter_and_closed_form(tiny_mt):
    model = _marian(tiny_mt[1]).train()
    batches = _batches(tiny_mt, model)
    fitted = StepFlopModel.fit(model, batches[0])
    assert all(isinstance(c, int) for c in fitted.coefficients) and fitted.two_streams
    assert fitted.coefficients[0] == 0 and fitted.to_dict()["monomials"][0] == "B"
    for batch in batches[:3]:
        shape = batch_shape(model, batch)
        assert fitted(shape) == measured_step_flops(model, batch) == closed_form_marian(model, shape)
    # a non-uniform shrunk model: other coefficients, the same agreement
    mask = pt.HeadMask.from_heads(model, {"model.encoder.layers.0.self_attn": [0, 2],
                                          "model.decoder.layers.1.encoder_attn": [1, 2, 3],
                                          "model.decoder.layers.0.self_attn": [0]})
    pt.shrink(model, mask)
    shrunk = StepFlopModel.fit(model, batches[1])
    assert shrunk.coefficients != fitted.coefficients
    for batch in batches[3:5]:
        shape = batch_shape(model, batch)
        assert shrunk(shape) == measured_step_flops(model, batch) == closed_form_marian(model, shape)
    # the gradients of the parameters are left untouched by the measurement
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("family", ["llama-gqa4", "bert", "gpt2"])
def test_step_flops_of_one_stream_models(family):
    model = tiny_model(family).train()
    fitted = StepFlopModel.fit(model, tiny_inputs(family, batch=2, length=7))
    assert not fitted.two_streams and len(fitted.coefficients) == 3
    assert fitted.coefficients[0] == 0  # no product made once per sequence: every one grows with the length
    for batch, length in ((3, 11), (5, 4)):
        inputs = tiny_inputs(family, batch=batch, length=length, seed=batch)
        assert fitted(batch_shape(model, inputs)) == measured_step_flops(model, inputs)


def test_step_flops_of_a_classifier_count_what_acts_once_per_sequence():
    """A BERT classifier's pooler and head act on one token per sequence: FLOPs ∝ B, a monomial of its own."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64,
                                                     num_hidden_layers=2, vocab_size=50, num_labels=3)).train()

    def batch(rows, length, seed):
        generator = torch.Generator().manual_seed(seed)
        return {"input_ids": torch.randint(0, 50, (rows, length), generator=generator),
                "attention_mask": torch.ones(rows, length, dtype=torch.long),
                "labels": torch.randint(0, 3, (rows,), generator=generator)}

    fitted = StepFlopModel.fit(model, batch(4, 9, 0))
    assert fitted.coefficients[0] == 3 * (2 * 32 * 32 + 2 * 32 * 3)  # pooler + classifier, forward and backward
    for rows, length in ((3, 11), (5, 4), (1, 16)):
        inputs = batch(rows, length, rows)
        assert fitted(batch_shape(model, inputs)) == measured_step_flops(model, inputs)


class _DataDependent(nn.Module):
    """A model whose matmuls depend on the token values (not on the shape alone)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))

    def forward(self, input_ids, labels=None):
        x = torch.ones(input_ids.shape[0], 4)
        for _ in range(int(input_ids.sum()) % 7 + 1):  # the token values, not the shape, set the work
            x = x @ self.weight
        return (x.sum(),)


def test_step_flops_refuse_a_model_whose_flops_depend_on_the_data():
    inputs = {"input_ids": torch.tensor([[1, 2, 3, 4, 5, 6]])}
    with pytest.raises(ValueError, match=r"^step FLOPs: _DataDependent's matmul FLOPs .* cannot be counted from "
                                         r"shapes\.$"):
        StepFlopModel.fit(_DataDependent(), inputs)
    with pytest.raises(ValueError, match=r"^batch: entry 'pixel_values' has shape \(1, 3, 4, 4\); training FLOPs"):
        batch_shape(_DataDependent(), {"pixel_values": torch.zeros(1, 3, 4, 4)})


def _trainer(tmp_path, tiny_mt, model, callbacks, *, accumulation=1, epochs=2, optimizers=(None, None),
             **settings):
    """A Seq2SeqTrainer on the tiny corpus; `settings` override its TrainingArguments."""
    pairs, tokenizer = tiny_mt
    args = Seq2SeqTrainingArguments(**{
        "output_dir": str(tmp_path), "num_train_epochs": epochs, "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": accumulation, "learning_rate": 2e-3, "save_strategy": "no", "report_to": [],
        "use_cpu": True, "logging_steps": 100, "seed": 0, "disable_tqdm": True, **settings})
    return Seq2SeqTrainer(model=model, args=args, train_dataset=build_dataset(pairs, tokenizer, max_length=24),
                          data_collator=make_collator(tokenizer, model), processing_class=tokenizer,
                          callbacks=callbacks, optimizers=optimizers)


def _pruning():
    """Masks at steps 3 and 6, the masked heads removed at step 6 (random scores: no forward passes of their own)."""
    return HeadPruningCallback(at_epochs=[], prune_steps={3: 0.25, 6: 0.5}, shrink_steps=[6], scorer="random",
                               record_end=False)


class _PerStep(TrainerCallback):
    def __init__(self, clock):
        self.clock, self.totals = clock, []

    def on_step_end(self, args, state, control, **kwargs):
        self.totals.append(self.clock.flops)


class _CountEverything(TrainerCallback):
    """FlopCounterMode around every optimizer step (from the Trainer's on_step_begin to on_step_end, registered
    first): everything the step dispatches — forwards, loss.backward(), clipping, the optimizer — is counted."""

    def __init__(self):
        self.total, self._mode = 0, None

    def on_step_begin(self, args, state, control, **kwargs):
        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        self._mode.__exit__(None, None, None)
        self.total += self._mode.get_total_flops()


@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_clock_counts_what_flop_counter_mode_counts_over_a_whole_run(tmp_path, tiny_mt, accumulation):
    """The same deterministic run twice: once with the clock, once with torch's FlopCounterMode around every step
    instead. Every training forward and backward (loss.backward, micro-batches, masks, the shrink at step 6) is what
    that counter sees; the clock's sum of per-step polynomials must equal it exactly."""
    clock = MetricPointsCallback(lambda m: 0.0, at_steps=[4])
    model = _marian(tiny_mt[1])
    per_step = _PerStep(clock)
    _trainer(tmp_path / "a", tiny_mt, model, [clock, _pruning(), per_step], accumulation=accumulation).train()
    assert pt.find_heads(model).total_heads == 12
    plain, counter = _marian(tiny_mt[1]), _CountEverything()
    _trainer(tmp_path / "b", tiny_mt, plain, [counter, _pruning()], accumulation=accumulation).train()
    for (name, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), name  # the same run: the clock leaves training bit-identical
    assert clock.flops == counter.total > 0
    assert len(clock.meter.fits) == 2 and clock.meter.fits[1]["from_step"] == 7  # refitted after the shrink
    assert sum(g["flops"] for g in clock.segments) == clock.flops
    assert clock.records[0]["flops"] == per_step.totals[3]
    assert all(b > a for a, b in zip(per_step.totals, per_step.totals[1:]))


def test_flop_budget_stops_at_the_first_step_that_reaches_it_and_flop_points_fire_there(tmp_path, tiny_mt):
    free = MetricPointsCallback(lambda m: 0.0)
    per_step = _PerStep(free)
    _trainer(tmp_path / "free", tiny_mt, _marian(tiny_mt[1]), [free, _pruning(), per_step]).train()
    totals = per_step.totals
    budget = (totals[8] + totals[9]) / 2  # reached at step 10
    points = [totals[1] - 1, float(totals[4]), totals[6] + 1]  # reached at steps 2, 5 (exactly) and 8
    clock = MetricPointsCallback(lambda m: {"value": 1.0}, at_flops=points, at_steps=[5], max_flops=budget)
    model = _marian(tiny_mt[1])
    trainer = _trainer(tmp_path / "budget", tiny_mt, model, [clock, _pruning()])
    trainer.train()
    assert trainer.state.global_step == 10 and clock.budget_reached_at_step == 10
    assert clock.flops == totals[9] >= budget > totals[8]
    assert [(r["step"], r["kind"], r["flops_target"], r["flops"]) for r in clock.records] == [
        (2, "flops", points[0], totals[1]), (5, "flops", points[1], totals[4]), (8, "flops", points[2], totals[7]),
        (10, "end", None, totals[9])]  # step 5 is also an at_steps point: evaluated once
    with pytest.raises(ValueError, match=r"^max_flops: -1 is not allowed; expected a finite number > 0\.$"):
        MetricPointsCallback(lambda m: 0.0, max_flops=-1)
    with pytest.raises(ValueError, match=r"^at_flops: \[2.0, 1.0\] is out of order"):
        MetricPointsCallback(lambda m: 0.0, at_flops=[2.0, 1.0])


def test_per_kind_amounts_rank_each_kind_within_itself(tiny_mt):
    model = _marian(tiny_mt[1])
    scores = pt.random_scores(model, seed=3)
    mask = pt.select_heads(scores, {"encoder_self": 6, "decoder_self": 2, "cross": 0.25})
    assert mask.kept_per_kind() == {"encoder_self": 2, "decoder_self": 6, "cross": 6}
    for kind in ("encoder_self", "decoder_self"):
        alone = pt.select_heads(scores, {"encoder_self": 6, "decoder_self": 2}[kind], kinds=[kind])
        for site in pt.find_heads(model):
            if site.kind == kind:
                assert torch.equal(alone[site.name], mask[site.name])
    with pytest.raises(ValueError, match=r"^amount: 'encoder' is not an attention or FFN kind"):
        pt.select_heads(scores, {"encoder": 2})
    with pytest.raises(ValueError, match=r"^amount: a per-kind amount .* leave scope='global' or 'kind'"):
        pt.select_heads(scores, {"cross": 2}, scope="layer")
    callback = HeadPruningCallback(at_epochs=[], prune_steps={2: {"encoder_self": 2, "cross": 1},
                                                              4: {"encoder_self": 4, "cross": 2}})
    assert callback is not None
    with pytest.raises(ValueError, match=r"^prune_steps\[4\]: .* is less than the .* pruned before"):
        HeadPruningCallback(at_epochs=[], prune_steps={2: {"encoder_self": 2}, 4: {"encoder_self": 1}})


def test_a_per_kind_schedule_in_a_trainer_run(tmp_path, tiny_mt):
    pruning = HeadPruningCallback(at_epochs=[], prune_steps={3: {"encoder_self": 2, "decoder_self": 1, "cross": 0},
                                                             6: {"encoder_self": 6, "decoder_self": 2, "cross": 1}},
                                  shrink_steps=[6], scorer="random", record_end=False)
    model = _marian(tiny_mt[1])
    _trainer(tmp_path, tiny_mt, model, [pruning]).train()
    assert pt.find_heads(model).heads_per_kind() == {"encoder_self": 2, "decoder_self": 6, "cross": 7}



def _gpt2_with_data_dependent_work():
    """A tiny GPT-2 whose forward is wrapped to do extra matrix products as many times as the token values say:
    its step FLOPs are not a function of the batch shape."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=10, n_positions=16))
    original, weight = model.forward, torch.eye(4)

    @functools.wraps(original)  # the Trainer reads the forward's signature
    def forward(*args, **kwargs):
        x = torch.ones(1, 4)
        for _ in range(int(kwargs["input_ids"].sum()) % 3 + 1):
            x = x @ weight
        return original(*args, **kwargs)

    model.forward = forward
    return model


def test_a_flop_budget_on_a_model_whose_flops_cannot_be_counted_is_refused_at_the_first_step(tmp_path):
    """Without the count a FLOP budget would never end the run (it would run on to its step or time limit, another
    length than asked): refused at the first step, one line naming max_flops. Without a budget the run trains, the
    count reported as unavailable."""
    from transformers import Trainer, TrainingArguments

    generator = torch.Generator().manual_seed(0)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 10, (32, 6), generator=generator)]
    args = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=3, save_strategy="no",
                report_to=[], use_cpu=True, disable_tqdm=True)
    clock = MetricPointsCallback(lambda m: 0.0, max_flops=1e9)
    trainer = Trainer(model=_gpt2_with_data_dependent_work(), args=TrainingArguments(**args), train_dataset=rows,
                      callbacks=[clock])
    with pytest.raises(ValueError, match=r"^max_flops: the training FLOPs cannot be counted \(step FLOPs: "
                                         r"GPT2LMHeadModel's .*\), so the FLOP budget and FLOP points cannot be "
                                         r"kept; give a step or time budget instead\.$"):
        trainer.train()
    assert trainer.state.global_step == 1
    free = MetricPointsCallback(lambda m: 0.0)
    trainer = Trainer(model=_gpt2_with_data_dependent_work(), args=TrainingArguments(**args), train_dataset=rows,
                      callbacks=[free])
    trainer.train()
    assert trainer.state.global_step == 3 and not free.meter.counted and "cannot be counted" in free.meter.failure
    resumed = TrainingFlopMeter()  # a checkpoint carries the reason, so a resumed budget is refused with it too
    resumed.load_state_dict(free.meter.state_dict())
    assert not resumed.counted and resumed.failure == free.meter.failure
