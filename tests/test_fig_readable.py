"""Every figure reads at a glance: a title of at most two lines, legends inside the
canvas, no caption blocks, no run ids, commit hashes, model form numbers or blind-set
names in its text, and at most about 1,300 px wide (readable scaled to the README's width).
Figures drawn from reduced inputs where the full ones are slow."""
import re

import pytest

pytest.importorskip("matplotlib")

#: what must not appear in figure text (the measurement history lives in docs/)
HISTORY = re.compile(r"blind|run[ _]id|\(run |op_breakdown-|decode_bench-|\bform \d|"
                     r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b|commit")


def _data(name):
    from analysis import results as R
    from analysis.figures import get
    f = get(name)
    if name == "fig8_bench":
        return f, f.generate()
    if name == "fig9_levels":
        return f, f.generate(Ns=[1024, 4096, 16384], bhs=[1, 16])
    if name == "fig10_grid_order":
        return f, f.generate(Ns=[4096, 16384], bhs=[1, 16])
    if name == "fig11_levels_validation":
        return f, f.generate(select=lambda r: r["config"]["N"] <= 4096)
    if name in ("fig12_runtime_validation", "fig16_kernel_roofline"):
        return f, f.generate(rows=R.load("runtime_validation"), max_calls=6)
    return f, f.generate()


def _texts(fig):
    from matplotlib.text import Text
    return [t for t in fig.findobj(Text) if t.get_text() and t.get_visible()]


@pytest.mark.parametrize("name", [
    "fig1_traffic_vs_M", "fig2_traffic_vs_N", "fig3_block_size", "fig4_tiling_heatmap",
    "fig5_roofline", "fig6_memory_footprint", "fig8_bench", "fig9_levels",
    "fig10_grid_order", "fig11_levels_validation", "fig12_runtime_validation",
    "fig13_time_breakdown", "fig14_decode", "fig15_window", "fig16_kernel_roofline"])
def test_figure_reads_at_a_glance(name):
    import matplotlib.pyplot as plt
    from analysis.figures._style import DPI
    f, data = _data(name)
    fig = f.plot(data)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        sup = fig._suptitle.get_text() if fig._suptitle is not None else ""
        assert sup.count("\n") <= 1, sup
        for ax in fig.axes:
            assert ax.get_title().count("\n") <= 1, ax.get_title()
        assert not [t.get_text() for t in fig.texts if t is not fig._suptitle], \
            "caption text under the figure"
        for t in _texts(fig):
            assert not HISTORY.search(t.get_text()), t.get_text()
        box = fig.bbox
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + fig.legends
        for lg in legends:
            e = lg.get_window_extent(renderer)
            assert e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1 and e.y0 >= box.y0 - 1 \
                and e.y1 <= box.y1 + 1, f"legend outside the canvas: {e} vs {box}"
        assert fig.get_figwidth() * DPI <= 1300
    finally:
        plt.close(fig)
