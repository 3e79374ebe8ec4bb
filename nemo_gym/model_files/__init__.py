"""Model folders: `ng_models` (what can be trained or served here) and `ng_export` (a merged HF folder)."""
