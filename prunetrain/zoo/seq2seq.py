"""Zoo entries of the encoder–decoder families: mBART, M2M-100 (NLLB), Pegasus, mT5, Whisper.

Tiny configs (width 32, 2 + 2 layers, 4 heads of 8, no dropout). Whisper's inputs are log-mel features
`[batch, num_mel_bins, 2 * max_source_positions]` (its two convolutions halve the frames).
"""

from __future__ import annotations

import torch

from prunetrain.zoo.architectures import VOCAB, Architecture, register_architecture

_BART_LIKE = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                  encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0,
                  attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
                  pad_token_id=1, eos_token_id=2, bos_token_id=0, forced_eos_token_id=None, vocab_size=VOCAB)


def _bart_like(cls_name, decoder_start):
    def make():
        import transformers as tf

        return getattr(tf, cls_name)(decoder_start_token_id=decoder_start, **_BART_LIKE)
    return make


def _mt5():
    import transformers as tf

    # initializer_factor 0.5: the untied LM head is not rescaled, so with factor 1 random logits reach ~25 and float
    # rounding alone (masked vs shrunk sum heads in another order) approaches the suite's 1e-5
    return tf.MT5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                        relative_attention_num_buckets=8, initializer_factor=0.5, dropout_rate=0.0,
                        feed_forward_proj="gated-gelu", tie_word_embeddings=False, pad_token_id=0, eos_token_id=1,
                        decoder_start_token_id=0, vocab_size=VOCAB)


MEL_BINS, SOURCE_POSITIONS = 8, 8


def _whisper():
    import transformers as tf

    return tf.WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                            num_mel_bins=MEL_BINS, max_source_positions=SOURCE_POSITIONS, max_target_positions=32,
                            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1,
                            bos_token_id=0, eos_token_id=2, decoder_start_token_id=3, suppress_tokens=None,
                            begin_suppress_tokens=None, forced_decoder_ids=None, vocab_size=VOCAB)


def whisper_inputs(batch: int = 2, length: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random log-mel features (a fixed number of frames, as Whisper requires) and `length - 2` label tokens."""
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, MEL_BINS, 2 * SOURCE_POSITIONS, generator=gen)
    labels = torch.randint(4, VOCAB, (batch, max(length - 2, 1)), generator=gen)
    return {"input_features": features, "labels": labels}


for _arch in (
    Architecture("mbart", "mbart", _bart_like("MBartConfig", 2), "MBartForConditionalGeneration", "seq2seq",
                 "encoder self, decoder self, cross attention (pre-norm)"),
    Architecture("m2m-100", "m2m_100", _bart_like("M2M100Config", 2), "M2M100ForConditionalGeneration", "seq2seq",
                 "encoder self, decoder self, cross attention", note="NLLB-200 checkpoints are this model type"),
    Architecture("pegasus", "pegasus", _bart_like("PegasusConfig", 0), "PegasusForConditionalGeneration", "seq2seq",
                 "encoder self, decoder self, cross attention (sinusoidal positions)"),
    Architecture("mt5", "mt5", _mt5, "MT5ForConditionalGeneration", "seq2seq",
                 "T5 layout: relative position bias shared across layers (one row per original head)"),
    Architecture("whisper", "whisper", _whisper, "WhisperForConditionalGeneration", "speech-seq2seq",
                 "audio encoder (log-mel frames) + decoder with cross attention",
                 note="a site with no heads switches to a head-less forward (Whisper views keys with its head count)",
                 make_inputs=whisper_inputs),
):
    register_architecture(_arch)
