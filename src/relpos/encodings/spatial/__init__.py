"""Encodings of 2-D / 3-D grids of patches (Swin relative tables, MViTv2 decomposed terms)."""
