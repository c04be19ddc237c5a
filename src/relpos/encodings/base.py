"""The ``Encoding`` base class: the four places a relative positional encoding can act.

Every RPE changes attention through some of

    logit(h, i, j) = < R_h(p_i) q_i , R_h(p_j) k_j > * scale  +  b_h(i, j [, q_i, k_j])

* ``rotate(x, pos, role)`` — the multiplicative part ``R_h(p)`` (roles "q", "k", "v", "o");
  rotations that read per-call ``inputs`` (camera matrices) build a state once per call in
  ``prepare_rotary(q_pos, k_pos, inputs)``; the engine then calls ``rotate(x, pos, role,
  state)`` for q, k, v and the output (``state`` is passed only when it is not None, so
  encodings without one keep the three-argument ``rotate``);
* ``bias(ctx, b, h, i, j)`` — the additive part as an element-wise function of index tensors
  (the FlexAttention ``score_mod`` shape), so one formula serves every backend;
* ``prepare(q, k, q_pos, k_pos, inputs)`` — per-call precomputation captured by ``bias``
  (e.g. ``q @ E_rel^T``), reading optional per-call ``inputs`` (graphs, boxes);
* ``embed(pos, dim)`` — absolute encodings added to the token embeddings by ``relpos.nn``.

Further hooks change the attention weights themselves (backends that only take an
additive score modification, SDPA and FlexAttention, cannot run them; ``eager`` and
``chunked`` can, see ``needs_probabilities``):

* ``value_term(ctx, p, b, h, i, j)`` — an extra output term ``sum_j p_ij a^V_ij`` (Shaw's
  relative value embeddings, iRPE contextual values);
* ``prob_multiplier(ctx, b, h, i, j)`` — an element-wise factor on the softmax weights (URPE);
* ``pieces(q, k, q_pos, k_pos)`` + ``key_segments(first, last)`` — piecewise rotary logits:
  the logit of pair (i, j) is ``<q^r_i, k^r_j>`` for the piece ``r = piece_index(i, j)``
  (-1 masks the pair). Dual Chunk Attention, Self-Extend and LM-Infinite are of this form;
  one softmax over the union of pieces equals merging the pieces by log-sum-exp. A schedule
  states its layout once, as ``KeySegment`` s (key range + distance band per piece, for a
  block of queries); ``piece_index`` is derived from them here, and the engine's piecewise
  kernel (``relpos.attention.piecewise``) reads the same segments block by block.
* ``row_gates(ctx, s, b, h, i, j)`` + ``row_bias(ctx, s, g, count, b, h, i, j)`` — a
  row-dependent logit term (flag ``row_dependent``; CoPE, TRA): the term at (i, j) reads the
  suffix sum ``count_ij = sum_{t >= j} g_it`` of gates computed from the whole row of content
  logits ``s`` (gates of masked keys are 0). Not a score_mod: the engine forms the suffix sum
  (eager over the row, chunked walking key blocks right to left with the running sum).

Position facts: ``BiasContext.distance_range`` (and ``ctx.positions``, a
``relpos.positions.CallPositions``) give the reachable ``q_pos - k_pos`` range and whether the
positions are ranges, computed once per call by the engine (no host sync for defaulted
positions). Encodings read them instead of calling ``q_pos.min()`` / ``k_pos.max()``.

Capability flags are instance attributes: the class gives the default, and an encoding
whose capabilities depend on its options sets them in ``__init__`` (Shaw without value
tables has no value term). Everything that reports or dispatches on flags (backends,
``relpos list``, the README table, the conformance suite) reads instances, and the
conformance suite checks every flag against behaviour (``tests/conformance/test_flags.py``).

Options: each constructor keyword is declared once, in the annotation of its parameter
(``typing.Annotated[type, Spec]``, ``relpos.encodings.options``); a class narrows or refuses
an inherited option it does not take itself in ``option_overrides``. ``__init_subclass__``
merges both along the class hierarchy into ``option_specs`` and checks declared keywords
before the constructor body runs.
"""

from __future__ import annotations

import functools
import inspect
import typing
from typing import Any, ClassVar

from torch import nn

from ..validation import check_int
from .context import BiasContext, KeySegment, QueryGroups, RowAffineTables
from .options import OptionSpec, check_options
from .roles import BiasRole, InputRole, PieceRole, RotaryRole, WeightRole

__all__ = ["Encoding", "BiasContext", "KeySegment", "QueryGroups", "RowAffineTables"]


