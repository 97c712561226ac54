"""Zoo entries of the decoder-only families beyond Llama (adapters in `prunetrain.engine.families.decoders`)."""

from __future__ import annotations

from prunetrain.zoo.architectures import VOCAB, Architecture, register_architecture

_COMMON = dict(vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=2,
               pad_token_id=1, tie_word_embeddings=False)


def _cfg(cls_name: str, **fields):
    def make():
        import transformers as tf

        return getattr(tf, cls_name)(**{**_COMMON, **fields})
    return make


_GQA = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
_MOE = dict(num_local_experts=4, num_experts_per_tok=2)

for _arch in (
    Architecture("llama-mqa", "llama", _cfg("LlamaConfig", hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                            num_key_value_heads=1),
                 "LlamaForCausalLM", "causal-lm",
                 "multi-query attention (4 query heads on 1 kv head: heads go one at a time)"),
    Architecture("llama-gqa4", "llama", _cfg("LlamaConfig", hidden_size=32, intermediate_size=64, num_attention_heads=8,
                                             num_key_value_heads=2, head_dim=8),
                 "LlamaForCausalLM", "causal-lm", "grouped-query attention, groups of 4 (8 heads on 2 kv heads)"),
    Architecture("gemma", "gemma", _cfg("GemmaConfig", **_GQA, head_dim=16),
                 "GemmaForCausalLM", "causal-lm", "GQA, head_dim independent of the width"),
    Architecture("olmo", "olmo", _cfg("OlmoConfig", **_GQA, clip_qkv=8.0),
                 "OlmoForCausalLM", "causal-lm", "GQA, q/k/v clipping"),
    Architecture("starcoder2", "starcoder2", _cfg("Starcoder2Config", **_GQA, sliding_window=4, residual_dropout=0.0,
                                                  embedding_dropout=0.0),
                 "Starcoder2ForCausalLM", "causal-lm", "GQA with biases, sliding window"),
    Architecture("smollm3", "smollm3", _cfg("SmolLM3Config", **_GQA, no_rope_layer_interval=2),
                 "SmolLM3ForCausalLM", "causal-lm", "GQA, no rotary in every second layer (NoPE)"),
    Architecture("exaone4", "exaone4", _cfg("Exaone4Config", **_GQA, sliding_window=4, sliding_window_pattern=2),
                 "Exaone4ForCausalLM", "causal-lm", "GQA, per-head q/k norms, hybrid sliding-window / global layers"),
    Architecture("glm", "glm", _cfg("GlmConfig", **_GQA),
                 "GlmForCausalLM", "causal-lm", "GQA, partial rotary"),
    Architecture("qwen3", "qwen3", _cfg("Qwen3Config", **_GQA, head_dim=16),
                 "Qwen3ForCausalLM", "causal-lm", "GQA, per-head q/k RMSNorm, head_dim independent of the width"),
    Architecture("gemma2", "gemma2", _cfg("Gemma2Config", **_GQA, head_dim=16, sliding_window=4,
                                          attn_logit_softcapping=5.0, final_logit_softcapping=10.0,
                                          query_pre_attn_scalar=16),
                 "Gemma2ForCausalLM", "causal-lm", "GQA, logit soft-capping, alternating sliding-window layers",
                 note="eager attention only (transformers has no sdpa path for soft-capping)", backends=("eager",)),
    Architecture("gemma3_text", "gemma3_text", _cfg("Gemma3TextConfig", **_GQA, head_dim=16, sliding_window=4,
                                                    query_pre_attn_scalar=16),
                 "Gemma3ForCausalLM", "causal-lm", "GQA, per-head q/k norms, sliding-window layers"),
    Architecture("phi3", "phi3", _cfg("Phi3Config", **_GQA),
                 "Phi3ForCausalLM", "causal-lm", "fused `qkv_proj` (q | k | v) with GQA"),
    Architecture("olmo2", "olmo2", _cfg("Olmo2Config", **_GQA),
                 "Olmo2ForCausalLM", "causal-lm", "q/k RMSNorm across all heads",
                 note="shrink keeps q/k projections whole (their norms span all heads) and selects kept heads after "
                      "the norm: exact; v/o, attention and KV cache shrink"),
    Architecture("granite", "granite", _cfg("GraniteConfig", **_GQA, attention_multiplier=0.3,
                                            residual_multiplier=0.5, embedding_multiplier=2.0, logits_scaling=2.0),
                 "GraniteForCausalLM", "causal-lm", "GQA with attention/residual multipliers"),
    Architecture("gpt_neox", "gpt_neox", _cfg("GPTNeoXConfig", hidden_size=32, intermediate_size=64,
                                              num_attention_heads=4, use_parallel_residual=True),
                 "GPTNeoXForCausalLM", "causal-lm", "fused `query_key_value` interleaved per head, partial rotary"),
    Architecture("falcon", "falcon", _cfg("FalconConfig", hidden_size=32, num_attention_heads=4, num_kv_heads=2,
                                          new_decoder_architecture=True, alibi=False),
                 "FalconForCausalLM", "causal-lm",
                 "fused `query_key_value` per kv group (new decoder architecture, GQA)"),
    Architecture("falcon-mqa", "falcon", _cfg("FalconConfig", hidden_size=32, num_attention_heads=4,
                                              new_decoder_architecture=False, multi_query=True, alibi=False),
                 "FalconForCausalLM", "causal-lm", "fused `query_key_value`, multi-query (old architecture)"),
    Architecture("falcon-mha", "falcon", _cfg("FalconConfig", hidden_size=32, num_attention_heads=4,
                                              new_decoder_architecture=False, multi_query=False, alibi=False),
                 "FalconForCausalLM", "causal-lm", "fused `query_key_value` interleaved per head (old architecture)"),
    Architecture("falcon-alibi", "falcon", _cfg("FalconConfig", hidden_size=32, num_attention_heads=4,
                                                new_decoder_architecture=False, multi_query=True, alibi=True),
                 "FalconForCausalLM", "causal-lm", "fused multi-query `query_key_value` with ALiBi positions",
                 shrink=False, note="shrink refused: the model builds its ALiBi bias for the configured head count "
                                    "in every layer; masks and importance are exact"),
    Architecture("gpt_bigcode", "gpt_bigcode", _cfg("GPTBigCodeConfig", n_embd=32, n_head=4, n_layer=2, n_positions=64,
                                                    multi_query=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
                 "GPTBigCodeForCausalLM", "causal-lm", "fused `c_attn` with multi-query attention (StarCoder)"),
    Architecture("gpt_bigcode-mha", "gpt_bigcode", _cfg("GPTBigCodeConfig", n_embd=32, n_head=4, n_layer=2,
                                                        n_positions=64, multi_query=False, resid_pdrop=0.0,
                                                        embd_pdrop=0.0, attn_pdrop=0.0),
                 "GPTBigCodeForCausalLM", "causal-lm", "fused `c_attn` interleaved per head (multi_query=False)"),
    Architecture("opt", "opt", _cfg("OPTConfig", hidden_size=32, ffn_dim=64, num_attention_heads=4,
                                    word_embed_proj_dim=32, enable_bias=True, dropout=0.0),
                 "OPTForCausalLM", "causal-lm", "separate q/k/v/out, learned positions"),
    Architecture("mixtral", "mixtral", _cfg("MixtralConfig", **_GQA, **_MOE),
                 "MixtralForCausalLM", "causal-lm", "mixture of experts, GQA attention (experts untouched)"),
    Architecture("qwen2_moe", "qwen2_moe", _cfg("Qwen2MoeConfig", **_GQA, num_experts=4, num_experts_per_tok=2,
                                                moe_intermediate_size=32, shared_expert_intermediate_size=32),
                 "Qwen2MoeForCausalLM", "causal-lm", "mixture of experts with a shared expert, GQA attention"),
    Architecture("qwen3_moe", "qwen3_moe", _cfg("Qwen3MoeConfig", **_GQA, head_dim=16, num_experts=4,
                                                num_experts_per_tok=2, moe_intermediate_size=32),
                 "Qwen3MoeForCausalLM", "causal-lm", "mixture of experts, GQA with per-head q/k norms"),
):
    register_architecture(_arch)
