"""RoPE in linear attention: RoFormer's linear form (Su et al. 2021, "RoFormer: Enhanced
Transformer with Rotary Position Embedding", arXiv 2104.09864, eq. 19).

    z_i = sum_j (R_i phi(q_i))^T (R_j phi(k_j)) v_j  /  sum_j phi(q_i)^T phi(k_j)

``phi`` is a non-negative feature map (``relpos.attention.linear.feature_maps``; elu+1 in the
paper),
``R_p`` the rotation of any rotary encoding of the registry (``Encoding.rotate_qk``: RoPE and
its scalings, xPos, LieRE, m-D sections, ...) acting on the ``m`` features. The rotation is
applied **after** ``phi`` (``phi(R q)`` would not be relative) and the **denominator is not
rotated**: the rotated numerator weights can be negative — the weights are not a probability
distribution, as the paper says — while the denominator stays > 0. Causal: prefix sums
``S_i = sum_{j<=i} (R_j phi(k_j)) v_j^T`` and ``Z_i = sum_{j<=i} phi(k_j)``, i.e. the recurrent
state of ``relpos.attention.linear.state.LinearState``; bidirectional: sums over all keys. O(L m
Dv).

The equation is as recalled from the paper (the official ZhuiyiTechnology/roformer code has softmax
attention only); its relative property is verified numerically by
tests/attention/linear/test_rotary_features.py. Assumed here: the rotation acts on the ``m``
features with the encoding's own frequencies, so ``m`` must equal the encoding's ``head_dim`` (elu+1
/ ReLU: ``m = d``; random features: ``num_features = head_dim``); the value rotation of encodings
that rotate values (RoVE, role ``"v"``/``"o"``) is kept as in softmax attention.

RoLA is ``relpos.nn.mixers.rola``: the same order (features, then rotation) on a
low-rank feature map with a frequency subset of the model's (N-D) schedule; its sparse +
low-rank module is ``relpos.nn.mixers.sparse_lowrank``, where RoPeSLR (arXiv 2605.20659),
an absolute-PE baseline, is the ``lowrank="ropeslr"`` branch.
"""

from __future__ import annotations

from torch import Tensor

from ...encodings.base import Encoding

__all__ = ["rotate_features"]


def rotate_features(
    encoding: Encoding, phi_q: Tensor, phi_k: Tensor, q_pos: Tensor, k_pos: Tensor
) -> tuple[Tensor, Tensor]:
    """``(R_i phi(q_i), R_j phi(k_j))``: the encoding's rotation applied to the features
    ``phi_q (B, H, Lq, m)``, ``phi_k (B, H, Lk, m)`` (``m`` must be the encoding's
    ``head_dim``); returned in the features' dtype."""
    m = phi_q.shape[-1]
    if m != encoding.head_dim:
        raise ValueError(
            f"linear attention with rotary encoding {encoding.name!r} rotates the feature map's "
            f"{m} features with the encoding's rotation of head_dim={encoding.head_dim}: use a "
            f"feature map with num_features={encoding.head_dim} (elu1, relu, or prf with "
            f"num_features=head_dim)"
        )
    a_q, a_k = encoding.rotate_qk(phi_q, phi_k, q_pos, k_pos)
    if a_q.shape[-1] != m or a_k.shape[-1] != m:
        raise ValueError(
            f"linear attention cannot run encoding {encoding.name!r}: its rotate_qk changes the "
            f"width of q and k ({m} -> {a_q.shape[-1]} channels, e.g. SeqPE's appended position "
            f"vectors), which has no kernelized form; use softmax attention (feature_map=None)"
        )
    return a_q.to(phi_q.dtype), a_k.to(phi_k.dtype)
