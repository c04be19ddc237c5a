"""The README's two atlas figures, drawn by the site's atlas code (``make atlas-figures``):

* ``atlas_profiles.png``: the logit each of six 1-D encodings adds for a similar key against
  relative distance, per head (``atlas.distance_profile``);
* ``atlas_patterns.png``: head 0's attention weights over 64 tokens for six encodings, every
  query and key the same random vector (``atlas.attention_patterns``), so the structure is the
  encoding's: RoPE's decay, ALiBi's and T5's recency, and the chunk, group and window
  schedules of DCA, Self-Extend and LM-Infinite (at their example options).

``python -m relpos_lab.docsite.readme_figures DIR`` writes both into DIR.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import atlas, figures

__all__ = ["PROFILE_ENCODINGS", "PATTERN_ENCODINGS", "PATTERN_LENGTH", "draw", "main"]

PROFILE_ENCODINGS = ("alibi", "kerple-log", "t5", "fire", "sandwich", "rope")
PATTERN_ENCODINGS = ("rope", "alibi", "t5", "dca", "self-extend", "lm-infinite")
PATTERN_LENGTH = 64


def draw() -> dict[str, bytes]:
    """``{file name: PNG bytes}`` of the two figures."""
    profiles = [
        (name, atlas.distance_profile(atlas.atlas_encoding(name))) for name in PROFILE_ENCODINGS
    ]
    weights = []
    for name in PATTERN_ENCODINGS:
        patterns = atlas.attention_patterns(atlas.atlas_encoding(name))
        weights.append((name, patterns.shared[patterns.lengths.index(PATTERN_LENGTH)]))
    return {
        "atlas_profiles.png": figures.comparison_png(profiles),
        "atlas_patterns.png": figures.pattern_comparison_png(weights),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the PNG files (docs/img)")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        parser.error(f"{args.out} is not a folder")
    for name, png in draw().items():
        (args.out / name).write_bytes(png)
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
