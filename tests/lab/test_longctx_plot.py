"""``relpos longctx``'s plot shows every method and the trained context, checked on what the
figure holds (lines, their points and markers, the axis range), not on pixels."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from relpos_lab.longctx.report import figure  # noqa: E402

METHODS = ("baseline", "pi", "yarn", "dynamic")


def _rows(lengths=(1024, 2048)):
    """Every method scores the same: full passkey accuracy, one perplexity per length."""
    return [
        {
            "method": m,
            "length": n,
            "passkey_trials": 4,
            "passkey_correct": 4,
            "passkey_accuracy": 1.0,
            "ppl": 10.0 + n / 1024,
        }
        for m in METHODS
        for n in lengths
    ]


def _method_lines(ax):
    return [line for line in ax.get_lines() if line.get_label() in METHODS]


def test_methods_with_equal_values_stay_visible():
    fig = figure(_rows(), trained=2048)
    for ax in fig.axes:
        lines = _method_lines(ax)
        assert sorted(line.get_label() for line in lines) == sorted(METHODS)
        points = [tuple(line.get_xydata()[0]) for line in lines]
        assert len(set(points)) == len(METHODS)  # no two methods drawn on the same points
        assert len({line.get_marker() for line in lines}) == len(METHODS)


def test_the_trained_context_lies_inside_the_plotted_range():
    """The quick profile measures 1K and 2K of a model trained at 8K: the marker must show."""
    fig = figure(_rows((1024, 2048)), trained=8192)
    for ax in fig.axes:
        low, high = ax.get_xlim()
        dashed = [
            x for x in ax.get_lines() if x.get_linestyle() == "--" and x not in _method_lines(ax)
        ]
        assert dashed, "no trained-context line"
        (x,) = set(dashed[0].get_xdata())
        assert x == 8192 and low < x < high