class Encoding(RotaryRole, BiasRole, WeightRole, PieceRole, InputRole, nn.Module):
    """Base class of every relpos encoding. Identity everywhere unless a subclass overrides.

    The hooks are grouped by role in ``relpos.encodings.roles`` (``RotaryRole``,
    ``BiasRole``, ``WeightRole``, ``PieceRole``, ``InputRole``): an encoding overrides the
    hooks of its role. This class adds what every encoding has: name, paper, declared options,
    the shared flags, ``capabilities()`` and the repr.

    Capability flags (instance attributes; see the module docstring):
        family: the subpackage of ``relpos.encodings`` ("rotary", "bias", "contextual",
            "spatial", "graph", "document") or "absolute" / "none".
        relative: logits depend on positions only through ``q_pos - k_pos``.
        distance_only: ``bias`` is ``bias_at_distance(h, q_pos - k_pos)``; lets the chunked
            backend tabulate it per distance (O(L) memory, Toeplitz views, diagonal-sum grads).
        causal_only: meant for causal attention only (a warning-free contract, see docs).
        dims: number of position axes (1 for sequences).
        continuous: accepts floating-point positions.
        has_rotary / has_bias / adds_to_input: which of the hooks are active.
        max_positions: for learned tables, positions must lie in ``[0, max_positions)``.
        cache_rotated_keys: keys may be cached after ``rotate`` (their rotation never depends
            on later tokens). False makes ``relpos.nn`` cache raw keys and re-rotate.
        has_value_term / multiplies_probs / piecewise / row_dependent: which of the
            weight-changing hooks are active (see the module docstring); any of them sets
            ``needs_probabilities``.
        required_inputs / optional_inputs: per-call tensors the encoding reads, passed as
            ``relpos.attention(..., inputs={name: tensor})``: ``{name: expected form}``.
        keeps_own_init: models (``relpos.nn``) leave the encoding's parameters as the
            encoding initialised them.
        rotates_values: ``rotate`` acts on values ("v") and outputs ("o") too (RoVE, the
            per-token camera frames of ``relpos.encodings.camera``).
        se3_invariant: logits and outputs are unchanged when every camera of the call is
            moved by one rigid transform of the world (camera encodings; the conformance
            module ``test_camera.py`` checks it).
        mixes_tokens: the rotation of a token reads the features of the other tokens of
            its side of the call, later ones included (AW-RoPE's walk transport over a
            graph): not causal in the tokens, so a KV cache is refused by name and one call's
            rows are not the rows of a larger call.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    #: the subpackage of ``relpos.encodings`` the class lives in (set by
    #: ``__init_subclass__``); classes in top-level modules declare it (``absolute``, ``none``)
    family: ClassVar[str] = "none"
    #: specs for inherited options this class narrows or refuses without taking them in its
    #: own signature (its own options are declared in their annotations)
    option_overrides: ClassVar[dict[str, OptionSpec]] = {}
    #: every option of the class: the annotated keyword parameters of the constructors along
    #: the class hierarchy and their overrides, child entries winning (``__init_subclass__``)
    option_specs: ClassVar[dict[str, OptionSpec]] = {}
    #: the options this class's own constructor declares in its annotations
    _signature_options: ClassVar[dict[str, OptionSpec]] = {}

    # capability flags: class defaults, set per instance where options change them
    relative: bool = True
    causal_only: bool = False
    dims: int = 1
    continuous: bool = False
    #: parameters initialise themselves: models must not re-initialise them
    keeps_own_init: bool = False
    #: submodules (by name, as in ``named_modules``) that keep their own init even when the
    #: rest of the encoding takes the model's (FIRE's scalar-input layer ``mlp_in``)
    own_init_modules: ClassVar[tuple[str, ...]] = ()

    #: the flags reported by ``capabilities()`` (``relpos list``, the README table)
    FLAGS: ClassVar[tuple[str, ...]] = (
        "relative",
        "distance_only",
        "causal_only",
        "dims",
        "continuous",
        "has_rotary",
        "has_bias",
        "adds_to_input",
        "cache_rotated_keys",
        "has_value_term",
        "multiplies_probs",
        "piecewise",
        "rotates_values",
        "se3_invariant",
        "row_dependent",
        "mixes_tokens",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        module = cls.__module__.split(".")
        if module[:2] == ["relpos", "encodings"] and len(module) > 3:
            cls.family = module[2]  # the family is the subpackage, by construction
        legacy = cls.__dict__.get("options")
        if isinstance(legacy, dict) and any(isinstance(v, OptionSpec) for v in legacy.values()):
            raise TypeError(
                f"{cls.__qualname__}.options: declare each option in the annotation of its "
                f"constructor parameter, Annotated[type, Spec] (option_overrides only for an "
                f"inherited option the class narrows or refuses without taking it)"
            )
        init = cls.__dict__.get("__init__")
        if init is not None:
            cls._signature_options = signature_options(init, cls)
        specs: dict[str, OptionSpec] = {}
        for klass in reversed(cls.__mro__):
            specs.update(klass.__dict__.get("_signature_options", {}))
            specs.update(klass.__dict__.get("option_overrides", {}))
        cls.option_specs = specs
        if init is not None and not getattr(init, "_checks_options", False):

            @functools.wraps(init)
            def checked_init(self, *args: Any, **options: Any) -> None:
                checked = check_options(type(self).option_specs, options)
                if "_given_options" not in self.__dict__:  # the outermost constructor's call
                    given = {k: v for k, v in checked.items() if k in type(self).option_specs}
                    object.__setattr__(self, "_given_options", given)
                init(self, *args, **checked)

            checked_init._checks_options = True  # type: ignore[attr-defined]
            cls.__init__ = checked_init  # type: ignore[method-assign]

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads = check_int(num_heads, "num_heads")
        self.head_dim = check_int(head_dim, "head_dim")
        self.max_positions: int | None = None

    def modules_keeping_init(self) -> list[nn.Module]:
        """The submodules a model (``relpos.nn``) must leave as this encoding initialised
        them: all with ``keeps_own_init``, else those named in ``own_init_modules``."""
        if self.keeps_own_init:
            return list(self.modules())
        named = dict(self.named_modules())
        return [named[name] for name in self.own_init_modules if name in named]

    def capabilities(self) -> dict[str, Any]:
        """This instance's capability flags (``FLAGS``) plus ``needs_inputs`` /
        ``required_inputs`` / ``learnable``, as reported by ``relpos list``."""
        out = {flag: getattr(self, flag) for flag in self.FLAGS}
        out["required_inputs"] = dict(self.required_inputs)
        out["needs_inputs"] = bool(self.required_inputs) or self.needs_inputs
        out["learnable"] = self.learnable
        out["needs_probabilities"] = self.needs_probabilities
        return out

    # ----------------------------------------------------------------- capabilities
    @property
    def learnable(self) -> bool:
        """True when the encoding has trainable parameters."""
        return any(p.requires_grad for p in self.parameters())

    @property
    def needs_probabilities(self) -> bool:
        """The encoding changes the attention weights beyond an additive score term (value
        terms, multiplied probabilities, piecewise logits, row-dependent terms): only the
        ``eager`` and ``chunked`` backends run it."""
        return self.has_value_term or self.multiplies_probs or self.piecewise or self.row_dependent

    @property
    def needs_context(self) -> bool:
        """Whether the backends must call ``prepare`` (any hook that reads a ``BiasContext``)."""
        return self.has_bias or self.needs_probabilities

    def default_scale(self, head_dim: int) -> float:
        """The logit scale used when the caller passes ``scale=None``: ``head_dim ** -0.5``
        (DeBERTa overrides it: three terms share ``1/sqrt(3 d)``)."""
        return head_dim**-0.5

    @classmethod
    def example_options(cls) -> dict:
        """Options for short tests (L of a few dozen) that exercise every part of the
        encoding; the defaults may be sized for real models (e.g. DCA's chunks) and reduce to
        a simpler encoding at test lengths. The conformance suite uses them."""
        return {}

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        """The default of each declared option: the keyword defaults of the constructors along
        the class hierarchy (options passed on through ``**options`` take the default of the
        class that declares them); ``inspect.Parameter.empty`` for a required one."""
        found: dict[str, Any] = {}
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None or klass is object:
                continue
            for param in inspect.signature(init).parameters.values():
                if param.default is not inspect.Parameter.empty:
                    found.setdefault(param.name, param.default)
        return {name: found.get(name, inspect.Parameter.empty) for name in cls.option_specs}

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}"

    def __repr__(self) -> str:
        """``nn.Module``'s repr, with every option given a non-default value appended to the
        encoding's own line (``_with_given_options``): scalings included."""
        text = super().__repr__()
        own = self.extra_repr()
        full = self._with_given_options(own)
        return text.replace(own, full, 1) if own and full != own else text

    def _with_given_options(self, text: str) -> str:
        """``text`` plus every option the constructor was given with a value other than its
        default (``option_defaults``) that ``text`` does not show
        yet: the repr of an encoding states how it was built, scaling dicts included."""
        defaults = type(self).option_defaults()
        extra = []
        for name, value in getattr(self, "_given_options", {}).items():
            if f"{name}=" in text or _same(value, defaults.get(name)):
                continue
            extra.append(f"{name}={value!r}")
        return ", ".join([text, *extra]) if extra else text


def signature_options(init: Any, owner: type) -> dict[str, OptionSpec]:
    """The options a constructor declares: ``{name: spec}`` for each parameter annotated
    ``Annotated[type, spec]`` (``spec`` an ``OptionSpec``), in signature order. Annotations
    are resolved in the constructor's module (``typing.get_type_hints``), so every name a
    spec uses must be a module-level name there."""
    init = inspect.unwrap(init)
    try:
        hints = typing.get_type_hints(init, include_extras=True)
    except NameError as err:
        raise TypeError(
            f"{owner.__qualname__}.__init__: an annotation names {err.name!r}, which is not a "
            f"module-level name of {owner.__module__} when the class is defined"
        ) from err
    out: dict[str, OptionSpec] = {}
    for name in inspect.signature(init).parameters:
        hint = hints.get(name)
        if typing.get_origin(hint) is not typing.Annotated:
            continue
        specs = [m for m in hint.__metadata__ if isinstance(m, OptionSpec)]
        if len(specs) > 1:
            raise TypeError(f"{owner.__qualname__}.__init__: {name} has {len(specs)} option specs")
        if specs:
            out[name] = specs[0]
    return out


def _same(value: Any, default: Any) -> bool:
    """``value == default`` for option values (tensors and sequences compare whole)."""
    if value is default:
        return True
    try:
        return bool(value == default)
    except (RuntimeError, TypeError, ValueError):  # tensors of several elements
        return False
