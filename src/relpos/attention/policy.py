"""The rule ``backend="auto"`` applies: of the backends that compute a call exactly (its
*candidates*, decided by the engine from capabilities: ``api.candidate_backends``), the one
measured fastest for calls like it.

A call is reduced to a few facts (``CallFacts``): device type, dtype class, its *kind* (how
its score term is built: ``plain`` without a bias, ``toeplitz`` for a per-distance table,
``learned-toeplitz`` for one whose values take gradients in the call (the encoding's
parameters in a training step: the dense path scatters an ``L x L`` gradient into the
table, the Toeplitz tiles sum it by antidiagonal, which moves the crossover),
``row-affine`` for a bias the chunked backend reads from two tables per block of rows
(FIRE's forward above its threshold), ``tile`` for a bias evaluated per pair, ``band`` for
DeBERTa-style two-sided tables, and the probability paths ``probabilities`` /
``piecewise-sdpa`` / ``row-suffix``), causal or not, forward or training step, its size
``B * H * Lq * Lk`` and the registered name of its encoding. A ``PolicyTable`` maps the key
``device/dtype/kind/causal|full/forward|train`` to segments of size, each holding the
backends measured there, fastest first; a key may also be held for one encoding,
``device/dtype/kind/causal|full/forward|train/<encoding>`` (an *encoding key*), measured on
that encoding alone. ``select_backend(facts, table)`` is a pure function of the two: the
first ranked backend that is a candidate, from the call's encoding key where the table has
one, else from its key; where the table has no measurement for either (another device, a
kind never calibrated) ``UNMEASURED_ORDER`` decides.

Tables come from measurement, never from typed thresholds: ``relpos bench --calibrate``
times every candidate of representative calls on a grid of lengths in interleaved rounds
and ``derive_table`` turns the medians into segments (a boundary between two measured
lengths lies at their geometric mean; several representatives of one key are ranked by
their worst ratio to the fastest). One ranking per key serves every encoding of the key
only as well as their costs agree: where the key's choice is more than ``ENCODING_KEY_ABOVE``
of the fastest backend for one representative at a measured size, ``derive_table`` also
writes that representative's encoding key, from its measurements alone (encodings never
calibrated follow the key). The shipped table (``auto_table.json`` beside this
module) records the machine and command that measured it. A per-machine table, written by
``relpos bench --calibrate``, lives at ``machine_table_path()`` (``$RELPOS_AUTO_TABLE``, else
``$XDG_CACHE_HOME/relpos/auto_table.json``, else ``~/.cache/relpos/auto_table.json``); when
present its keys replace the shipped ones, with the shipped encoding keys under them. It is
read once per process (``reload`` reads it again); a file that cannot be read or does not
parse as a table is reported by name in a warning and the shipped table is used.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "KINDS",
    "BACKEND_NAMES",
    "UNMEASURED_ORDER",
    "CallFacts",
    "ENCODING_KEY_ABOVE",
    "Segment",
    "encoding_key",
    "general_key",
    "table_key",
    "PolicyTable",
    "PolicyTableError",
    "Point",
    "dtype_class",
    "select_backend",
    "derive_table",
    "parse_table",
    "load_table",
    "shipped_table",
    "machine_table_path",
    "active_table",
    "reload",
    "write_table",
]

FORMAT = 1
#: the kinds of call a table distinguishes (``CallFacts.kind``)
KINDS = (
    "plain",
    "toeplitz",
    "learned-toeplitz",
    "row-affine",
    "tile",
    "band",
    "probabilities",
    "piecewise-sdpa",
    "row-suffix",
)
#: the softmax backends a table may rank
BACKEND_NAMES = ("eager", "sdpa", "chunked", "flex", "fold")
#: the order among candidates where a table has no measurement for a call's key, per device
#: type: fused kernels first, ``flex`` where it compiles fast kernels (not on CPU, where each
#: new shape compiles for seconds), ``chunked`` last (it runs every call in O(L) memory)
UNMEASURED_ORDER = {
    "cpu": ("fold", "sdpa", "eager", "chunked"),
    "other": ("fold", "sdpa", "eager", "flex", "chunked"),
}
#: a representative whose time under its key's choice exceeds its fastest backend's by more
#: than this factor, at some measured size, gets its own encoding key (``derive_table``)
ENCODING_KEY_ABOVE = 1.10
SHIPPED_PATH = Path(__file__).with_name("auto_table.json")
TABLE_ENV = "RELPOS_AUTO_TABLE"


class PolicyTableError(ValueError):
    """A table file that is not a valid policy table (the message names what is wrong)."""


def dtype_class(dtype: torch.dtype) -> str:
    """The dtype a table is keyed by: ``bfloat16`` for half types, ``float32`` otherwise
    (float64 calls share float32's ranking)."""
    return "bfloat16" if dtype in (torch.float16, torch.bfloat16) else "float32"


@dataclass(frozen=True)
class CallFacts:
    """What the choice depends on. ``elements``: ``B * H * Lq * Lk``; ``candidates``: the
    backends that compute the call exactly (never empty); ``encoding``: the registered name
    of the call's encoding ("" for none)."""

    device: str
    dtype: str
    kind: str
    causal: bool
    training: bool
    elements: int
    candidates: tuple[str, ...]
    encoding: str = ""

    @property
    def key(self) -> str:
        return table_key(self.device, self.dtype, self.kind, self.causal, self.training)

    @property
    def encoding_key(self) -> str | None:
        """The key measured on this call's encoding alone (None without an encoding)."""
        return encoding_key(self.key, self.encoding) if self.encoding else None


def table_key(device: str, dtype: str, kind: str, causal: bool, training: bool) -> str:
    """``device/dtype/kind/causal|full/forward|train``."""
    return (
        f"{device}/{dtype}/{kind}/{'causal' if causal else 'full'}/"
        f"{'train' if training else 'forward'}"
    )


def encoding_key(key: str, encoding: str) -> str:
    """``key/<encoding>``: ``key`` (``table_key``) measured on one encoding alone."""
    return f"{key}/{encoding}"


def general_key(key: str) -> str:
    """The ``device/dtype/kind/causal|full/forward|train`` part of a key or encoding key."""
    return "/".join(key.split("/")[:5])


@dataclass(frozen=True)
class Segment:
    """Calls of at most ``up_to`` elements (None: no bound) after the previous segment's:
    the backends measured there, fastest first."""

    up_to: int | None
    ranking: tuple[str, ...]


@dataclass(frozen=True)
class PolicyTable:
    """Segments per key, plus where the table came from (``source``) and what measured it
    (``meta``: machine, threads, command, date)."""

    entries: Mapping[str, tuple[Segment, ...]]
    source: str = "empty"
    meta: Mapping[str, Any] = field(default_factory=dict)
    _bounds: dict[str, list[float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bounds = {
            key: [math.inf if s.up_to is None else s.up_to for s in segs]
            for key, segs in self.entries.items()
        }
        object.__setattr__(self, "_bounds", bounds)

    def ranking(self, key: str, elements: int) -> tuple[str, ...] | None:
        """The measured ranking for calls of ``elements`` under ``key``, or None."""
        segments = self.entries.get(key)
        if not segments:
            return None
        i = bisect.bisect_left(self._bounds[key], elements)
        return segments[min(i, len(segments) - 1)].ranking

    def merged(self, other: PolicyTable) -> PolicyTable:
        """This table with ``other``'s keys replacing its own; a key ``other`` holds takes
        this table's encoding keys under it away (``other`` measured the key, and holds the
        encoding keys its measurement needs)."""
        keys = {general_key(k) for k in other.entries}
        kept = {
            k: segs
            for k, segs in self.entries.items()
            if k == general_key(k) or general_key(k) not in keys
        }
        return PolicyTable(
            {**kept, **other.entries},
            f"{other.source} over {self.source}",
            {"base": dict(self.meta), "override": dict(other.meta)},
        )

    def with_size_measured(
        self, key: str, low: int, high: int | None, ranking: Sequence[str]
    ) -> PolicyTable:
        """This table with ``ranking`` for calls of ``key`` above ``low`` and up to ``high``
        elements (None: no bound), the rest of the key's segments as they were: what
        ``derive_table`` gives when a size is measured between two measured neighbours,
        ``low`` and ``high`` being the geometric means to them."""
        if high is not None and high <= low:
            raise ValueError(f"with_size_measured: high {high} must exceed low {low}")
        old = self.entries.get(key, ())
        segments: list[Segment] = []
        previous = 0
        for seg in old:  # the old segments up to low
            if previous >= low:
                break
            bound = low if seg.up_to is None else min(seg.up_to, low)
            segments.append(Segment(bound, seg.ranking))
            previous = bound
        segments.append(Segment(high, tuple(ranking)))
        if high is not None:  # the old segments above high
            for seg in old:
                if seg.up_to is None or seg.up_to > high:
                    segments.append(seg)
            if not old or old[-1].up_to is not None:
                segments[-1] = Segment(None, segments[-1].ranking)
        merged: list[Segment] = []
        for seg in segments:  # neighbours with one ranking merge, as in derive_table
            if merged and merged[-1].ranking == seg.ranking:
                merged[-1] = Segment(seg.up_to, seg.ranking)
            else:
                merged.append(seg)
        return PolicyTable({**self.entries, key: tuple(merged)}, self.source, self.meta)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "meta": dict(self.meta),
            "entries": {
                key: [[s.up_to, list(s.ranking)] for s in segs]
                for key, segs in sorted(self.entries.items())
            },
        }


def select_backend(facts: CallFacts, table: PolicyTable) -> str:
    """The backend ``auto`` runs: the first candidate in the table's ranking for the call's
    encoding key (where the table has one) and size, else in its ranking for the call's key,
    else in the device's ``UNMEASURED_ORDER``; else the first candidate."""
    if not facts.candidates:
        raise ValueError("select_backend: a call needs at least one candidate backend")
    own = facts.encoding_key
    rankings = (
        (own and table.ranking(own, facts.elements)) or (),
        table.ranking(facts.key, facts.elements) or (),
        UNMEASURED_ORDER["cpu" if facts.device == "cpu" else "other"],
    )
    for order in rankings:
        for name in order:
            if name in facts.candidates:
                return name
    return facts.candidates[0]


# ------------------------------------------------------------------------------ derivation
@dataclass(frozen=True)
class Point:
    """One measured grid point: ``key``, ``elements``, the representative (``case``, a
    label), the median seconds of each backend that ran it, and the registered name of the
    representative's encoding (``encoding``; "" for none: then it never gets an encoding
    key)."""

    key: str
    elements: int
    case: str
    times: Mapping[str, float]
    encoding: str = ""


def _measured(p: Point) -> dict[str, float]:
    """The backends of ``p`` with a usable time (positive and finite)."""
    return {b: t for b, t in p.times.items() if t > 0 and math.isfinite(t)}


def _ranking(points: Sequence[Point]) -> tuple[str, ...]:
    """Backends by their worst ratio to the fastest backend of each representative (ties by
    name, so the order is reproducible)."""
    worst: dict[str, float] = {}
    for p in points:
        times = _measured(p)
        if not times:
            continue
        best = min(times.values())
        for b, t in times.items():
            worst[b] = max(worst.get(b, 0.0), t / best)
    return tuple(sorted(worst, key=lambda b: (worst[b], b)))


def _segments(sizes: Mapping[int, Sequence[Point]]) -> tuple[Segment, ...]:
    """Per measured size a ranking (``_ranking``); neighbouring sizes with the same ranking
    merge; the boundary between two measured sizes is their geometric mean."""
    ordered = sorted(sizes)
    segments: list[Segment] = []
    for n, e in enumerate(ordered):
        ranking = _ranking(sizes[e])
        if not ranking:
            continue
        up_to = None if n + 1 == len(ordered) else math.isqrt(e * ordered[n + 1])
        if segments and segments[-1].ranking == ranking:
            segments[-1] = Segment(up_to, ranking)
        else:
            segments.append(Segment(up_to, ranking))
    if segments:
        segments[-1] = Segment(None, segments[-1].ranking)
    return tuple(segments)


def _key_choice_costs(points: Sequence[Point], ranking: Sequence[str]) -> float:
    """How much slower than its fastest backend one representative runs under ``ranking``
    (its first ranked backend the representative ran), worst over ``points``."""
    worst = 1.0
    for p in points:
        times = _measured(p)
        chosen = next((b for b in ranking if b in times), None)
        if chosen is not None:
            worst = max(worst, times[chosen] / min(times.values()))
    return worst


def derive_table(points: Iterable[Point], meta: Mapping[str, Any] | None = None) -> PolicyTable:
    """Segments from measurements: per key and size a ranking (``_ranking`` over the
    representatives measured there); neighbouring sizes with the same ranking merge; the
    boundary between two measured sizes is their geometric mean. Where the key's ranking
    makes one representative's encoding run more than ``ENCODING_KEY_ABOVE`` of its fastest
    backend at some measured size, that encoding also gets its encoding key, derived the
    same way from its own points alone."""
    by_key: dict[str, dict[int, list[Point]]] = {}
    for p in points:
        if p.key.count("/") != 4:
            raise ValueError(f"derive_table: key {p.key!r} is not device/dtype/kind/mask/mode")
        by_key.setdefault(p.key, {}).setdefault(int(p.elements), []).append(p)
    entries: dict[str, tuple[Segment, ...]] = {}
    for key, sizes in by_key.items():
        segments = _segments(sizes)
        if not segments:
            continue
        entries[key] = segments
        table = PolicyTable({key: segments})
        by_encoding: dict[str, dict[int, list[Point]]] = {}
        for e, ps in sizes.items():
            for p in ps:
                if p.encoding:
                    by_encoding.setdefault(p.encoding, {}).setdefault(e, []).append(p)
        for name, own in sorted(by_encoding.items()):
            if any(
                _key_choice_costs(ps, table.ranking(key, e) or ()) > ENCODING_KEY_ABOVE
                for e, ps in own.items()
            ):
                entries[encoding_key(key, name)] = _segments(own)
    return PolicyTable(entries, "derived", dict(meta or {}))


# ------------------------------------------------------------------------------ files
def parse_table(data: object, source: str) -> PolicyTable:
    """A ``PolicyTable`` from its JSON form; ``PolicyTableError`` naming what is wrong."""
    if not isinstance(data, dict):
        raise PolicyTableError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise PolicyTableError(f"{source}: format {data.get('format')!r}, expected {FORMAT}")
    raw = data.get("entries")
    if not isinstance(raw, dict):
        raise PolicyTableError(f"{source}: 'entries' must be an object of key -> segments")
    entries: dict[str, tuple[Segment, ...]] = {}
    for key, segs in raw.items():
        parts = key.split("/") if isinstance(key, str) else []
        if (
            len(parts) not in (5, 6)
            or (len(parts) == 6 and not parts[5])
            or parts[2] not in KINDS
            or parts[3] not in ("causal", "full")
            or parts[4] not in ("forward", "train")
        ):
            raise PolicyTableError(
                f"{source}: key {key!r} is not device/dtype/kind/causal|full/forward|train"
                f"[/encoding] with kind in {KINDS}"
            )
        if not isinstance(segs, list) or not segs:
            raise PolicyTableError(f"{source}: {key}: expected a non-empty list of segments")
        out, last = [], -1
        for n, seg in enumerate(segs):
            ok = isinstance(seg, list) and len(seg) == 2 and isinstance(seg[1], list)
            up_to = seg[0] if ok else None
            final = n + 1 == len(segs)
            if ok and final:
                ok = up_to is None
            elif ok:
                ok = isinstance(up_to, int) and not isinstance(up_to, bool) and up_to > last
            if ok:
                ok = bool(seg[1]) and all(b in BACKEND_NAMES for b in seg[1])
                ok = ok and len(set(seg[1])) == len(seg[1])
            if not ok:
                raise PolicyTableError(
                    f"{source}: {key}: segment {n} must be [up_to, [backend, ...]] with "
                    f"increasing integer bounds, null for the last, and distinct backends of "
                    f"{BACKEND_NAMES}; got {seg!r}"
                )
            last = up_to if up_to is not None else last
            out.append(Segment(up_to, tuple(seg[1])))
        entries[key] = tuple(out)
    meta = data.get("meta", {})
    return PolicyTable(entries, source, meta if isinstance(meta, dict) else {})


def load_table(path: str | os.PathLike) -> PolicyTable:
    """Read and check a table file; ``PolicyTableError`` naming the file and the problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise PolicyTableError(f"{path}: cannot be read ({err.strerror or err})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PolicyTableError(f"{path}: not JSON ({err})") from None
    return parse_table(data, str(path))


def write_table(table: PolicyTable, path: str | os.PathLike) -> Path:
    """Write ``table`` as JSON (through a temporary file, so a reader never sees half)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(table.to_json(), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def machine_table_path() -> Path | None:
    """Where this machine's table lives: ``$RELPOS_AUTO_TABLE`` (empty: no machine table),
    else ``$XDG_CACHE_HOME/relpos/auto_table.json``, else ``~/.cache/relpos/...``."""
    explicit = os.environ.get(TABLE_ENV)
    if explicit is not None:
        return Path(explicit).expanduser() if explicit.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "relpos" / "auto_table.json"


def shipped_table() -> PolicyTable:
    """The table measured for the release (``auto_table.json``)."""
    return _shipped()


@lru_cache(maxsize=1)
def _shipped() -> PolicyTable:
    try:
        return load_table(SHIPPED_PATH)
    except PolicyTableError as err:  # a broken install: auto still runs, unmeasured
        warnings.warn(
            f"relpos: the shipped auto-backend table is unusable ({err}); backend='auto' "
            f"falls back to its unmeasured order",
            RuntimeWarning,
            stacklevel=2,
        )
        return PolicyTable({}, "none")


@lru_cache(maxsize=1)
def active_table() -> PolicyTable:
    """The table ``auto`` reads: the machine table's keys over the shipped ones."""
    base = _shipped()
    path = machine_table_path()
    if path is None or not path.exists():
        return base
    try:
        return base.merged(load_table(path))
    except PolicyTableError as err:
        warnings.warn(
            f"relpos: ignoring the auto-backend table {err}; using the shipped table "
            f"(rewrite it with `relpos bench --calibrate` or delete it)",
            RuntimeWarning,
            stacklevel=2,
        )
        return base


def reload() -> PolicyTable:
    """Read the tables again (after ``relpos bench --calibrate`` wrote one)."""
    _shipped.cache_clear()
    active_table.cache_clear()
    return active_table()
