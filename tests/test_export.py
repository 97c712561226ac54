"""Exports of pruned models for runtimes without prunetrain: remote code, uniform, padded, ONNX (issue 15)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

import prunetrain as pt
from prunetrain.export.formats import check_formats, export
from prunetrain.zoo import ARCHITECTURES, random_mask, tiny_inputs, tiny_model

FAMILIES = ("bert", "marian", "t5", "gpt2", "llama")
AUTO = {"masked-lm": "AutoModelForMaskedLM", "seq2seq": "AutoModelForSeq2SeqLM", "causal-lm": "AutoModelForCausalLM"}


def shrunk(family, seed=3, empty_site=0):
    """A tiny model shrunk non-uniformly: soft keep values folded in, one site with no heads (the first, so the
    head-less KV-cache layer is exercised in decoders)."""
    model = tiny_model(family)
    pt.shrink(model, random_mask(model, seed=seed, soft=True, empty_site=empty_site))
    return model


def model_inputs(family):
    inputs = {k: v for k, v in tiny_inputs(family).items() if k != "labels"}
    if ARCHITECTURES[family].task == "seq2seq":
        inputs["decoder_input_ids"] = tiny_inputs(family)["labels"]
    return inputs


def generate_kwargs(family):
    inputs = tiny_inputs(family)
    return dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=5,
                use_cache=True, do_sample=False, pad_token_id=1)


# ---------------------------------------------------------------------------------------------------------------------
# remote code: loads where prunetrain is not importable, bit-identical
# ---------------------------------------------------------------------------------------------------------------------
_CHILD = r"""
import json, sys
sys.path.append(sys.argv.pop(1))  # site-packages without its .pth files: torch and transformers, not prunetrain
import torch, transformers as tf
out = {}
try:
    import prunetrain  # noqa: F401
    out["prunetrain_importable"] = True
except ImportError:
    out["prunetrain_importable"] = False
root = sys.argv[1]
expected = torch.load(root + "/expected.pt", weights_only=True)  # tensors, dicts and plain values only
for family, case in expected.items():
    path = f"{root}/{family}"
    model = getattr(tf, case["auto"]).from_pretrained(path, trust_remote_code=True, attn_implementation="eager")
    res = {"class": type(model).__name__, "module": type(model).__module__}
    with torch.no_grad():
        res["logits_equal"] = torch.equal(model(**case["inputs"]).logits, case["logits"])
        for name, kwargs in case.get("generate", {}).items():
            res[name] = torch.equal(model.generate(**kwargs), case[name])
        if "base" in case:
            base = tf.AutoModel.from_pretrained(path, trust_remote_code=True, attn_implementation="eager")
            res["base_class"] = f"{type(base).__module__}.{type(base).__name__}"
            res["base_equal"] = torch.equal(base(**case["inputs"]).last_hidden_state, case["base"])
    for name, load in (("plain_auto", lambda: getattr(tf, case["auto"]).from_pretrained(path)),
                       ("plain_class_ignore_sizes",
                        lambda: getattr(tf, case["class"]).from_pretrained(path, ignore_mismatched_sizes=True))):
        try:
            load()
            res[name] = "LOADED"
        except Exception as err:
            res[name] = str(err)
    out[family] = res
