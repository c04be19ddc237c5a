"""Conformance: the common RoPE options compose with every rotary encoding, or are refused.

For every registered encoding that rotates (``has_rotary``) and declares the common RoPE
options (``"scaling" in option_specs``), each option value below is either refused with a
``ValueError`` that names the option, or it is honoured:

* ``scaling`` (linear, YaRN, Llama 3, dynamic NTK, LongRoPE): the rotation changes, and
  where the encoding exposes RoPE's frequencies (``inv_freq``) they are the scaled ones of
  ``relpos.functional.rope_frequencies`` (masked pairs stay masked), and the encoding
  rotates exactly as the unscaled one given those frequencies;
* ``base``: the same with another base;
* ``partial_rotary_factor``: half the pairs rotate; parameter-free encodings pass the other
  channels through;
* ``layout``: the rotation changes; for parameter-free encodings the scores equal the other
  layout's on permuted channels (``half(x[perm]) == interleaved(x)[perm]``).

Written from flags and ``option_specs`` only: encodings registered later are covered.
"""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.encodings.options import Refused
from relpos.functional import rope_frequencies
from relpos.registry import encoding_class
from relpos.rope_scaling import is_length_dependent

from .common import D, H, make_encoding, scores

L = 20
LINEAR = {"rope_type": "linear", "factor": 4.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}  # with max_position_embeddings=8 < L
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}
LONGROPE = {  # length-dependent: long factors past the original 8 positions (L = 20)
    "rope_type": "longrope",
    "short_factor": [1.0] * (D // 2),
    "long_factor": [1.0 + i for i in range(D // 2)],
    "original_max_position_embeddings": 8,
}


def _rotary_names() -> list[str]:
    out = []
    for name in relpos.available():
        cls = encoding_class(name)
        if "scaling" in cls.option_specs and make_encoding(name).has_rotary:
            out.append(name)
    return out


ROTARY = _rotary_names()


def _qk(dtype=torch.float64):
    gen = torch.Generator().manual_seed(1)
    return tuple(torch.randn(2, H, L, D, generator=gen, dtype=dtype) for _ in range(2))


def _build(name: str, **options) -> relpos.Encoding:
    return make_encoding(name, **options).double()


def _scores(enc, q, k):
    pos = torch.arange(L)
    return scores(q, k, enc, q_pos=pos, k_pos=pos)


def _honoured_or_refused(name: str, option: str, **options):
    """The encoding built with ``options``, or None when it refused them naming ``option``."""
    try:
        return _build(name, **options)
    except ValueError as err:
        assert option in str(err), f"{name} refused {option} without naming it: {err}"
        return None


def _uses_rope_frequencies(enc) -> bool:
    """Whether the encoding rotates by RoPE's frequencies (``inv_freq``): it has them and takes
    a scaling dict (an encoding with frequencies of its own, CARoPE's token-dependent ones,
    refuses ``scaling``)."""
    return hasattr(enc, "inv_freq") and not isinstance(enc.option_specs["scaling"], Refused)


def _check_frequencies(plain, changed, expected: torch.Tensor, same_mask: bool) -> None:
    """``changed`` uses ``expected`` where it rotates (masked pairs stay 0), and rotates as
    ``plain`` does once given ``changed``'s frequencies."""
    freq = changed.inv_freq.double()
    rotating = freq != 0
    if same_mask:
        assert torch.equal(rotating, plain.inv_freq != 0), "the scaling changed which pairs rotate"
    torch.testing.assert_close(freq[rotating], expected.double()[rotating], rtol=1e-6, atol=0)


def _rotates_as_with(plain, changed, q, k, **length_options) -> None:
    """Swap ``changed``'s frequencies (and attention factor) into ``plain``: same scores."""
    seq_len = length_options.get("seq_len")
    inv_freq, factor = changed.inv_freq, changed.attention_factor
    if seq_len is not None:
        inv_freq, factor = changed.frequencies(seq_len)
    plain.inv_freq = inv_freq.to(plain.inv_freq.dtype)
    plain.attention_factor = factor
    torch.testing.assert_close(_scores(plain, q, k), _scores(changed, q, k), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ROTARY)
@pytest.mark.parametrize(
    ("scaling", "extra"),
    [
        (LINEAR, {}),
        (YARN, {}),
        (LLAMA3, {}),
        (DYNAMIC, {"max_position_embeddings": 8}),
        (LONGROPE, {}),
    ],
    ids=["linear", "yarn", "llama3", "dynamic", "longrope"],
)
def test_scaling_is_honoured_or_refused_by_name(name, scaling, extra):
    changed = _honoured_or_refused(name, "scaling", scaling=dict(scaling), **extra)
    if changed is None:
        return
    plain = _build(name)
    q, k = _qk()
    assert not torch.allclose(_scores(plain, q, k), _scores(changed, q, k)), (
        f"{name}: scaling {scaling['rope_type']} left the scores unchanged"
    )
    if not _uses_rope_frequencies(changed):
        return
    seq_len = L if is_length_dependent(scaling) else None
    expected, factor = rope_frequencies(
        plain.head_dim,
        plain.base,
        scaling,
        seq_len=seq_len,
        max_position_embeddings=extra.get("max_position_embeddings"),
        partial_rotary_factor=plain.partial_rotary_factor,
    )
    if seq_len is None:
        _check_frequencies(plain, changed, expected, same_mask=True)
        assert changed.attention_factor == pytest.approx(factor)
    else:
        freq, _ = changed.frequencies(seq_len)
        rotating = freq != 0
        torch.testing.assert_close(freq[rotating].double(), expected[rotating].double())
    _rotates_as_with(plain, changed, q, k, seq_len=seq_len)


@pytest.mark.parametrize("name", ROTARY)
def test_base_is_honoured_or_refused_by_name(name):
    changed = _honoured_or_refused(name, "base", base=500.0)
    if changed is None:
        return
    plain = _build(name)
    q, k = _qk()
    assert not torch.allclose(_scores(plain, q, k), _scores(changed, q, k))
    if _uses_rope_frequencies(changed):
        expected, _ = rope_frequencies(
            plain.head_dim, 500.0, partial_rotary_factor=plain.partial_rotary_factor
        )
        _check_frequencies(plain, changed, expected, same_mask=False)
        _rotates_as_with(plain, changed, q, k)


@pytest.mark.parametrize("name", ROTARY)
def test_partial_rotary_factor_is_honoured_or_refused_by_name(name):
    changed = _honoured_or_refused(name, "partial_rotary_factor", partial_rotary_factor=0.5)
    if changed is None:
        return
    plain = _build(name)
    q, k = _qk()
    assert not torch.allclose(_scores(plain, q, k), _scores(changed, q, k))
    if _uses_rope_frequencies(changed):
        assert changed.inv_freq.numel() == D // 4
        if not changed.learnable and changed.dims == 1:
            pos = torch.arange(L)[None]
            qr, kr = changed.rotate_qk(q, k, pos, pos)
            assert torch.equal(qr[..., D // 2 :], q[..., D // 2 :])
            assert torch.equal(kr[..., D // 2 :], k[..., D // 2 :])


@pytest.mark.parametrize("name", ROTARY)
def test_layout_is_honoured_or_refused_by_name(name):
    half = _honoured_or_refused(name, "layout", layout="half")
    inter = _honoured_or_refused(name, "layout", layout="interleaved")
    if half is None or inter is None:
        return
    q, k = _qk()
    pos = torch.arange(L)[None]
    if half.dims == 1:
        assert not torch.allclose(
            half.rotate_qk(q, k, pos, pos)[0], inter.rotate_qk(q, k, pos, pos)[0]
        )
    if not half.learnable:
        perm = torch.cat((torch.arange(0, D, 2), torch.arange(1, D, 2)))
        torch.testing.assert_close(
            _scores(half, q[..., perm], k[..., perm]), _scores(inter, q, k), rtol=1e-9, atol=1e-9
        )


@pytest.mark.parametrize("name", ROTARY)
def test_rotary_channels_last_is_honoured_or_refused_by_name(name):
    """``rotary_channels="last"`` with half the channels rotated: the first half passes
    through, and the rotation is the ``"first"`` encoding's on the head with its halves
    swapped (q, k and, for encodings that rotate them, values and outputs). Encodings that
    do not declare the option (the sectioned m-D RoPEs) are not asked."""
    if "rotary_channels" not in encoding_class(name).option_specs:
        return
    first = _honoured_or_refused(name, "partial_rotary_factor", partial_rotary_factor=0.5)
    if first is None:
        return
    last = _honoured_or_refused(
        name, "rotary_channels", rotary_channels="last", partial_rotary_factor=0.5
    )
    if last is None:
        return
    first.load_state_dict(last.state_dict())
    q, k = _qk()
    pos = torch.arange(L)[None]
    swap = torch.cat((torch.arange(D // 2, D), torch.arange(D // 2)))
    back = torch.argsort(swap)
    qr, kr = last.rotate_qk(q, k, pos, pos)
    q_first, k_first = first.rotate_qk(q[..., swap], k[..., swap], pos, pos)
    torch.testing.assert_close(qr, q_first[..., back], rtol=0, atol=0)
    torch.testing.assert_close(kr, k_first[..., back], rtol=0, atol=0)
    assert torch.equal(qr[..., : D // 2], q[..., : D // 2])
    assert torch.equal(kr[..., : D // 2], k[..., : D // 2])
    if last.rotates_values:
        for role in ("v", "o"):
            torch.testing.assert_close(
                last.rotate(q, pos, role),
                first.rotate(q[..., swap], pos, role)[..., back],
                rtol=0,
                atol=0,
            )


def test_the_rotary_encodings_of_this_package_are_covered():
    """The test above is not vacuous: the RoPE variants are in it."""
    assert {"rope", "xpos", "hope", "p-rope", "lerope", "rove", "harope", "complexformer"} <= set(
        ROTARY
    )
