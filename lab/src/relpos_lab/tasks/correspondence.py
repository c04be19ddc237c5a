"""Cross-view correspondence, the multiview experiment (docs/tasks.md): do relative camera encodings
survive a global rigid transform of the test scenes where absolute Plücker rays do not?

**Task.** A scene of ``relpos_lab.tasks.scenes`` (2 context views and 1 target view of
``grid^2`` patch tokens each, camera-major): every token carries its noisy colour feature and
a learned role embedding (context / target); cameras enter only through the model's
position scheme. For each target token the model points at one of the context tokens
(logits ``(B, P, C)``: the attention logits of a last
multi-head scoring layer on the final embeddings, with the model's encoding, summed over
heads; a plain dot product ``q(h_i) . k(h_j)`` would drop the relative frame
``T_i T_j^-1`` that a relative encoding puts between the two tokens, so the pointer uses the
same encoding as attention); the loss is
the cross-entropy on labelled targets (``multiview.correspondence_labels``), the metric the
top-1 accuracy over them (``pointer_accuracy``). Colours repeat (about 5.5 same-colour
context tokens per labelled target at the default scenes), so appearance alone is right
about 1 time in 5 (``appearance_chance``); the rest needs the cameras.

**Model specs** ``NAME[+PLUCKER]``: ``NAME`` a registry encoding acting in attention (``nope``,
``rope-axial`` on the patch (x, y), or a camera encoding such as ``prope``, ``gta``,
``ucpe``, ``cape-6dof``, ``stereoworld``, ``raynova``: fed per-token ``k_viewmats`` and, when
it reads them, ``k_Ks``), and optionally an absolute Plücker embedding
(``relpos.encodings.camera.PluckerEmbedding``) of each token's patch-centre ray added to the
token features: ``plucker`` in world coordinates, ``plucker-first`` relative to the
reference camera (CameraCtrl), ``plucker-aug`` in world coordinates with a random rigid
world change drawn for every training batch (augmentation). ``NAME-known-depth``
(``rayrope-known-depth``): an encoding that reads per-token depth gets the
scenes' true depth with no doubt (``known_depth``: ``log d`` of the hit sphere's camera
depth, ``sigma = 0``; background tokens at the far depth ``e^3``).

**Conditions** (``CONDITIONS``; the images and labels never change, only the coordinates
the model is given): ``id`` the training distribution (scenes at the origin, reference camera
= context view 0); ``rigid`` a random rigid change per scene (Haar rotation, translation
``N(0, 5^2/3 I)``: ``|t| ~ 5``); ``ref-swap`` the scene expressed in context view
1's frame, which is also the reference of ``plucker-first``; ``rigid-S`` the strength sweep
of the plot: rotation by ``S * 90`` degrees about a random axis and a translation of length
``5 S`` in a random direction. Relative encodings that are ``se3_invariant`` give the same
logits on all of them up to float32 rounding; Plücker in world coordinates does not.

Shapes: ``ViewBatch.feat (B, T, F)``, ``pos (B, T, 2)``, ``plucker (B, T, 6)``,
``inputs["k_viewmats"] (B, T, 4, 4)``, ``label (B, P)``; ``T = V P``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from relpos import registry
from relpos.attention import scores
from relpos.cameras import expand_cameras, random_se3, rotation_about
from relpos.encodings.camera.plucker import PluckerEmbedding
from relpos.nn.attention import MultiHeadAttention, build_encoding
from relpos.nn.transformer import MLP

from . import scenes as multiview

__all__ = [
    "PLUCKER_SCHEMES",
    "CONDITIONS",
    "SWEEP",
    "ViewBatch",
    "MultiviewEncoder",
    "CorrespondenceModel",
    "known_depth",
    "parse_model_spec",
    "scene_options",
    "condition_transform",
    "view_batch",
    "pointer_accuracy",
    "appearance_chance",
    "pointer_loss",
]

PLUCKER_SCHEMES = ("plucker", "plucker-first", "plucker-aug")
#: the strength sweep of the plot (0 is ``id``)
SWEEP = (0.25, 0.5, 1.0, 2.0)
CONDITIONS = ("id", "rigid", "ref-swap", *(f"rigid-{s:g}" for s in SWEEP))
#: translation scale of the rigid test (|t| ~ 5)
RIGID_TRANSLATION = 5.0
#: the patch-position order each encoding reads (default (x, y) = (column, row))
POSITION_ORDER = {"gta": "yx"}
#: the model-spec suffix that feeds an encoding the scenes' true per-token depth
KNOWN_DEPTH = "-known-depth"
DEPTH_INPUT = "k_depth_logsigma"
#: the depth given to background tokens (no sphere on the patch-centre ray): e^3 ~ 20.1,
#: the largest depth RayRoPE represents (its ``max_log_depth`` clamp), i.e. "far"; the
#: spheres lie at camera depths of about 1.5-4.5
BACKGROUND_LOG_DEPTH = 3.0


def parse_model_spec(spec: str) -> tuple[str, str | None]:
    """``"rope-axial+plucker"`` -> ``("rope-axial", "plucker")``; ``ValueError`` naming
    ``--encodings`` for an unknown encoding or Plücker scheme, or an encoding that cannot act
    in this model (not 2-D or camera, or an absolute embedding). ``NAME-known-depth``
    (``rayrope-known-depth``) -> ``("rayrope", None)``: an encoding that reads per-token depth
    (``k_depth_logsigma``) is fed the scenes' true depth (``known_depth``); the suffix is
    required, so a run never feeds ground-truth depth without saying so."""
    full, _, scheme = str(spec).partition("+")
    with_depth = full.endswith(KNOWN_DEPTH)
    name = full[: -len(KNOWN_DEPTH)] if with_depth else full
    known = registry.available()
    if name not in known and name not in registry.aliases():
        raise ValueError(
            f"--encodings: unknown encoding {name!r}; known encodings: {', '.join(known)}"
        )
    if scheme and scheme not in PLUCKER_SCHEMES:
        raise ValueError(
            f"--encodings: unknown camera scheme {scheme!r} in {spec!r}; schemes: "
            f"{', '.join(PLUCKER_SCHEMES)} (NAME+SCHEME)"
        )
    enc = registry.create(name, num_heads=2, head_dim=48, **scene_options(name))
    camera = "k_viewmats" in enc.required_inputs
    if enc.adds_to_input:
        raise ValueError(
            f"--encodings: {name!r} is an absolute embedding; the multiview suite's absolute "
            "baseline is NAME+plucker"
        )
    declared = {**enc.required_inputs, **enc.optional_inputs}
    if with_depth and DEPTH_INPUT not in declared:
        raise ValueError(
            f"--encodings: {name!r} reads no per-token depth ({DEPTH_INPUT}); drop the "
            f"{KNOWN_DEPTH!r} suffix of {spec!r}"
        )
    if DEPTH_INPUT in enc.required_inputs and not with_depth:
        raise ValueError(
            f"--encodings: {name!r} needs per-token depth ({DEPTH_INPUT}); the suite feeds the "
            f"scenes' true depth to {name + KNOWN_DEPTH!r}"
        )
    other = set(enc.required_inputs) - {"k_viewmats", "k_Ks", DEPTH_INPUT}
    if other:
        raise ValueError(
            f"--encodings: {name!r} needs inputs the multiview scenes do not have "
            f"({', '.join(sorted(other))})"
        )
    if not camera and (enc.has_rotary or enc.has_bias) and enc.dims != 2:
        raise ValueError(
            f"--encodings: {name!r} has {enc.dims} position axes; patch positions are 2-D (x, y)"
        )
    return name, scheme or None


def scene_options(name: str, grid: int = 4, image: int = 32) -> dict[str, Any]:
    """The options the scenes fix, for the encodings that declare them: ``image_size`` (W,
    H) pixels and ``grid`` (patches per side)."""
    specs = registry.encoding_class(name).option_specs
    out: dict[str, Any] = {}
    if "image_size" in specs:
        out["image_size"] = (float(image), float(image))
    if "grid" in specs:
        out["grid"] = (grid, grid)
    return out


@dataclass
class ViewBatch:
    """One batch of scenes as model inputs (see the module docstring)."""

    feat: Tensor
    pos: Tensor
    plucker: Tensor
    inputs: dict[str, Tensor]
    label: Tensor
    colour: Tensor  # (B, T) argmax colour id per token (palette = background)

    @property
    def context(self) -> int:
        return self.feat.shape[1] - self.label.shape[1]


def condition_transform(condition: str, S: int, generator: torch.Generator) -> Tensor | None:
    """The rigid world change ``(S, 4, 4)`` of a condition (None for ``id`` and
    ``ref-swap``, which are not a random change)."""
    if condition in ("id", "ref-swap"):
        return None
    if condition == "rigid":
        return random_se3(S, translation_std=RIGID_TRANSLATION / math.sqrt(3), generator=generator)
    if not condition.startswith("rigid-") or condition not in CONDITIONS:
        raise ValueError(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
    strength = float(condition[len("rigid-") :])
    axes = torch.randn(S, 3, generator=generator, dtype=torch.float64)
    shift = torch.randn(S, 3, generator=generator, dtype=torch.float64)
    shift = RIGID_TRANSLATION * strength * shift / shift.norm(dim=-1, keepdim=True)
    G = torch.zeros(S, 4, 4, dtype=torch.float64)
    angle = min(math.pi, strength * math.pi / 2)
    for i in range(S):
        G[i, :3, :3] = rotation_about(axes[i].tolist(), angle)
    G[:, :3, 3] = shift
    G[:, 3, 3] = 1.0
    return G


def known_depth(scene: dict[str, Tensor]) -> Tensor:
    """``(S, T, 2)`` = ``(log d, sigma = 0)`` per token: ``d`` the camera depth (z) of the
    sphere the token's centre ray hits first (``scene["depth"]``, camera-relative, so the
    same under every test condition), ``BACKGROUND_LOG_DEPTH`` for background tokens."""
    hit = scene["hit_id"] >= 0
    depth = scene["depth"].to(torch.float64)
    logd = torch.where(
        hit, depth.clamp_min(1e-6).log(), torch.full_like(depth, BACKGROUND_LOG_DEPTH)
    )
    return torch.stack((logd, torch.zeros_like(logd)), -1)


def view_batch(
    scene: dict[str, Tensor],
    encoding: nn.Module | None,
    plucker: str | None,
    *,
    condition: str = "id",
    generator: torch.Generator | None = None,
    grid: int = 4,
    image: int = 32,
) -> ViewBatch:
    """Model inputs for ``scene`` under ``condition`` (``generator`` draws its rigid change):
    features, patch positions in the order ``encoding`` reads, per-token cameras (and, for
    an encoding that reads ``k_depth_logsigma``, the true depth: ``known_depth``) for the
    inputs ``encoding`` declares, and Plücker rays in the frame ``plucker`` asks for."""
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    S = scene["points"].shape[0]
    reference = 1 if condition == "ref-swap" else 0
    if condition == "ref-swap":
        world = multiview.set_reference(scene, 1, image)
    else:
        G = condition_transform(condition, S, gen)
        world = scene if G is None else multiview.apply_world_transform(scene, G, image)
    xy = scene["patch_xy"]
    name = getattr(encoding, "name", None)
    pos = xy.flip(-1) if POSITION_ORDER.get(str(name)) == "yx" else xy
    inputs: dict[str, Tensor] = {}
    if encoding is not None:
        declared = {**encoding.required_inputs, **encoding.optional_inputs}
        if "k_viewmats" in declared:
            inputs["k_viewmats"] = expand_cameras(world["viewmats"], scene["camera_index"])
        if "k_Ks" in declared:
            inputs["k_Ks"] = expand_cameras(world["Ks"], scene["camera_index"])
        if DEPTH_INPUT in declared:
            inputs[DEPTH_INPUT] = known_depth(scene)
    if plucker == "plucker-first":
        rays = multiview.set_reference(world, reference, image)["plucker"]
    else:
        rays = world["plucker"]
    return ViewBatch(
        feat=scene["feat"].float(),
        pos=pos.float(),
        plucker=rays.float(),
        inputs=inputs,
        label=scene["label"],
        colour=scene["feat"].argmax(-1),
    )


class _EncoderBlock(nn.Module):
    """Pre-norm, non-causal: ``x + attn(LN x)``, ``x + MLP(LN x)``."""

    def __init__(self, dim: int, attn: MultiHeadAttention, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = attn
        self.mlp = MLP(dim, mlp_ratio)

    def forward(self, x: Tensor, pos: Tensor | None, inputs: dict[str, Tensor]) -> Tensor:
        x = x + self.attn(self.norm1(x), pos=pos, causal=False, inputs=inputs or None)
        return x + self.mlp(self.norm2(x))


class MultiviewEncoder(nn.Module):
    """The shared trunk of the multiview tasks (see the module docstring): token features
    plus a context / target role embedding (and, with ``plucker``, an absolute Plücker
    embedding of each token's ray), then ``depth`` non-causal pre-norm attention blocks with
    the encoding, then a final LayerNorm. ``encode(batch) -> (B, T, dim)``.

    Args:
        feat_dim: token feature width (palette + 1).
        dim, depth, num_heads: sizes (the quick profile's: 96, 4, 2; head 48 divides 8, 16 and 24).
        encoding: registry name acting in attention; ``encoding_options`` its options (the
            scene's ``image_size`` and ``grid`` are filled in, ``scene_options``).
        plucker: None or one of ``PLUCKER_SCHEMES`` (an absolute Plücker embedding).

    One encoding module is shared by the layers (its inputs are per call).
    """

    def __init__(
        self,
        feat_dim: int,
        *,
        dim: int = 96,
        depth: int = 4,
        num_heads: int = 2,
        encoding: str = "prope",
        encoding_options: dict[str, Any] | None = None,
        plucker: str | None = None,
        mlp_ratio: float = 4.0,
        grid: int = 4,
        image: int = 32,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        if plucker is not None and plucker not in PLUCKER_SCHEMES:
            raise ValueError(f"plucker must be None or one of {PLUCKER_SCHEMES}, got {plucker!r}")
        options = {**scene_options(encoding, grid, image), **dict(encoding_options or {})}
        self.encoding = build_encoding(encoding, num_heads, dim // num_heads, options)
        self.plucker_scheme = plucker
        self.embed = nn.Linear(feat_dim, dim)
        self.role = nn.Embedding(2, dim)  # 0 context, 1 target
        self.plucker = PluckerEmbedding(dim) if plucker else None
        self.blocks = nn.ModuleList(
            _EncoderBlock(dim, MultiHeadAttention(dim, num_heads, self.encoding), mlp_ratio)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.dim, self.num_heads = dim, num_heads

    def positions(self, batch: ViewBatch) -> Tensor | None:
        """The patch positions the encoding reads (None for encodings that read none)."""
        return batch.pos if self.encoding is not None and self.encoding.dims == 2 else None

    def encode(self, batch: ViewBatch) -> Tensor:
        """The final embeddings ``(B, T, dim)`` of every token."""
        T = batch.feat.shape[1]
        role = torch.zeros(T, dtype=torch.long, device=batch.feat.device)
        role[batch.context :] = 1
        x = self.embed(batch.feat) + self.role(role)
        if self.plucker is not None:
            x = x + self.plucker(batch.plucker)
        pos = self.positions(batch)
        for block in self.blocks:
            x = block(x, pos, batch.inputs)
        return self.norm(x)


class CorrespondenceModel(MultiviewEncoder):
    """The pointer network: the ``MultiviewEncoder`` trunk (same arguments) and a last
    multi-head scoring layer with the trunk's encoding (module docstring).

    ``forward(batch: ViewBatch) -> (B, P, C)`` pointer logits of each target token over the
    context tokens.
    """

    def __init__(self, feat_dim: int, **options: Any) -> None:
        super().__init__(feat_dim, **options)
        self.query = nn.Linear(self.dim, self.dim)
        self.key = nn.Linear(self.dim, self.dim)

    def forward(self, batch: ViewBatch) -> Tensor:
        B, T, _ = batch.feat.shape
        C = batch.context
        h = self.encode(batch)
        pos = self.positions(batch)
        H, hd = self.num_heads, self.dim // self.num_heads
        q = self.query(h).view(B, T, H, hd).transpose(1, 2)
        k = self.key(h).view(B, T, H, hd).transpose(1, 2)
        logits = scores(q, k, self.encoding, q_pos=pos, k_pos=pos, inputs=batch.inputs or None)
        return logits[:, :, C:, :C].sum(1)


def pointer_loss(logits: Tensor, label: Tensor) -> Tensor:
    """Cross-entropy over the labelled target tokens (``label >= 0``); 0 when none is."""
    ok = label >= 0
    if not bool(ok.any()):
        return logits.sum() * 0.0
    return nn.functional.cross_entropy(logits[ok], label[ok])


def pointer_accuracy(logits: Tensor, label: Tensor) -> tuple[int, int]:
    """``(correct, labelled)``: top-1 hits of ``logits (B, P, C)`` on the labelled targets of
    ``label (B, P)`` (-1 ignored)."""
    ok = label >= 0
    hits = (logits.argmax(-1) == label) & ok
    return int(hits.sum()), int(ok.sum())


def appearance_chance(colour: Tensor, label: Tensor) -> tuple[float, int]:
    """The expected hits of an appearance-only guess (uniform over the context tokens of the
    target's colour) and the number of labelled targets: ``(sum 1 / n_same, labelled)``.
    ``colour (B, T)`` argmax colour ids, ``label (B, P)``."""
    P = label.shape[1]
    C = colour.shape[1] - P
    same = (colour[:, :C][:, None, :] == colour[:, C:][:, :, None]).sum(-1)  # (B, P)
    ok = label >= 0
    return float((1.0 / same[ok].clamp_min(1).double()).sum()), int(ok.sum())
