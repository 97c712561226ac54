"""prunetrain.bench / prunetrain.bench.flops: FLOP counts against hand-computed numbers, the result format, the A/B order
and argument errors. Tiny models only; nothing here asserts on wall-clock time."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from prunetrain import HeadMask, find_heads, save_pruned, shrink
from prunetrain.bench import (
    BenchResult,
    alternate,
    benchmark,
    compare_times,
    load_model,
    make_inputs,
    peak_memory,
    run_bench,
    summarize,
)
from prunetrain.bench.flops import count_flops
from prunetrain.zoo import tiny_config, tiny_inputs, tiny_model




# --------------------------------------------------------------------------------------------------------------
# expected matmul FLOPs, by hand from the config (2·M·N·K per matrix product)
# --------------------------------------------------------------------------------------------------------------
def bert_mlm_forward_flops(cfg, batch: int, seq: int, heads_per_layer: list[int]) -> int:
    """BertForMaskedLM forward: per layer q/k/v/o projections, QKᵀ and AV, the FFN; then the MLM head."""
    n = batch * seq  # tokens
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    d = h // cfg.num_attention_heads
    total = 0
    for heads in heads_per_layer:
        width = heads * d
        total += 3 * 2 * n * h * width  # q, k, v: [n, h] @ [h, heads*d]
        total += 2 * n * width * h  # output projection
        total += 2 * batch * heads * seq * seq * d  # QKᵀ
        total += 2 * batch * heads * seq * seq * d  # AV
        total += 2 * n * h * i + 2 * n * i * h  # FFN up and down
    total += 2 * n * h * h  # MLM head transform
    total += 2 * n * h * v  # MLM decoder (vocabulary projection)
    return total


@pytest.fixture(params=["eager", "sdpa"])
def attn(request):
    return request.param


def test_flops_tiny_bert_match_hand_count(attn):
    model = tiny_model("bert", attn_implementation=attn)
    inputs = tiny_inputs("bert", batch=2, length=7)
    inputs.pop("labels")
    cfg = model.config
    with torch.no_grad():
        counted = count_flops(lambda: model(**inputs)).total
    assert counted == bert_mlm_forward_flops(cfg, 2, 7, [4, 4])
    # numbers spelled out once, so a wrong formula on both sides cannot hide: 2 layers of width 32, 4 heads of 8,
    # FFN 64, vocab 96, 14 tokens
    assert counted == 2 * (4 * 2 * 14 * 32 * 32 + 2 * 2 * 2 * 4 * 7 * 7 * 8 + 2 * 2 * 14 * 32 * 64) \
        + 2 * 14 * 32 * 32 + 2 * 14 * 32 * 96


def test_flops_tiny_shrunk_bert_match_hand_count(attn):
    model = tiny_model("bert", attn_implementation=attn)
    inputs = tiny_inputs("bert", batch=3, length=9)
    inputs.pop("labels")
    layout = find_heads(model)
    # layer 0 keeps 1 head, layer 1 keeps 3
    shrink(model, HeadMask.from_heads(model, {layout.names[0]: [0, 2, 3], layout.names[1]: [1]}))
    assert [s.num_heads for s in find_heads(model)] == [1, 3]
    with torch.no_grad():
        counted = count_flops(lambda: model(**inputs)).total
    assert counted == bert_mlm_forward_flops(model.config, 3, 9, [1, 3])


def test_training_step_flops_are_three_forwards(attn):
    """Backward of every matmul is two matmuls of the same size (grad input, grad weight / the other operand)."""
    model = tiny_model("bert", attn_implementation=attn).train()
    inputs = tiny_inputs("bert", batch=2, length=7)
    inputs.pop("labels")

    def step():
        model(**inputs).logits.sum().backward()

    assert count_flops(step).total == 3 * bert_mlm_forward_flops(model.config, 2, 7, [4, 4])


def test_eager_and_sdpa_count_the_same():
    counts = []
    for attn in ("eager", "sdpa"):
        model = tiny_model("marian", attn_implementation=attn)
        inputs = make_inputs(model, batch=2, seq_len=6, tgt_len=5)
        with torch.no_grad():
            counts.append(count_flops(lambda: model(**inputs)).to_dict())
    assert counts[0]["total"] == counts[1]["total"] > 0


# --------------------------------------------------------------------------------------------------------------
# benchmark()
# --------------------------------------------------------------------------------------------------------------
def _pruned_pair(family: str = "bert", attn: str = "eager"):
    a = tiny_model(family, attn_implementation=attn)
    b = copy.deepcopy(a)
    layout = find_heads(b)
    shrink(b, HeadMask.from_heads(b, {s.name: [0, 1] for s in layout}))  # 2 of 4 heads everywhere
    return a, b


@pytest.fixture(scope="module")
def bert_result():
    a, b = _pruned_pair("bert")
    return benchmark(a, b, batch_sizes=(1, 2), seq_lens=(8,), warmup=1, repeats=4)


def test_benchmark_flop_ideal_speedup_after_shrink(bert_result):
    assert len(bert_result.rows) == 2
    for row in bert_result.rows:
        assert row["flops_a"] > row["flops_b"] > 0
        assert row["flop_ideal_speedup"] == pytest.approx(row["flops_a"] / row["flops_b"])
        assert row["flop_ideal_speedup"] > 1
        assert row["params_a"] > row["params_b"]
        assert (row["heads_a"], row["heads_b"]) == (8, 4)
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["flop_ideal_speedup"])
        assert len(row["a"]["times"]) == len(row["b"]["times"]) == 4
        assert row["memory_a"]["peak_bytes"] >= row["memory_a"]["static_bytes"] > row["memory_b"]["static_bytes"]
    meta = bert_result.meta
    assert meta["threads"] == torch.get_num_threads()
    assert meta["dtype"] == "fp32" and meta["repeats"] == 4 and meta["warmup"] == 1 and meta["device"] == "cpu"


def test_benchmark_ab_order_alternates_and_is_recorded(bert_result):
    row = bert_result.rows[0]
    assert row["order"] == [["original", "pruned"], ["pruned", "original"]] * 2
    assert row["order_string"] == "AB BA AB BA"
    assert row["warmup_order"] == [["original", "pruned"]]


def test_alternate_call_sequence_is_what_is_recorded():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    alt = alternate(fns, warmup=1, repeats=3, order="abba")
    assert alt.warmup_order == [["a", "b", "c"]]
    assert alt.order == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert calls == [x for r in alt.warmup_order + alt.order for x in r]
    assert all(len(alt.times[k]) == 3 for k in fns)
    calls.clear()
    alt = alternate({k: fns[k] for k in ("a", "b")}, warmup=0, repeats=3, order="abab")
    assert alt.order == [["a", "b"]] * 3 and calls == ["a", "b"] * 3


def test_json_round_trip(bert_result, tmp_path):
    text = bert_result.to_json()
    again = BenchResult.from_json(text)
    assert again.to_dict() == json.loads(text) == bert_result.to_dict()
    path = tmp_path / "r.json"
    bert_result.to_json(path)
    assert BenchResult.from_json(path).to_dict() == bert_result.to_dict()
    with pytest.raises(ValueError, match="format"):
        BenchResult.from_dict({"format": "something else"})


def test_table_contains_the_rows(bert_result):
    table = bert_result.table()
    lines = table.splitlines()
    assert lines[0].startswith("| variant | task |") and lines[1].startswith("|---|")
    body = [line for line in lines[2:] if line.startswith("| pruned |")]
    assert len(body) == len(bert_result.rows) == 2
    assert "| forward | 1×8 |" in body[0] and "| forward | 2×8 |" in body[1]
    for row, line in zip(bert_result.rows, body):
        assert f"{row['speedup']:.3f}" in line and f"{row['flop_ideal_speedup']:.3f}" in line
        assert "8 → 4" in line
    assert f"{torch.get_num_threads()} threads" in table


def test_row_lookup(bert_result):
    assert bert_result.row("pruned", "forward", batch=2)["batch"] == 2
    with pytest.raises(ValueError, match="2 rows match"):
        bert_result.row("pruned", "forward")


def test_generate_greedy_and_beam_fixed_length_and_variants():
    a, b = _pruned_pair("marian")
    c = copy.deepcopy(b)
    shrink(c, HeadMask.from_heads(c, {s.name: [0] for s in find_heads(c)}))  # 1 of 4 heads left
    result = benchmark(a, {"half": b, "quarter": c}, batch_sizes=(2,), seq_lens=(5,), generate=("greedy", "beam4"),
                       new_tokens=3, warmup=1, repeats=2, memory=False)
    assert [(r["variant"], r["task"]) for r in result.rows] == [
        ("half", "forward"), ("quarter", "forward"), ("half", "greedy"), ("quarter", "greedy"),
        ("half", "beam4"), ("quarter", "beam4")]
    for r in result.rows:
        assert r["flop_ideal_speedup"] > 1
        assert r["order"] == [["original", "half", "quarter"], ["half", "quarter", "original"]]
        if r["task"] != "forward":
            assert r["new_tokens"] == 3 and r["tokens_per_call"] == 2 * 3
            assert r["a"]["tokens_per_s"] == pytest.approx(6 / r["a"]["median"])
    assert result.row("quarter", "greedy")["flops_b"] < result.row("half", "greedy")["flops_b"]
    assert result.row("half", "beam4")["flops_a"] > result.row("half", "greedy")["flops_a"]


def test_bf16_autocast_runs():
    a, b = _pruned_pair("bert")
    result = benchmark(a, b, batch_sizes=(2,), seq_lens=(6,), dtype="bf16", warmup=0, repeats=2, memory=False)
    assert result.meta["dtype"] == "bf16" and result.rows[0]["flop_ideal_speedup"] > 1


@pytest.mark.parametrize("kwargs, argument, value, allowed", [
    (dict(batch_sizes=(1, 0)), "batch_sizes", "0", ">= 1"),
    (dict(batch_sizes=()), "batch_sizes", "()", ">= 1"),
    (dict(seq_lens=(-3,)), "seq_lens", "-3", ">= 1"),
    (dict(dtype="fp16"), "dtype", "'fp16'", "'fp32', 'bf16'"),
    (dict(generate="beam"), "generate", "'beam'", "'greedy', 'beam4'"),
    (dict(generate=("greedy", "sample")), "generate", "'sample'", "'greedy', 'beam4'"),
    (dict(order="random"), "order", "'random'", "'abba', 'abab'"),
    (dict(repeats=0), "repeats", "0", ">= 1"),
    (dict(warmup=-1), "warmup", "-1", ">= 0"),
])
def test_bad_arguments_name_argument_value_and_allowed(kwargs, argument, value, allowed):
    a, b = _pruned_pair("bert")
    with pytest.raises(ValueError) as err:
        benchmark(a, b, **kwargs)
    message = str(err.value)
    assert message.startswith(f"{argument}:") and value in message and allowed in message


def test_generate_on_a_model_that_cannot_generate():
    import transformers as tf

    cfg = tiny_config("bert")
    a = tf.BertModel(cfg)
    with pytest.raises(ValueError, match="generate: 'greedy'.*cannot"):
        benchmark(a, copy.deepcopy(a), generate="greedy", batch_sizes=(1,), seq_lens=(4,))


def test_mismatched_models_are_refused():
    with pytest.raises(ValueError, match="model_type"):
        benchmark(tiny_model("bert"), tiny_model("gpt2"), batch_sizes=(1,), seq_lens=(4,))


def test_statistics():
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert (s["median"], s["q1"], s["q3"], s["iqr"], s["n"]) == (2.5, 1.75, 3.25, 1.5, 4)
    c = compare_times([2.0, 4.0, 3.0], [1.0, 2.0, 2.0])
    assert c["speedup"] == pytest.approx(3.0 / 2.0)
    assert c["speedup_pair_median"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="times_a, times_b"):
        compare_times([1.0], [1.0, 2.0])


def test_peak_memory_cpu_estimate_sees_activations():
    model = tiny_model("bert")
    inputs = make_inputs(model, batch=4, seq_len=16)
    with torch.no_grad():
        mem = peak_memory(lambda: model(**inputs), model, "cpu")
    logits_bytes = 4 * 16 * model.config.vocab_size * 4
    assert mem["activation_bytes"] >= logits_bytes
    assert mem["peak_bytes"] == mem["static_bytes"] + mem["activation_bytes"]
    assert "estimate" in mem["method"]


def test_run_bench_from_saved_directories(tmp_path):
    a, b = _pruned_pair("bert")
    save_pruned(a, tmp_path / "a")
    save_pruned(b, tmp_path / "b")
    a.save_pretrained(tmp_path / "hf")  # a plain Hugging Face directory works too
    assert find_heads(load_model(tmp_path / "b")).total_heads == 4
    assert find_heads(load_model(tmp_path / "hf", attn_implementation="eager")).total_heads == 8
    out = tmp_path / "res.json"
    result = run_bench(tmp_path / "hf", tmp_path / "b", attn_implementation="sdpa", batch_sizes=(2,), seq_lens=(6,),
                       warmup=0, repeats=2, memory=False, json_path=out)
    assert result.models["A"]["attn_implementation"] == "sdpa"
    assert result.rows[0]["variant"] == "B" and result.rows[0]["flop_ideal_speedup"] > 1
    assert BenchResult.from_json(out).to_dict() == result.to_dict()
    with pytest.raises(ValueError, match="path:"):
        run_bench(tmp_path / "missing", tmp_path / "b")


def test_options_live_in_a_config_dataclass():
    from prunetrain.bench import BenchConfig

    a, b = _pruned_pair("bert")
    config = BenchConfig(batch_sizes=2, seq_lens=(5,), warmup=0, repeats=2, flops=False, memory=False)
    assert config.batch_sizes == (2,) and config.tasks == ["forward"]
    result = benchmark(a, b, config, repeats=3)  # a keyword overrides the config's field
    assert result.meta["repeats"] == 3 and result.meta["batch_sizes"] == [2] and len(result.rows) == 1
    with pytest.raises(ValueError, match="repeat: not an option of benchmark; the options are batch_sizes"):
        benchmark(a, b, config, repeat=3)
    with pytest.raises(ValueError, match="warmup: -1 is not allowed"):
        BenchConfig(warmup=-1)
