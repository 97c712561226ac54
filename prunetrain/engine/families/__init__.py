"""Family adapters: the one place that knows Hugging Face module names.

`core` holds the registry (`register`, `adapter_for`) and the base classes; each other module holds the adapters of
one group of families. Importing this package registers all of them.
"""

from prunetrain.engine.families.core import (CROSS_ATTENTION_NAMES, FamilyAdapter, LinearAttentionAdapter, Select,
                                             adapter_for, head_rows, register, select_linear_in, select_linear_out,
                                             supported_families)
from prunetrain.engine.families import classic  # noqa: F401  (registers the adapters)
from prunetrain.engine.families.classic import (BertAdapter, EmptyGPT2Attention, GPT2Adapter, LlamaAdapter,
                                                MarianBartAdapter, T5Adapter, T5BiasSelection)

__all__ = ["CROSS_ATTENTION_NAMES", "FamilyAdapter", "LinearAttentionAdapter", "Select", "adapter_for", "head_rows",
           "register", "select_linear_in", "select_linear_out", "supported_families", "BertAdapter",
           "EmptyGPT2Attention", "GPT2Adapter", "LlamaAdapter", "MarianBartAdapter", "T5Adapter", "T5BiasSelection"]
