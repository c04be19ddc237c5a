"""Document-layout encodings: biases from per-token boxes (LayoutLMv2, DocPolarBERT)."""