print("RESULT " + json.dumps(out))
"""


def test_remote_code_directory_loads_without_prunetrain_and_is_bit_identical(tmp_path):
    expected = {}
    for family in FAMILIES:
        model = shrunk(family)
        pt.save_pruned(model, tmp_path / family)
        arch = ARCHITECTURES[family]
        inputs = model_inputs(family)
        case = {"auto": AUTO[arch.task], "class": arch.model_class, "inputs": inputs}
        with torch.no_grad():
            case["logits"] = model(**inputs).logits
            if arch.generative:
                case["generate"] = {"greedy": generate_kwargs(family), "beam": {**generate_kwargs(family),
                                                                                 "num_beams": 3}}
                for name, kwargs in case["generate"].items():
                    case[name] = model.generate(**kwargs)
            if family == "marian":
                case["base"] = model.model(**inputs).last_hidden_state
        expected[family] = case
        files = sorted(p.name for p in (tmp_path / family).iterdir())
        assert "modeling_prunetrain.py" in files and not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)
    torch.save(expected, tmp_path / "expected.pt")
    site_packages = str(Path(transformers.__file__).parents[1])
    run = subprocess.run([sys.executable, "-I", "-S", "-c", _CHILD, site_packages, str(tmp_path)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                         env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "OMP_NUM_THREADS": "1"})
    # transformers' "run the custom code? [y/N]" prompt (answered by the closed stdin) may precede it on its line
    line = next((x for x in run.stdout.splitlines() if "RESULT {" in x), None)
    assert line is not None, run.stderr[-3000:]
    out = json.loads(line[line.index("RESULT {") + len("RESULT "):])
    assert out.pop("prunetrain_importable") is False
    for family, res in out.items():
        assert res["class"] == ARCHITECTURES[family].model_class, family
        assert res["module"].endswith("modeling_prunetrain"), res["module"]  # the directory's own code
        assert res["logits_equal"] is True, family
        for name in ("greedy", "beam"):
            assert res.get(name, True) is True, (family, name)
        # AutoModel*: the model type is prunetrain's, so transformers refuses to run the directory's code unasked
        assert "contains custom code" in res["plain_auto"] and "trust_remote_code=True" in res["plain_auto"], res
        name = "plain_class_ignore_sizes"  # the model class itself: the guard in the width field
        assert "trust_remote_code=True" in res[name] and "prunetrain.load_pruned" in res[name], (family, res[name])
    assert out["marian"]["base_class"].endswith("modeling_prunetrain.MarianModel") and out["marian"]["base_equal"] is True
    assert {"greedy", "beam"} <= set(out["t5"]) and {"greedy", "beam"} <= set(out["llama"])


def test_load_pruned_reads_the_self_contained_directory(tmp_path):
    model = shrunk("gpt2")
    loaded = pt.load_pruned(pt.save_pruned(model, tmp_path / "m"), attn_implementation="eager")
    assert type(loaded) is type(model) and pt.find_heads(loaded) == pt.find_heads(model)
    assert "auto_map" not in loaded.config.to_dict() and loaded.config.vocab_size == model.config.vocab_size
    inputs = model_inputs("gpt2")
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)


def test_a_family_whose_shrunk_attention_needs_prunetrain_is_guarded_not_written_as_remote_code(tmp_path):
    model = shrunk("phi3")  # its shrunk attention runs prunetrain's PrunablePhi3Attention
    path = pt.save_pruned(model, tmp_path / "m")
    assert "PrunedModelMixin" not in (path / "modeling_prunetrain.py").read_text()  # only a refusing config class
    with pytest.raises(Exception, match=r"in attention code only prunetrain has; load it with "
                                        r"prunetrain\.load_pruned\(path\)"):
        transformers.Phi3ForCausalLM.from_pretrained(path, ignore_mismatched_sizes=True)
    loaded = pt.load_pruned(path, attn_implementation="eager")
    inputs = model_inputs("phi3")
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)
    with pytest.raises(ValueError, match=r"runs PrunablePhi3Attention, prunetrain's own form of Phi3Attention, which "
                                         r"the standalone modeling file cannot rebuild; write it as 'padded'"):
        export(model, tmp_path / "rc", "remote-code")
    assert check_formats(model)["padded"] is None
    assert not (tmp_path / "rc").exists()


def test_save_pruned_records_a_mask_attached_to_the_model(tmp_path):
    """Formerly refused (masks were not saved); now recorded as every save records them (tests/test_saved_masks.py):
    the directory loads as the masked model, and exports as the model shrunk with the mask."""
    model = tiny_model("bert")
    mask = random_mask(model, seed=1, empty_site=None).attach(model)
    inputs = model_inputs("bert")
    with torch.no_grad():
        masked = model(**inputs).logits
    pt.save_pruned(model, tmp_path / "m")
    with torch.no_grad():
        assert torch.equal(pt.load_pruned(tmp_path / "m")(**inputs).logits, masked)
    summary = export(tmp_path / "m", tmp_path / "rc", "remote-code")
    assert summary["heads"] == f"{mask.num_kept} heads (self {mask.num_kept})"
    with torch.no_grad():
        assert (pt.load_pruned(tmp_path / "rc")(**inputs).logits - masked).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------------------------------
# load_pruned refuses directories whose weights or records do not fit (issue 15 item 4, issue 19)
# ---------------------------------------------------------------------------------------------------------------------
def _edit_json(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_load_pruned_refuses_weights_that_do_not_match_the_layout(tmp_path):
    from safetensors.torch import load_file, save_file

    path = pt.save_pruned(shrunk("marian"), tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    key = "model.decoder.layers.1.self_attn.q_proj.weight"
    tensors[key] = torch.zeros(32, 32)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"does not match its recorded layout: tensor "
                                         r"'model\.decoder\.layers\.1\.self_attn\.q_proj\.weight' of site "
                                         r"'model\.decoder\.layers\.1\.self_attn' \(\d heads × 8.*has shape "
                                         r"\(32, 32\) but the layout needs \(\d+, 32\)"):
        pt.load_pruned(path)


def test_load_pruned_refuses_head_indices_beyond_the_site(tmp_path):
    path = pt.save_pruned(shrunk("bert"), tmp_path / "m")
    site = "bert.encoder.layer.1.attention"
    _edit_json(path / "config.json", lambda c: c["prunetrain_heads"].__setitem__(site, [0, 7]))
    with pytest.raises(ValueError, match=r"records heads \[0, 7\] for site 'bert\.encoder\.layer\.1\.attention', "
                                         r"which has 4 heads; expected increasing indices in 0\.\.3"):
        pt.load_pruned(path)


def test_load_pruned_refuses_a_layout_and_config_that_claim_more_heads_than_the_weights(tmp_path):
    model = shrunk("bert")
    path = pt.save_pruned(model, tmp_path / "m")
    site = "bert.encoder.layer.1.attention"
    assert len(pt.find_heads(model)[site].heads) < 4
    _edit_json(path / "config.json", lambda c: c["prunetrain_heads"].pop(site))  # "all 4 heads"

    def layout(data):
        entry = next(s for s in data["sites"] if s["name"] == site)
        entry.update(num_heads=4, num_kv_heads=4, heads=[0, 1, 2, 3])
    _edit_json(path / "prunetrain_layout.json", layout)
    with pytest.raises(ValueError, match=r"tensor 'bert\.encoder\.layer\.1\.attention\.[\w.]+' of site "
                                         r"'bert\.encoder\.layer\.1\.attention' \(4 heads × 8, 4 key/value heads "
                                         r"in the recorded layout\) has shape \(\d+, \d+\) but the layout needs"):
        pt.load_pruned(path)


# ---------------------------------------------------------------------------------------------------------------------
# plain formats: padded (exact everywhere) and uniform (standard config, fewer heads)
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_padded_export_loads_with_plain_from_pretrained_and_computes_the_same(family, tmp_path):
    model = shrunk(family)
    source = pt.save_pruned(model, tmp_path / "pruned")
    (source / "tokenizer.json").write_text("{}")  # non-model files travel with the export
    result = export(source, tmp_path / "padded", "padded")
    files = set(result["files"])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files and "modeling_prunetrain.py" not in files
    arch = ARCHITECTURES[family]
    plain = getattr(transformers, arch.model_class).from_pretrained(tmp_path / "padded", attn_implementation="eager")
    assert "prunetrain_heads" not in plain.config.to_dict()
    full = tiny_model(family)
    assert {k: tuple(v.shape) for k, v in plain.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in full.state_dict().items()}  # original shapes
    inputs = model_inputs(family)
    with torch.no_grad():
        assert (plain(**inputs).logits - model(**inputs).logits).abs().max() <= 1e-5
        if arch.generative:
            assert torch.equal(plain.generate(**generate_kwargs(family)), model.generate(**generate_kwargs(family)))


def test_padded_and_uniform_exports_keep_the_generation_settings(tmp_path):
    """A model saved after Trainer training has `use_cache: false` in config.json and `true` in its generation config;
    an export that rebuilt the generation config from config.json would generate without the KV cache (same
    outputs, several times slower)."""
    model = shrunk("marian")
    model.config.use_cache = False
    model.generation_config.use_cache = True
    model.generation_config.num_beams = 3
    for fmt in ("padded", "remote-code"):
        export(model, tmp_path / fmt, fmt)
        saved = json.loads((tmp_path / fmt / "generation_config.json").read_text())
        assert saved["use_cache"] is True and saved["num_beams"] == 3, fmt
    llama = tiny_model("llama")
    pt.shrink(llama, _uniform_mask(llama, keep=(2, 3)))
    llama.config.use_cache, llama.generation_config.use_cache = False, True
    export(llama, tmp_path / "uniform", "uniform")
    assert json.loads((tmp_path / "uniform" / "generation_config.json").read_text())["use_cache"] is True


def _uniform_mask(model, keep):
    layout = pt.find_heads(model)
    return pt.HeadMask.from_heads(model, {s.name: [h for h in range(s.num_heads) if h not in keep] for s in layout})


def test_uniform_export_of_a_gqa_decoder_loads_without_remote_code(tmp_path):
    model = tiny_model("llama")
    pt.shrink(model, _uniform_mask(model, keep=(2, 3)))  # one key/value group per layer
    result = export(model, tmp_path / "uniform", "uniform")
    assert result["max_abs_diff"] == 0.0
    config = json.loads((tmp_path / "uniform" / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (2, 1, 8)
    assert not {"auto_map", "prunetrain_heads", "prunetrain_export"} & set(config)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "uniform", attn_implementation="eager")
    inputs = model_inputs("llama")
    with torch.no_grad():
        assert torch.equal(plain(**inputs).logits, model(**inputs).logits)
        assert torch.equal(plain.generate(**generate_kwargs("llama")), model.generate(**generate_kwargs("llama")))


@pytest.mark.parametrize("family,tensor", [("bert", r"attention\.[\w.]+"), ("marian", r"_attn\.[\w.]+"),
                                           ("gpt2", r"attn\.[\w.]+"), ("t5", r"relative_attention_bias\.weight")])
def test_uniform_is_refused_where_a_standard_config_cannot_describe_the_heads(family, tensor, tmp_path):
    model = tiny_model(family)
    pt.shrink(model, _uniform_mask(model, keep=(0, 1)))
    with pytest.raises(ValueError, match=rf"format: a standard {ARCHITECTURES[family].model_type} config with 2 heads "
                                         rf"per site gives '[\w.]*{tensor}' shape .* but the pruned model holds"):
        export(model, tmp_path / "u", "uniform")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_uniform_is_refused_for_a_non_uniform_layout_and_check_formats_says_why(tmp_path):
    model = shrunk("llama", empty_site=None)
    reasons = check_formats(model)
    assert reasons["remote-code"] is None and reasons["padded"] is None and reasons["onnx"] is None
    assert "needs the same number of heads at every site" in reasons["uniform"]


# ---------------------------------------------------------------------------------------------------------------------
# ONNX: ONNX Runtime (CPU) computes what PyTorch computes
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_export_runs_in_onnx_runtime_like_pytorch(family, tmp_path):
    import onnxruntime as ort

    model = shrunk(family)
    result = export(model, tmp_path / "onnx", "onnx")
    seq2seq = ARCHITECTURES[family].task == "seq2seq"
    expected = {"seq2seq": ["beam_search_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx",
                            "encoder_model.onnx", "generation_config.json"],
                "causal-lm": ["decoder_with_past_model.onnx", "generation_config.json", "model.onnx"]}
    assert result["files"] == expected.get(ARCHITECTURES[family].task, ["model.onnx"])
    inputs = tiny_inputs(family, batch=3, length=11, seed=5)  # other shapes than the export's probe
    ids, mask = inputs["input_ids"].numpy(), inputs["attention_mask"].numpy()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    load = lambda name: ort.InferenceSession(str(tmp_path / "onnx" / name), opts,  # noqa: E731
                                             providers=["CPUExecutionProvider"])
    with torch.no_grad():
        if seq2seq:
            hidden = load("encoder_model.onnx").run(None, {"input_ids": ids, "attention_mask": mask})[0]
            want_hidden = model.get_encoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])[0]
            assert (torch.from_numpy(hidden) - want_hidden).abs().max() <= 1e-4
            labels = inputs["labels"]
            got = load("decoder_model.onnx").run(None, {"decoder_input_ids": labels.numpy(),
                                                        "encoder_hidden_states": hidden,
                                                        "encoder_attention_mask": mask})[0]
            want = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                         decoder_input_ids=labels).logits
        else:
            got = load("model.onnx").run(None, {"input_ids": ids, "attention_mask": mask})[0]
            want = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    assert got.shape == tuple(want.shape)
    assert (torch.from_numpy(got) - want).abs().max() <= 1e-4


@pytest.mark.parametrize("family,empty_site", [("gpt2", 0), ("llama", 0), ("marian", 2), ("t5", 2)])
def test_onnx_kv_cache_graph_generates_like_pytorch(family, empty_site, tmp_path):
    from prunetrain.export.onnx import greedy_generate

    model = shrunk(family, empty_site=empty_site)  # the first (decoder) self-attention site has no heads: its
    export(model, tmp_path / "onnx", "onnx")       # cache layer is [batch, 0, positions, head_dim]
    site = pt.find_heads(model).sites[empty_site]
    assert site.num_heads == 0 and site.kind in ("self", "decoder_self") and site.layer == 0
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 90, (3, 6), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding (decoder-only) / padded source positions (encoder-decoder)
    start = model.generation_config.decoder_start_token_id
    with torch.no_grad():
        want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6,
                              do_sample=False, num_beams=1, use_cache=True, pad_token_id=1)
    assert torch.equal(greedy_generate(tmp_path / "onnx", ids, mask, 6, decoder_start_token_id=start), want)


def test_an_exporter_crash_becomes_an_error_message():
    import signal

    from prunetrain.export.onnx import _run_isolated

    assert _run_isolated(lambda: None) is None
    assert _run_isolated(lambda: os.kill(os.getpid(), signal.SIGFPE)) == "the exporter crashed with signal 8"
    assert _run_isolated(lambda: 1 / 0) == "division by zero"


def test_onnx_export_leaves_the_model_in_eval_mode(tmp_path):
    model = tiny_model("bert", hidden_dropout_prob=0.3)  # dropout on: training mode would change the outputs
    export(model, tmp_path / "onnx", "onnx")
    assert not model.training and not any(m.training for m in model.modules())


def test_exports_refuse_models_that_do_not_take_tokens(tmp_path):
    model = tiny_model("vit")
    pt.shrink(model, random_mask(model, seed=1, empty_site=None))
    with pytest.raises(ValueError, match=r"model: ViTForImageClassification takes pixel_values, not token ids"):
        export(model, tmp_path / "p", "padded")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------------
def _cli_in_process(capsys, monkeypatch, *args):
    """`prunetrain export ...` through the real entry point (`prunetrain.cli.main`), in this process (each
    subprocess costs seconds of imports); one test below runs a real subprocess."""
    from prunetrain.cli import main

    monkeypatch.setattr(sys, "argv", ["prunetrain", "export", *map(str, args)])
    with pytest.raises(SystemExit) as exit_:
        main()
    out = capsys.readouterr()
    return exit_.value.code or 0, out.out, out.err


def test_cli_export_check_and_errors(tmp_path, capsys, monkeypatch):
    model = shrunk("marian")
    source = pt.save_pruned(model, tmp_path / "pruned")
    code, out, err = _cli_in_process(capsys, monkeypatch, "--check", source)
    assert code == 0, err
    formats = json.loads(out)["formats"]
    assert [f for f, v in formats.items() if v["possible"]] == ["remote-code", "padded", "onnx"]
    assert "same number of heads at every site" in formats["uniform"]["why_not"]

    code, out, err = _cli_in_process(capsys, monkeypatch, source, tmp_path / "out", "--format", "padded")
    assert code == 0, err
    assert json.loads(out)["format"] == "padded" and (tmp_path / "out" / "model.safetensors").is_file()
    (tmp_path / "dir-config" / "config.json").mkdir(parents=True)
    (tmp_path / "loop-config").mkdir()
    (tmp_path / "loop-config" / "config.json").symlink_to(tmp_path / "loop-config" / "config.json")

    for args, message in [
        ((source, tmp_path / "out", "--format", "padded"), "already exists and is not empty; pass --overwrite"),
        ((source, tmp_path / "u", "--format", "uniform"),
         "prunetrain: error: format: 'uniform' needs the same number of heads at every site"),
        ((tmp_path / "missing", tmp_path / "y"), "is not a saved model directory (no config.json)"),
        ((tmp_path / "dir-config", tmp_path / "y"), "(its config.json is not a regular file)"),
        ((tmp_path / "loop-config", tmp_path / "y"), "(its config.json is a link that leads nowhere or in a loop)"),
        (("--check", source, tmp_path / "z"), "destination: --check writes nothing; give only SOURCE."),
    ]:
        code, out, err = _cli_in_process(capsys, monkeypatch, *args)
        assert code == 2 and message in err, (args, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir-config", "loop-config", "out", "pruned"]  # nothing more


def test_cli_export_is_a_real_command(tmp_path):
    from conftest import run_cli

    run = run_cli("export", tmp_path, tmp_path / "x", "--format", "zip")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == ("prunetrain: error: --format: 'zip' is not one of 'remote-code', 'uniform', "
                                  "'padded', 'onnx', 'gguf', 'ctranslate2'.")
    assert not (tmp_path / "x").exists()
    run = run_cli("export", "--help")
    assert run.returncode == 0 and "--format" in run.stdout and "--check" in run.stdout


def test_isolated_export_does_not_hang_after_the_parent_used_threads():
    """Regression: the exporter's forked child hung forever (OpenMP's pool does not survive fork) once the parent had
    run a multi-threaded op — `prunetrain export --format onnx` after any 2-thread forward never returned."""
    script = (
        "import torch\n"
        "from prunetrain.export.onnx import _run_isolated\n"
        "torch.set_num_threads(2)\n"
        "a = torch.randn(1500, 1500); (a @ a).sum(); torch.softmax(torch.randn(32, 256, 256), -1)\n"
        "def work():\n"
        "    b = torch.randn(1500, 1500); (b @ b).sum(); torch.softmax(torch.randn(32, 256, 256), -1)\n"
        "print(repr(_run_isolated(work)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "None"
