"""Tiny models of every supported family, built from configs (no downloads): for tests, examples and benchmarks."""

from __future__ import annotations

import torch
from torch import nn

TINY_FAMILIES = ("bert", "roberta", "marian", "bart", "t5", "gpt2", "llama", "qwen2", "mistral")
SEQ2SEQ_FAMILIES = ("marian", "bart", "t5")
VOCAB = 96


def tiny_config(family: str, attn_implementation: str = "eager", **overrides):
    """A small config: 2 layers (per stack), width 32, 4 heads of 8 (Llama-style: 4 query heads on 2 kv heads)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB)
    if family in ("bert", "roberta"):
        cls = tf.BertConfig if family == "bert" else tf.RobertaConfig
        cfg = cls(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  pad_token_id=1, **common)
    elif family in ("marian", "bart"):
        cls = tf.MarianConfig if family == "marian" else tf.BartConfig
        cfg = cls(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                  dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, eos_token_id=2,
                  bos_token_id=0, decoder_start_token_id=0 if family == "bart" else 1, forced_eos_token_id=None,
                  **common)
    elif family == "t5":
        cfg = tf.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                          relative_attention_num_buckets=8, dropout_rate=0.0, pad_token_id=0, eos_token_id=1,
                          decoder_start_token_id=0, **common)
    elif family == "gpt2":
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, bos_token_id=0, eos_token_id=2, **common)
    elif family in ("llama", "qwen2", "mistral"):
        cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig}[family]
        cfg = cls(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=2,
                  pad_token_id=1, tie_word_embeddings=False, **common)
    else:
        raise ValueError(f"family: {family!r} is not one of {', '.join(TINY_FAMILIES)}.")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    cfg._attn_implementation = attn_implementation
    return cfg


def tiny_model(family: str, attn_implementation: str = "eager", seed: int = 0, **overrides) -> nn.Module:
    """A tiny model with an LM/seq2seq head (BERT/RoBERTa: masked LM), random weights from `seed`, in eval mode."""
    import transformers as tf

    cfg = tiny_config(family, attn_implementation, **overrides)
    cls = {
        "bert": tf.BertForMaskedLM, "roberta": tf.RobertaForMaskedLM, "marian": tf.MarianMTModel,
        "bart": tf.BartForConditionalGeneration, "t5": tf.T5ForConditionalGeneration, "gpt2": tf.GPT2LMHeadModel,
        "llama": tf.LlamaForCausalLM, "qwen2": tf.Qwen2ForCausalLM, "mistral": tf.MistralForCausalLM,
    }[family]
    torch.manual_seed(seed)
    model = cls(cfg)
    _randomise_biases(model, seed)
    return model.eval()


def _randomise_biases(model: nn.Module, seed: int) -> None:
    """HF initialises biases to zero; random biases make tests sensitive to every bias slice."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") and param.dim() == 1:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)


def tiny_inputs(family: str, batch: int = 2, length: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    """Inputs with padding in the second row (attention masks exercised), and labels/decoder inputs for seq2seq."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, -2:] = 0
        ids[1, -2:] = 1 if family != "t5" else 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if family in SEQ2SEQ_FAMILIES:
        inputs["labels"] = torch.randint(3, VOCAB, (batch, length - 2), generator=gen)
    else:
        inputs["labels"] = ids.clone()
    return inputs


def random_mask(model_or_layout, seed: int = 0, remove: float = 0.5, soft: bool = False, empty_site: int | None = 0):
    """A reproducible random HeadMask: about `remove` of the heads (whole key/value groups under GQA) set to 0.

    `empty_site`: index of a site whose heads are all removed (None: none). `soft`: kept heads get values in
    (0, 1] instead of 1, to exercise scaling.
    """
    from prunetrain.engine.mask import HeadMask

    mask = HeadMask.ones(model_or_layout)
    gen = torch.Generator().manual_seed(seed)
    for index, site in enumerate(mask.layout):
        g = site.group_size
        groups = site.num_heads // g
        alive = (torch.rand(groups, generator=gen) >= remove).repeat_interleave(g).float()
        if empty_site is not None and index == empty_site:
            alive.zero_()
        values = alive * (torch.rand(site.num_heads, generator=gen) * 0.9 + 0.1 if soft else 1.0)
        mask[site.name] = values
    return mask
