"""Zoo entries of the first families: BERT, RoBERTa, Marian, BART, T5, GPT-2, Llama, Qwen2, Mistral."""

from __future__ import annotations

from prunetrain.zoo.architectures import VOCAB, Architecture, register_architecture


def _bert(cls_name):
    def make():
        import transformers as tf

        return getattr(tf, cls_name)(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=1,
            vocab_size=VOCAB)
    return make


def _marian_bart(cls_name, decoder_start):
    def make():
        import transformers as tf

        return getattr(tf, cls_name)(
            d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, pad_token_id=1, eos_token_id=2, bos_token_id=0,
            decoder_start_token_id=decoder_start, forced_eos_token_id=None, vocab_size=VOCAB)
    return make


def _t5():
    import transformers as tf

    return tf.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                       relative_attention_num_buckets=8, dropout_rate=0.0, pad_token_id=0, eos_token_id=1,
                       decoder_start_token_id=0, vocab_size=VOCAB)


def _gpt2():
    import transformers as tf

    return tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0, bos_token_id=0, eos_token_id=2, vocab_size=VOCAB)


def _fsmt():
    import transformers as tf

    return tf.FSMTConfig(langs=["de", "en"], src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, encoder_layers=2,
                         decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                         decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                         activation_dropout=0.0, pad_token_id=1, eos_token_id=2, bos_token_id=0,
                         decoder_start_token_id=2, forced_eos_token_id=None, tie_word_embeddings=False)


def _fsmt_inputs(batch, length, seed):
    """FSMT does not derive decoder inputs from labels: give both (decoder inputs start with </s>, FSMT's start)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, -2:] = 0
        ids[1, -2:] = 1
    labels = torch.randint(3, VOCAB, (batch, length - 2), generator=gen)
    decoder_input_ids = torch.cat([torch.full((batch, 1), 2), labels[:, :-1]], dim=1)
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder_input_ids, "labels": labels}


def _llama_like(cls_name):
    def make():
        import transformers as tf

        return getattr(tf, cls_name)(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, bos_token_id=0, eos_token_id=2, pad_token_id=1, tie_word_embeddings=False,
            vocab_size=VOCAB)
    return make


for _arch in (
    Architecture("bert", "bert", _bert("BertConfig"), "BertForMaskedLM", "masked-lm",
                 "separate q/k/v/out (`self.query` … `output.dense`)"),
    Architecture("roberta", "roberta", _bert("RobertaConfig"), "RobertaForMaskedLM", "masked-lm",
                 "separate q/k/v/out (BERT layout)"),
    Architecture("marian", "marian", _marian_bart("MarianConfig", 1), "MarianMTModel", "seq2seq",
                 "encoder self, decoder self, cross attention"),
    Architecture("bart", "bart", _marian_bart("BartConfig", 0), "BartForConditionalGeneration", "seq2seq",
                 "encoder self, decoder self, cross attention"),
    Architecture("t5", "t5", _t5, "T5ForConditionalGeneration", "seq2seq",
                 "relative position bias shared across layers (one row per original head)"),
    Architecture("fsmt", "fsmt", _fsmt, "FSMTForConditionalGeneration", "seq2seq",
                 "time-first attention (fairseq's Transformer), cache passed as `layer_state`",
                 note="eager attention only (FSMT has no sdpa path)", make_inputs=_fsmt_inputs, backends=("eager",)),
    Architecture("gpt2", "gpt2", _gpt2, "GPT2LMHeadModel", "causal-lm", "fused `c_attn` (Conv1D: q | k | v)"),
    Architecture("llama", "llama", _llama_like("LlamaConfig"), "LlamaForCausalLM", "causal-lm",
                 "grouped-query attention (4 query heads on 2 kv heads)"),
    Architecture("qwen2", "qwen2", _llama_like("Qwen2Config"), "Qwen2ForCausalLM", "causal-lm",
                 "grouped-query attention, q/k/v biases"),
    Architecture("mistral", "mistral", _llama_like("MistralConfig"), "MistralForCausalLM", "causal-lm",
                 "grouped-query attention, sliding window"),
):
    register_architecture(_arch)
