"""Family adapters: the one place that knows Hugging Face module names.

`core` holds the base classes and the class-switch mechanism for sites with no heads (and re-exports the registry's
`register` and `adapter_for`, which live in `prunetrain.engine.registry`); each other module holds the adapters of one
group of families. Importing this package (which `import prunetrain` does) registers all of them. `discovery`
proposes (and proves) an adapter from a model's structure for model types none of them names.
"""

from prunetrain.engine.families.core import (CROSS_ATTENTION_NAMES, FamilyAdapter, FeedForward, LinearAttentionAdapter,
                                             Select,
                                             adapter_for, define_headless, define_subclass, head_rows, register,
                                             select_linear_in, select_linear_out, supported_families,
                                             supported_model_types, switch_class, unregister)
from prunetrain.engine.families import classic, decoders, fsmt  # noqa: F401  (register the adapters)
from prunetrain.engine.families import encoders, seq2seq, vision  # noqa: F401  (ENGINE-B's groups)
from prunetrain.engine.families.classic import (BertAdapter, GPT2Adapter, LlamaAdapter, MarianBartAdapter, T5Adapter,
                                                T5BiasSelection)
from prunetrain.engine.families.fsmt import FSMTAdapter
from prunetrain.engine.families.discovery import discover_adapter

__all__ = ["CROSS_ATTENTION_NAMES", "FamilyAdapter", "FeedForward", "LinearAttentionAdapter", "Select", "adapter_for",
           "define_headless", "define_subclass", "head_rows", "register", "select_linear_in", "select_linear_out",
           "supported_families", "supported_model_types", "switch_class", "unregister", "discover_adapter",
           "BertAdapter", "FSMTAdapter",
           "GPT2Adapter", "LlamaAdapter", "MarianBartAdapter", "T5Adapter", "T5BiasSelection"]
