"""The diagnostic modes of ``relpos analyze``:

* ``receptive-field``: theoretical receptive field of bias encodings (Qin et al. 2024, arXiv
  2307.10156); with ``--model`` (one or several, or a ``relpos extrapolate`` run folder) each
  model's effective receptive field beside the TRF of its own encoding, and the TRF-against-ERF
  plot;
* ``positional-heads``: dimension-level analysis of rotary attention (Hong et al. 2024, arXiv
  2410.08703), on encodings at initialisation or a model (``--model smollm2``), and with
  ``--scalings`` the same model under PI / YaRN / NTK (the heat maps side by side, the top-k
  change);
* ``influence``: position bias from masks and RPEs as a graph rollout (Wu et al. 2025);
* ``causal-mask``: the causal mask as positional information (Kim et al. 2025's simulation, or a
  model's score maps on text);
* ``kv-phase``: phase sensitivity of chunked KV compression (a sanity kernel), and
  with ``--model`` needle retrieval through the model's pooled KV cache
  (``kv_phase_retrieval.png``).

Each checks every flag first (one ``relpos: error: ...`` line naming it), then computes,
writes ``<mode>.json`` and ``<mode>.png`` into ``--out`` and prints a table. Input: encodings
by registry name (``--encodings``) or ``--model`` (``smollm2``, ``random-tiny``, a ``.gguf``
file, a checkpoint folder of ``relpos extrapolate``, or ``fresh:<encoding>``).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from ..arguments import parse_float, parse_int, parse_int_list, parse_names
from .reporting import output_dir, parse_encodings, print_table, write_outputs

__all__ = ["MODES", "RUN", "add_modes"]

MODES = ("receptive-field", "positional-heads", "influence", "causal-mask", "kv-phase")


def _model(args: argparse.Namespace):
    from .model_capture import load_analysis_model

    return load_analysis_model(args.model)


def _f(value: float, digits: int = 4) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.{digits}g}"
    )


# ------------------------------------------------------------------------------ D1


def _receptive_field(args: argparse.Namespace) -> int:
    from .model_capture import load_analysis_model, model_specs, text_tokens
    from .receptive_field import model_receptive_field, plot_receptive_field
    from .receptive_field import theoretical_receptive_field as trf

    head_dim = parse_int(args.head_dim, "--head-dim", minimum=2)
    num_heads = parse_int(args.num_heads, "--num-heads")
    lengths = sorted(set(parse_int_list(args.lengths, "--lengths")))
    epsilon = parse_float(args.epsilon, "--epsilon", above=0.0, below=1.0)
    erf_length = parse_int(args.erf_length, "--erf-length", minimum=2)
    texts = parse_int(args.texts, "--texts")
    seed = parse_int(args.seed, "--seed", minimum=0)
    specs = model_specs(args.model) if args.model else []
    out = output_dir(args.out)
    encodings = parse_encodings(args.encodings, num_heads, head_dim)
    results = []
    for enc in encodings:
        try:
            results.append(trf(enc, lengths, epsilon))
        except ValueError as err:
            raise ValueError(f"--encodings: {err}") from None
    fields = []
    for spec in specs:
        model, encode, label = load_analysis_model(spec, seed=seed, length=erf_length)
        tokens = text_tokens(encode, erf_length + 1, texts)
        fields.append(model_receptive_field(model, tokens, label, epsilon))
    payload = {"results": [r.to_dict() for r in results], "models": [f.to_dict() for f in fields]}
    write_outputs(
        out, "receptive_field", args, payload,
        lambda path: plot_receptive_field(results[0], path, fields),
    )  # fmt: skip
    rows = []
    for r in results:
        for h in range(len(r.trf[0])):
            rows.append(
                [r.encoding, str(h), *(str(row[h]) for row in r.trf), str(r.doubled[h]),
                 "converges" if r.converges[h] else "diverges"]
            )  # fmt: skip
    print_table(
        f"theoretical receptive field (eps {epsilon:g}; Qin et al. 2024)",
        ["encoding", "head", *(f"N={n}" for n in lengths), f"N={2 * lengths[-1]}", "verdict"],
        rows,
        caption="verdict: converges when the TRF moves < 1% from N to 2N",
    )
    if fields:
        print_table(
            f"effective against theoretical receptive field (eps {epsilon:g}, N = "
            f"{erf_length}, {texts} texts)",
            [
                "model",
                "encoding",
                "ERF",
                "50% / 90%",
                "TRF (widest head)",
                "TRF heads",
                "ERF / TRF",
            ],  # fmt: skip
            [
                [
                    f.label,
                    f.encoding,
                    str(f.erf),
                    f"{f.half} / {f.ninety}",
                    "-" if f.trf_max is None else str(f.trf_max),
                    "-" if f.trf_min is None else f"{f.trf_min}..{f.trf_max}",
                    "-" if not f.trf_max else _f(f.erf / f.trf_max, 3),
                ]
                for f in fields
            ],  # fmt: skip
            caption="ERF: smallest window holding 1 - eps of the last token's gradient mass "
            "w.r.t. the input embeddings (50% / 90%: of half / 90% of it); TRF: of the "
            "model's own (trained) encoding at N",
        )
        for f in fields:
            if f.note:
                print(f"{f.label}: no TRF ({f.note})")
    return 0


# ------------------------------------------------------------------------------ D2


def _scalings(value: str | None, factor_text: str) -> list[tuple[str, dict[str, Any] | None]]:
    """``--scalings`` as ``(name, rope_scaling record or None for the model as loaded)``: the
    rotary methods of ``relpos longctx`` (``ROPE_SCALINGS``), at ``--factor``."""
    from ..longctx.methods import METHODS, ROPE_SCALINGS

    if value is None:
        return []
    factor = parse_float(factor_text, "--factor", minimum=1.0)
    names = parse_names(value, "--scalings")
    out: list[tuple[str, dict[str, Any] | None]] = []
    for name in names:
        if name not in ROPE_SCALINGS:
            raise ValueError(
                f"--scalings must list names from {', '.join(ROPE_SCALINGS)}, got {name!r}"
            )
        if name == "baseline":
            out.append((name, None))
            continue
        # the record is checked against the model (its trained length) when it is applied
        scaling = {**METHODS[name].options["scaling"], "factor": factor}
        out.append((f"{name} x{factor:g}", scaling))
    if len({n for n, _ in out}) != len(out):
        raise ValueError(f"--scalings lists a name twice: {value!r}")
    return out


def _positional_heads(args: argparse.Namespace) -> int:
    from .positional_heads import (
        encoding_head_scores,
        model_head_scores,
        plot_head_scores,
        ranking_change,
        scaled_head_scores,
    )

    head_dim = parse_int(args.head_dim, "--head-dim", minimum=2)
    num_heads = parse_int(args.num_heads, "--num-heads")
    length = parse_int(args.length, "--length", minimum=2)
    samples = parse_int(args.samples, "--samples")
    top = parse_int(args.top, "--top")
    seed = parse_int(args.seed, "--seed", minimum=0)
    scalings = _scalings(args.scalings, args.factor)
    if scalings and not args.model:
        raise ValueError("--scalings needs --model (a Llama-family model: smollm2, ...)")
    out = output_dir(args.out)
    results = []
    changes = []
    if args.model:
        from .model_capture import text_tokens

        model, encode, label = _model(args)
        tokens = text_tokens(encode, length, 1)
        variants = scalings or [("baseline", None)]
        if scalings and variants[0][1] is not None:
            variants = [("baseline", None), *variants]  # the reference is always scored
        for name, scaling in variants:
            tag = label if scaling is None else f"{label} {name}"
            if scaling is None:
                results.append(model_head_scores(model, tokens, tag, top))
            else:
                results.append(scaled_head_scores(model, tokens, tag, scaling, top))
        changes = [ranking_change(results[0], r) for r in results[1:]]
    else:
        for enc in parse_encodings(args.encodings, num_heads, head_dim):
            try:
                results.append(
                    encoding_head_scores(enc, length, samples=samples, seed=seed, top_k=top)
                )
            except ValueError as err:
                raise ValueError(f"--encodings: {err}") from None
    payload = {"results": [r.to_dict() for r in results], "changes": changes}
    write_outputs(
        out, "positional_heads", args, payload,
        lambda path: plot_head_scores(results, path, reference=0 if changes else None),
    )  # fmt: skip
    rows = []
    for r in results:
        for layer, head, rho in r.top:
            rows.append([r.label, str(layer), str(head), _f(rho, 3),
                         _f(r.low_frequency_share[layer][head], 3)])  # fmt: skip
    print_table(
        f"positional heads (Hong et al. 2024): top {top} by rho, L = {length}",
        ["input", "layer", "head", "rho", "low-freq share"],
        rows,
        caption="rho: attention-weighted correlation of the dimension centroid with "
        "log(1 + distance); low-freq share: |g| on the upper half of the pairs beyond L/2",
    )
    if changes:

        def heads(items: list[list[int]]) -> str:
            return " ".join(f"{a}.{b}" for a, b in items) or "-"

        print_table(
            f"positional heads under RoPE scalings, against {results[0].label} (same prompt)",
            [
                "scaling",
                f"top-{top} kept",
                "entered",
                "left",
                "mean |d rho|",
                "corr",
                "largest change",
            ],  # fmt: skip
            [
                [
                    c["label"],
                    str(len(c["kept"])),
                    heads(c["entered"]),
                    heads(c["left"]),
                    _f(c["mean_abs_delta"], 3),
                    _f(c["correlation"], 3),
                    f"{c['largest_change'][0]}.{c['largest_change'][1]} "
                    f"({c['largest_change'][2]:+.3f})",
                ]
                for c in changes
            ],  # fmt: skip
            caption="heads as layer.head; corr: Pearson correlation of the two rho maps",
        )
    return 0


# ------------------------------------------------------------------------------ D3


def _influence(args: argparse.Namespace) -> int:
    from .influence import (
        MASKS,
        encoding_attention,
        influence_profile,
        mask_attention,
        plot_influence,
    )

    head_dim = parse_int(args.head_dim, "--head-dim", minimum=2)
    num_heads = parse_int(args.num_heads, "--num-heads")
    length = parse_int(args.length, "--length", minimum=2)
    depth = parse_int(args.depth, "--depth")
    samples = parse_int(args.samples, "--samples")
    gamma = parse_float(args.gamma, "--gamma", above=0.0, maximum=1.0)
    width = parse_int(args.width, "--width")
    seed = parse_int(args.seed, "--seed", minimum=0)
    masks = parse_names(args.masks, "--masks") if args.masks else []
    for m in masks:
        if m not in MASKS:
            raise ValueError(f"--masks must list names from {', '.join(MASKS)}, got {m!r}")
    out = output_dir(args.out)
    encodings = parse_encodings(args.encodings, num_heads, head_dim) if args.encodings else []
    profiles = []
    for m in masks:
        A = mask_attention(m, length, width=width, gamma=gamma)
        profiles.append(influence_profile(f"mask {m}", A, depth, residual=args.residual))
    for enc in encodings:
        A = encoding_attention(enc, length, samples=samples, seed=seed)
        profiles.append(influence_profile(enc.name, A, depth, residual=args.residual))
    if args.model:
        from .model_capture import capture_attention, text_tokens

        model, encode, label = _model(args)
        captures = capture_attention(model, text_tokens(encode, length, 1))
        layers = [c.weights[0].mean(0).double() for c in captures]
        profiles.append(influence_profile(label, layers, len(layers), residual=args.residual))
    if not profiles:
        raise ValueError("give --masks, --encodings or --model")
    write_outputs(
        out, "influence", args, {"profiles": [p.to_dict() for p in profiles]},
        lambda path: plot_influence(profiles, path),
    )  # fmt: skip
    rows = [
        [p.label, str(len(p.psi)), _f(p.first_token[0]), _f(p.first_token[-1]), _f(p.middle[-1]),
         _f(p.psi[-1][-1])]
        for p in profiles
    ]  # fmt: skip
    print_table(
        f"positional influence on the last token (Wu et al. 2025), N = {length}"
        + (", residual" if args.residual else ""),
        ["input", "depth", "psi_1(0)", "psi_t(0)", "middle mass", "psi_t(N-1)"],
        rows,
        caption="psi_t(j) = [A_t ... A_1]_{N-1, j}; middle: sum over N/4 <= j < 3N/4 at depth t",
    )
    return 0


# ------------------------------------------------------------------------------ D4


def _causal_mask(args: argparse.Namespace) -> int:
    from .causal_mask import ScoreMaps, plot_score_maps, simulate_scores

    layers = parse_int(args.layers, "--layers")
    batch = parse_int(args.batch, "--batch")
    seq = parse_int(args.seq, "--seq", minimum=2)
    dim = parse_int(args.dim, "--dim", minimum=2)
    alpha = parse_float(args.alpha, "--alpha", minimum=0.0, below=1.0)
    seed = parse_int(args.seed, "--seed", minimum=0)
    out = output_dir(args.out)
    names = parse_names(args.encodings, "--encodings") if args.encodings else []
    encodings = []
    for name in names:
        if name == "nope":
            encodings.append(None)
            continue
        enc = parse_encodings(name, 1, dim)[0]
        if not enc.has_rotary or enc.has_bias:
            raise ValueError(
                f"--encodings: the simulation takes nope or rotary encodings, got {name!r}"
            )
        encodings.append(enc)
    results = []
    for name, enc in zip(names, encodings, strict=True):
        for causal in (True, False):
            maps = simulate_scores(layers, batch=batch, seq=seq, dim=dim, alpha=alpha,
                                   encoding=enc, causal=causal, seed=seed)  # fmt: skip
            results.append(
                ScoreMaps.of(f"{name} {'causal' if causal else 'bidirectional'}", causal, maps)
            )
    if args.model:
        from .model_capture import capture_attention, text_tokens

        model, encode, label = _model(args)
        captures = capture_attention(
            model, text_tokens(encode, seq, parse_int(args.texts, "--texts"))
        )
        maps = [c.logits.double().mean((0, 1)) for c in captures]
        results.append(ScoreMaps.of(label, True, maps))
    if not results:
        raise ValueError("give --encodings or --model")
    write_outputs(
        out, "causal_mask", args, {"results": [r.to_dict() for r in results]},
        lambda path: plot_score_maps(results, path),
    )  # fmt: skip
    n = max(len(r.non_relativity) for r in results)
    shown = sorted({round(i * (n - 1) / 7) for i in range(8)}) if n > 8 else list(range(n))
    rows = [
        [
            r.label,
            *(_f(r.non_relativity[i], 3) if i < len(r.non_relativity) else "-" for i in shown),
        ]
        for r in results
    ]
    print_table(
        "non-relativity of the mean score maps (Kim et al. 2025)",
        ["input", *(f"l{i}" for i in shown)],
        rows,
        caption="l<n>: layer n; NR = |D|_F / |S - mean|_F (lower triangle); 0 = relative",
    )
    return 0


# ------------------------------------------------------------------------------ D5


def _kv_phase(args: argparse.Namespace) -> int:
    from .kv_phase import phase_sensitivity, plot_phase

    head_dim = parse_int(args.head_dim, "--head-dim", minimum=2)
    num_heads = parse_int(args.num_heads, "--num-heads")
    strides = sorted(set(parse_int_list(args.strides, "--strides")))
    phases = [parse_float(p.strip(), "--reference-phase") for p in args.reference_phase.split(",")]
    if args.pool not in ("before", "after"):
        raise ValueError(f"--pool must be before or after, got {args.pool!r}")
    for s in strides:
        for p in phases:
            if not 0 <= p <= s - 1:
                raise ValueError(
                    f"--reference-phase must lie in [0, stride - 1] = [0, {s - 1}], got {p:g}"
                )
    depths = [parse_float(d.strip(), "--depths", minimum=0.0, maximum=1.0)
              for d in args.depths.split(",")]  # fmt: skip
    prompts = parse_int(args.prompts, "--prompts")
    context = parse_int(args.context, "--context", minimum=16)
    batch = parse_int(args.batch, "--batch")
    seed = parse_int(args.seed, "--seed", minimum=0)
    out = output_dir(args.out)
    retrieval = []
    if args.model:
        from .kv_pooling import phase_retrieval
        from .model_capture import attention_layers

        model, encode, label = _model(args)
        encodings = [attention_layers(model)[0].encoding]
        if encodings[0] is None:
            raise ValueError(f"--model {args.model!r} has no positional encoding")
        for s in strides:
            try:
                retrieval.append(
                    phase_retrieval(model, encode, label, stride=s, depths=depths,
                                    reference_phases=phases, prompts=prompts, context=context,
                                    batch=batch, seed=seed)
                )  # fmt: skip
            except ValueError as err:
                raise ValueError(f"--model {args.model!r}: {err}") from None
    else:
        encodings = parse_encodings(args.encodings, num_heads, head_dim)
    results = []
    for enc in encodings:
        for s in strides:
            for p in phases:
                try:
                    results.append(phase_sensitivity(enc, s, p, pool=args.pool))
                except ValueError as err:
                    raise ValueError(f"--encodings: {err}") from None
    payload = {"results": [r.to_dict() for r in results],
               "retrieval": [r.to_dict() for r in retrieval]}  # fmt: skip
    write_outputs(
        out, "kv_phase", args, payload, lambda path: plot_phase(results, path),
    )  # fmt: skip
    if retrieval:
        from relpos.optional import missing_plot_note

        from .kv_pooling import plot_phase_retrieval

        note = missing_plot_note("kv_phase_retrieval.png")
        if note is None:
            plot_phase_retrieval(retrieval, out / "kv_phase_retrieval.png")
            print(f"wrote {out / 'kv_phase_retrieval.png'}")
    rows = []
    for r in results:
        mean = [sum(col) / len(col) for col in zip(*r.scores, strict=True)]
        rows.append([r.encoding, str(r.stride), f"{r.reference_phase:g}", r.pool,
                     " ".join(f"{v:.4f}" for v in mean), _f(max(r.phase_gap), 3)])  # fmt: skip
    print_table(
        "phase sensitivity of chunked KV compression (sanity kernel)",
        ["encoding", "stride", "phase_r", "pool", "S(phase) (head mean)", "max gap"],
        rows,
        caption="S: score of a matching query against the pooled key, relative to the "
        "uncompressed key",
    )
    for r in retrieval:
        table = []
        for name, cell in r.pools.items():
            for d, depth in enumerate(r.depths):
                table.append([name, f"{depth:g}",
                              " ".join(f"{a:.2f}" for a in cell["accuracy"][d]),
                              " ".join(f"{a:.2f}" for a in cell["digit_accuracy"][d]),
                              " ".join(f"{m:+.2f}" for m in cell["margin"][d]),
                              f"{cell['phase_gap']:.2f} / {cell['digit_phase_gap']:.2f}"
                              if d == 0 else ""])  # fmt: skip
        print_table(
            f"needle retrieval through a pooled KV cache: {r.model}, stride {r.stride}, "
            f"context {r.context} tokens (offset {r.offset}), {r.prompts} prompts per cell, "
            f"{r.seconds:.0f} s",
            [
                "pooling",
                "depth",
                "key accuracy by phase 0..s-1",
                "first digit",
                "margin",
                "phase gap key / digit",
            ],  # fmt: skip
            table,
            caption="pooling: none = uncompressed cache; before = raw keys averaged, rotated "
            "at window start + phi_r; after = rotated keys averaged. phase gap: max - min "
            "accuracy over phases, mean over depths",
        )
    return 0


RUN = {
    "receptive-field": _receptive_field,
    "positional-heads": _positional_heads,
    "influence": _influence,
    "causal-mask": _causal_mask,
    "kv-phase": _kv_phase,
}


def add_modes(mode: Any) -> None:
    """Add the diagnostic sub-modes with ``mode(name, help) -> parser`` (from command.py)."""

    def model_flag(p: argparse.ArgumentParser, what: str) -> None:
        p.add_argument(
            "--model", default=None,
            help=f"{what}: smollm2, random-tiny, a .gguf file or a relpos extrapolate "
            "checkpoint folder",
        )  # fmt: skip

    def shape_flags(p: argparse.ArgumentParser, heads: str, dim: str) -> None:
        p.add_argument("--num-heads", default=heads, help=f"heads ({heads})")
        p.add_argument("--head-dim", default=dim, help=f"channels per head ({dim})")

    p = mode("receptive-field", "theoretical receptive field of bias encodings (Qin et al. 2024)")
    p.add_argument(
        "--encodings", default="alibi,kerple-log", help="registry names (alibi,kerple-log)"
    )
    shape_flags(p, "8", "64")
    p.add_argument("--lengths", default="512,1024,2048", help="context lengths N")
    p.add_argument("--epsilon", default="0.01", help="mass left outside the field (0.01)")
    p.add_argument(
        "--model", default=None,
        help="also the effective receptive field of models beside their encoding's TRF: a "
        "comma-separated list of smollm2, random-tiny, .gguf files, relpos extrapolate "
        "checkpoint folders or run folders (every checkpoint in it), fresh:<encoding> "
        "(the quick profile's model, untrained)",
    )  # fmt: skip
    p.add_argument("--erf-length", default="256", help="tokens of the ERF texts (256)")
    p.add_argument("--texts", default="4", help="texts averaged for the ERF (4)")
    p.add_argument("--seed", default="0", help="seed of fresh: models (0)")

    p = mode("positional-heads", "positional heads of rotary attention (Hong et al. 2024)")
    p.add_argument("--encodings", default="rope", help="rotary registry names (rope)")
    shape_flags(p, "4", "64")
    p.add_argument("--length", default="128", help="tokens (128)")
    p.add_argument("--samples", default="4", help="random (q, k) draws per encoding (4)")
    p.add_argument("--top", default="5", help="positional heads listed (5)")
    p.add_argument("--seed", default="0", help="seed of the draws (0)")
    model_flag(p, "a model instead of --encodings")
    p.add_argument(
        "--scalings", default=None,
        help="with --model: also score it with its RoPE under these relpos longctx scalings "
        "(baseline, pi, ntk, dynamic-ntk, yarn), on the same prompt",
    )  # fmt: skip
    p.add_argument("--factor", default="2", help="factor of --scalings (2, as relpos longctx)")

    p = mode("influence", "position bias of masks and RPEs as a graph rollout (Wu et al. 2025)")
    p.add_argument("--masks", default="causal,decay", help="mask graphs (causal,decay)")
    p.add_argument(
        "--encodings", default="nope,alibi,rope", help="registry names (nope,alibi,rope)"
    )
    shape_flags(p, "4", "64")
    p.add_argument("--length", default="64", help="tokens N (64)")
    p.add_argument("--depth", default="8", help="layers of the rollout (8)")
    p.add_argument("--residual", action="store_true", help="(A + I) / 2 per layer")
    p.add_argument("--gamma", default="0.5", help="decay mask gamma (0.5)")
    p.add_argument("--width", default="4", help="window / prefix width (4)")
    p.add_argument("--samples", default="32", help="(q, k) draws for rotary encodings (32)")
    p.add_argument("--seed", default="0", help="seed (0)")
    model_flag(p, "also a model's per-layer attention on text")

    p = mode("causal-mask", "the causal mask as positional information (Kim et al. 2025)")
    p.add_argument("--encodings", default="nope,rope", help="nope or rotary names (nope,rope)")
    p.add_argument("--layers", default="4", help="residual layers (4)")
    p.add_argument("--batch", default="2000", help="sequences (2000)")
    p.add_argument("--seq", default="50", help="tokens per sequence (50)")
    p.add_argument("--dim", default="64", help="embedding size (64)")
    p.add_argument("--alpha", default="0.5", help="share of the sequence component (0.5)")
    p.add_argument("--seed", default="0", help="seed (0)")
    model_flag(p, "also a model's score maps on text (--seq tokens)")
    p.add_argument("--texts", default="4", help="texts averaged with --model (4)")

    p = mode("kv-phase", "phase sensitivity of chunked KV compression")
    p.add_argument("--encodings", default="rope", help="rotary registry names (rope)")
    shape_flags(p, "1", "64")
    p.add_argument("--strides", default="4,8", help="compression strides (4,8)")
    p.add_argument(
        "--reference-phase", default="0", help="phases of the pooled key, comma-separated"
    )
    p.add_argument("--pool", default="before", help="pool keys before or after RoPE (before)")
    model_flag(
        p, "also needle retrieval through the model's pooled KV cache (both poolings and "
        "none) against phase and depth, and the kernel of its encoding",
    )  # fmt: skip
    p.add_argument("--depths", default="0.25,0.5,0.75", help="needle depths with --model")
    p.add_argument("--prompts", default="20", help="prompts per (depth, phase) cell (20)")
    p.add_argument("--context", default="256", help="context tokens before the question (256)")
    p.add_argument("--batch", default="8", help="prompts per forward with --model (8)")
    p.add_argument("--seed", default="0", help="seed of the keys (0)")
