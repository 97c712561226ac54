"""prunetrain: prune attention heads during training of PyTorch / Hugging Face transformer models.

Head engine (this package's foundation):
    find_heads(model) -> HeadLayout      every attention site: name, kind, layer, heads, head_dim, kv heads
    HeadMask                              keep value ξ_h per head, applied by hooks on the output projections
    shrink(model, mask, optimizer=None)   physically remove masked heads in place (optimizer state sliced)
    save_pruned / load_pruned             HF files + per-site head layout, no pickles
"""

from prunetrain.families import FamilyAdapter, register, supported_families
from prunetrain.heads import KINDS, HeadLayout, HeadSite, find_heads
from prunetrain.mask import HeadMask, attached_masks
from prunetrain.persist import load_pruned, save_pruned
from prunetrain.shrink import shrink

__version__ = "0.1.0"

__all__ = [
    "KINDS",
    "FamilyAdapter",
    "HeadLayout",
    "HeadMask",
    "HeadSite",
    "attached_masks",
    "find_heads",
    "load_pruned",
    "register",
    "save_pruned",
    "shrink",
    "supported_families",
]
