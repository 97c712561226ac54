"""The head engine: where heads live (`heads`), the one place that knows each family's modules (`families`, which
the rest of the engine reaches only through `registry`), head masks as hooks (`mask`), physical removal (`shrink`),
the KV cache of head-less sites (`kv_cache`) and pruned models on disk (`persist`). Everything above the engine works
from `HeadLayout` / `AttentionSite` handles."""
