"""Camera and multi-view geometry encodings.

* ``frames.py`` — per-token frames (``CameraFrames``): camera blocks ``Proj4(M_i)``, RoPE
  sections and identity channels; q gets ``T_i^T``, k and v ``T_j^-1``, the output ``T_i``.
* ``prope.py`` — ``prope`` (PRoPE) and ``stereoworld``; ``ucpe.py`` — ``ucpe`` (per-ray
  frames) and UCPE's absolute orientation map (``orientation_map``, ``OrientationEmbedding``);
  ``gta.py`` — ``gta``; ``cape.py`` — ``cape-6dof``, ``cape-4dof`` (EscherNet);
  ``rerope.py`` — ``rerope``, ``flex4dhuman.py`` — ``flex4dhuman`` (assumed forms from the
  abstracts: existing RoPE sections + a camera section).
* ``raynova.py`` — ``raynova``: axial RoPE of fixed-frame ray coordinates (not invariant).
* ``rayrope.py`` — ``rayrope``, ``worldrope.py`` — ``worldrope`` (abstract only): query-grouped
  (keys encoded in each query camera; ``groups.py`` finds the query cameras of a call).
* Helpers, not encodings: ``plucker.py`` (``PluckerEmbedding``, the absolute Plücker-ray
  baseline), ``vrpe.py`` (Point-PQAE's view-relative positional embedding).

Camera conventions and utilities live in ``relpos.cameras``.
"""
