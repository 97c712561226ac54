"""Interop with other toolkits: fairseq checkpoints → FSMT, and the head engine inside fairseq models (`fairseq`,
imported only when used)."""
