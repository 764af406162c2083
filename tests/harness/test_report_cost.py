"""A report figure is drawn once: savefig's bbox_inches="tight" drew every figure twice (once to find
its box, once to write it), most of the report's time."""

from __future__ import annotations

import matplotlib.figure
import matplotlib.pyplot as plt

from attnbench.report import plots


def test_a_figure_is_drawn_once_and_cropped_to_its_artists(monkeypatch):
    draws = []
    real = matplotlib.figure.Figure.draw
    monkeypatch.setattr(matplotlib.figure.Figure, "draw", lambda self, r: (draws.append(r), real(self, r))[1])
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    ax.plot([1, 2, 3], [1, 4, 9])
    ax.set_title("a title")
    fig.legend(["line"], loc="upper center", bbox_to_anchor=(0.5, 0.0))  # outside the figure: the box grows
    uri = plots._uri(fig)
    assert len(draws) == 1
    assert uri.startswith("data:image/svg+xml,") and "a title" in uri
    width, height = (float(v) for v in uri.split("viewBox='0 0 ", 1)[1].split("'", 1)[0].split())
    assert height > 3.4 * 72  # the legend below the axes is inside the picture
