"""Camera and multi-view geometry encodings: per-token frames (``frames.py``) and the
methods built on them (PRoPE, StereoWorld, UCPE, GTA, CaPE-6DoF), plus the absolute Plücker
ray embedding (``plucker.py``, a helper)."""
