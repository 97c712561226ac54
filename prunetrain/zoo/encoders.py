"""Zoo entries of the encoder families: DistilBERT, XLM-RoBERTa, ELECTRA, ALBERT, DeBERTa-v2/v3, ModernBERT.

Tiny configs (width 32, 4 heads of 8, no dropout); masked-LM heads so that every token's output is compared.
"""

from __future__ import annotations

from prunetrain.zoo.architectures import VOCAB, Architecture, register_architecture

_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _distilbert():
    import transformers as tf

    return tf.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64,
                               dropout=0.0, attention_dropout=0.0, pad_token_id=1, vocab_size=VOCAB)


def _bert_like(cls_name, **extra):
    def make():
        import transformers as tf

        return getattr(tf, cls_name)(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64, pad_token_id=1, vocab_size=VOCAB, **_NO_DROPOUT,
                                     **extra)
    return make


def _albert():
    import transformers as tf

    # 4 layers in 2 groups: each shared attention module runs in 2 layers (released ALBERTs: 1 group for all layers)
    return tf.AlbertConfig(embedding_size=16, hidden_size=32, num_hidden_layers=4, num_hidden_groups=2,
                           inner_group_num=1, num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                           vocab_size=VOCAB, **_NO_DROPOUT)


def _deberta(version):
    def make():
        import transformers as tf

        if version == 2:  # separate relative-position projections (pos_key_proj / pos_query_proj), no buckets
            extra = dict(share_att_key=False, position_buckets=-1, max_relative_positions=16, norm_rel_ebd="none",
                         position_biased_input=True)
        else:  # v3: position projections shared with key/query, log buckets, layer-normed relative embeddings
            extra = dict(share_att_key=True, position_buckets=8, max_relative_positions=-1,
                         norm_rel_ebd="layer_norm", position_biased_input=False)
        return tf.DebertaV2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=64, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                  pad_token_id=1, vocab_size=VOCAB, **_NO_DROPOUT, **extra)
    return make


def _modernbert():
    import transformers as tf

    # layer 0 global, layer 1 sliding window (local_attention=4: a window of ±2 tokens on length-7 inputs)
    return tf.ModernBertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                               max_position_embeddings=64, global_attn_every_n_layers=2, local_attention=4,
                               attention_bias=True, mlp_bias=True, norm_bias=True, attention_dropout=0.0,
                               embedding_dropout=0.0, mlp_dropout=0.0, pad_token_id=1, bos_token_id=0,
                               eos_token_id=2, cls_token_id=0, sep_token_id=2, vocab_size=VOCAB)


for _arch in (
    Architecture("distilbert", "distilbert", _distilbert, "DistilBertForMaskedLM", "masked-lm",
                 "separate q/k/v/out (`q_lin` … `out_lin`)"),
    Architecture("xlm-roberta", "xlm-roberta", _bert_like("XLMRobertaConfig"), "XLMRobertaForMaskedLM", "masked-lm",
                 "separate q/k/v/out (BERT layout)"),
    Architecture("electra", "electra", _bert_like("ElectraConfig", embedding_size=16), "ElectraForMaskedLM",
                 "masked-lm", "separate q/k/v/out (BERT layout), embeddings projected to the width"),
    Architecture("albert", "albert", _albert, "AlbertForMaskedLM", "masked-lm",
                 "one attention module shared by every layer of a group",
                 note="a site is a shared module: its mask and `shrink` apply in every layer that runs it"),
    Architecture("deberta-v2", "deberta-v2", _deberta(2), "DebertaV2ForMaskedLM", "masked-lm",
                 "disentangled attention, separate relative-position projections (c2p + p2c)",
                 note="`pos_key_proj`/`pos_query_proj` sliced with the heads; eager only (transformers has no sdpa)",
                 backends=("eager",)),
    Architecture("deberta-v3", "deberta-v2", _deberta(3), "DebertaV2ForMaskedLM", "masked-lm",
                 "disentangled attention, position projections shared with key/query, log buckets",
                 note="eager only (transformers has no sdpa for DeBERTa)", backends=("eager",)),
    Architecture("modernbert", "modernbert", _modernbert, "ModernBertForMaskedLM", "masked-lm",
                 "fused `Wqkv` (rows q, k, v), rotary, alternating global / sliding-window layers"),
):
    register_architecture(_arch)
