"""The chart of scripts/bench (bench_report.py draws it): one bar per row of
the table, its ratio to the baseline on a log scale with the row's target
marked, and the idle rows' CPU ticks (target 0) in a panel of their own.
Green: target met; red: missed; grey: no target (reported beside) or no figure.
"""
import sys


def _colour(row):
    return {True: "#2e7d32", False: "#c62828", None: "#9e9e9e"}[row["met"]]


def _label(row):
    target = "" if row["target_op"] in (None, "==") else "  [%s %.2f]" % (row["target_op"], row["target"])
    return "%s (%s)%s" % (row["measure"], row["transport"], target)


def draw(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_chart: no chart: python3-matplotlib is not installed", file=sys.stderr)
        return False
    ratio_rows = [r for r in rows if r["unit"] != "ticks"]
    tick_rows = [r for r in rows if r["unit"] == "ticks"]
    heights = [max(1, len(ratio_rows)), max(1, len(tick_rows))]
    fig, axes = plt.subplots(2, 1, figsize=(11, 1.5 + 0.28 * sum(heights)),
                             gridspec_kw={"height_ratios": heights})
    ax = axes[0]
    for i, r in enumerate(ratio_rows):
        ratio = r["ratio"]
        if ratio:
            ax.barh(i, ratio, color=_colour(r), height=0.7)
            ax.text(ratio, i, " %.2f" % ratio, va="center", fontsize=7)
        else:
            ax.text(1, i, " skipped" if r.get("skipped") else " n/a", va="center", fontsize=7)
        if r["target_op"]:
            ax.plot([r["target"]] * 2, [i - 0.45, i + 0.45], color="black", linewidth=2)
    ax.set_xscale("log")
    ax.axvline(1.0, color="#555555", linewidth=0.6, linestyle=":")
    ax.set_yticks(range(len(ratio_rows)), [_label(r) for r in ratio_rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("gpusock / baseline, log scale (black bar: the target; [<= x]: at most, [>= x]: at least)",
                  fontsize=8)
    ax.set_title("gpusock against its baselines, same run", fontsize=10)

    ax = axes[1]
    for i, r in enumerate(tick_rows):
        server, client = r.get("server_ticks") or 0, r.get("client_ticks") or 0
        ax.barh(i, server, color=_colour(r), height=0.7, label="server" if i == 0 else None)
        ax.barh(i, client, left=server, color=_colour(r), alpha=0.5, height=0.7, label="client" if i == 0 else None)
        kernel = "n/a" if r.get("kernel_server_ticks") is None else "%d + %d" % (
            r["kernel_server_ticks"], r.get("kernel_client_ticks") or 0)
        ax.text(server + client, i, " %d + %d (kernel TCP %s)" % (server, client, kernel), va="center", fontsize=7)
    if tick_rows:
        ax.legend(fontsize=7, loc="lower right")
    ax.set_yticks(range(len(tick_rows)), [_label(r) for r in tick_rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(left=0, right=max([1] + [(r.get("server_ticks") or 0) + (r.get("client_ticks") or 0)
                                         for r in tick_rows]) * 1.6)
    ax.set_xlabel("CPU ticks while idle, server + client (target 0)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print("chart written to %s" % path)
    return True
