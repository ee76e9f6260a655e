#!/usr/bin/env python3
"""Renders the pace Grafana dashboard's panels from a live Prometheus as PNG plots, so a person can
check that each panel shows what its title says without a Grafana (none is installable here).

  python3 deploy/test/render_panels.py --prometheus http://127.0.0.1:9090 --minutes 30 --out /tmp/panels

Writes one PNG per panel (NN-title.png: time series as lines with the panel's legend format,
stats as coloured tiles with the panel's thresholds, heatmaps from de-cumulated `le` buckets, one
per repeated scheduler) and dashboard.png, all panels placed on Grafana's 24-column grid as the
dashboard lays them out. Variables resolve as Grafana does on load (test_e2e.py calls render()).
Needs matplotlib (deploy/test/requirements.txt)."""

import argparse
import math
import os
import re
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import LinearSegmentedColormap  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_lib  # noqa: E402
import promql  # noqa: E402

TSCALE = [60.0, "minutes before end"]  # x axis: set by render() from the time span
COLORS = {"green": "#56a64b", "red": "#e02f44", "orange": "#ff9830", "yellow": "#fade2a", "blue": "#3274d9"}


def legend(fmt, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt or "") or str(labels)


def fmt_value(v, unit):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if unit == "percentunit":
        return f"{100 * v:.1f}%"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.2f} s"
    if unit == "reqps":
        return f"{v:.2f} req/s"
    return f"{v:.3g}"


def axis_formatter(unit):
    from matplotlib.ticker import FuncFormatter
    return FuncFormatter(lambda v, _: fmt_value(v, unit))


def threshold_color(v, steps):
    color = "green"
    for s in steps or []:
        if s.get("value") is None or (v is not None and math.isfinite(v) and v >= s["value"]):
            color = s["color"]
    return COLORS.get(color, color)


def draw_timeseries(ax, panel, data, start, end):
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    n = 0
    for target, result in data:
        for s in result:
            xs = [(float(t) - end) / TSCALE[0] for t, _ in s["values"]]
            ys = [float(v) for _, v in s["values"]]
            ax.plot(xs, ys, lw=1.2, label=legend(target.get("legendFormat"), s["metric"]))
            n += 1
    d = panel["fieldConfig"]["defaults"]
    for step in d.get("thresholds", {}).get("steps", []):
        if step.get("value") is not None and d.get("custom", {}).get("thresholdsStyle"):
            ax.axhline(step["value"], ls="--", lw=0.8, color=COLORS.get(step["color"], step["color"]))
    if "min" in d:
        ax.set_ylim(bottom=d["min"])
    if "max" in d:
        ax.set_ylim(top=d["max"] * 1.02)
    ax.yaxis.set_major_formatter(axis_formatter(unit))
    ax.set_xlabel(TSCALE[1], fontsize=7)
    ax.set_xlim((start - end) / TSCALE[0], 0)
    ax.grid(alpha=0.3)
    if n:
        ax.legend(fontsize=6, loc="upper left", ncol=2 if n > 4 else 1, framealpha=0.6)
    else:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes, color="grey")


def draw_stat(ax, panel, data):
    d = panel["fieldConfig"]["defaults"]
    unit, steps = d.get("unit"), d.get("thresholds", {}).get("steps")
    tiles = []
    for target, result in data:
        for s in result:
            tiles.append((legend(target.get("legendFormat"), s["metric"]), float(s["value"][1])))
    ax.set_axis_off()
    if not tiles:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", color="grey")
        return
    w = 1.0 / len(tiles)
    for i, (name, v) in enumerate(tiles):
        ax.add_patch(plt.Rectangle((i * w + 0.01, 0.05), w - 0.02, 0.9, color=threshold_color(v, steps),
                                   transform=ax.transAxes))
        ax.text(i * w + w / 2, 0.62, fmt_value(v, unit), ha="center", va="center", fontsize=13, color="white",
                weight="bold", transform=ax.transAxes)
        ax.text(i * w + w / 2, 0.25, name, ha="center", va="center", fontsize=8, color="white", transform=ax.transAxes)


def draw_heatmap(ax, panel, data, start, end):
    import numpy as np
    result = data[0][1] if data else []
    rows = []
    for s in result:
        le = s["metric"].get("le", "+Inf")
        rows.append((math.inf if le == "+Inf" else float(le), {float(t): float(v) for t, v in s["values"]}))
    if not rows:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes, color="grey")
        return
    rows.sort(key=lambda r: r[0])
    times = sorted(set().union(*[r[1].keys() for r in rows]))
    cum = np.array([[r[1].get(t, np.nan) for t in times] for r in rows])
    per = np.diff(np.vstack([np.zeros((1, len(times))), cum]), axis=0)  # de-cumulate the le buckets
    per = np.clip(np.nan_to_num(per), 0, None)
    keep = np.where(per.sum(axis=1) > 0)[0]
    lo, hi = (keep.min(), keep.max()) if len(keep) else (0, len(rows) - 1)
    per = per[lo:hi + 1]
    labels = [("+Inf" if math.isinf(r[0]) else f"{r[0]:g}") for r in rows[lo:hi + 1]]
    cmap = LinearSegmentedColormap.from_list("o", ["#1f1f1f", "#ff9830", "#fff3c4"])
    x = [(t - end) / TSCALE[0] for t in times]
    mesh = ax.pcolormesh(x + [x[-1] + (x[1] - x[0] if len(x) > 1 else 0.1)], range(per.shape[0] + 1), per ** 0.5,
                         cmap=cmap, shading="flat")
    cb = ax.figure.colorbar(mesh, ax=ax, pad=0.01)
    cb.set_label("sqrt(count per s)", fontsize=6)
    cb.ax.tick_params(labelsize=5)
    ax.set_yticks([i + 0.5 for i in range(len(labels))])
    ax.set_yticklabels([f"<= {lab}" for lab in labels], fontsize=6)
    ax.set_xlabel(TSCALE[1], fontsize=7)
    ax.set_ylabel("bucket (upper bound, " + (panel["options"]["yAxis"].get("unit") or "") + ")", fontsize=7)


def collect(prom, dash, start, end, step, rate_interval):
    """[(panel with resolved title, [(target, result)])] in dashboard order, repeats expanded."""
    values, found, errors = e2e_lib.variable_values(prom, dash)
    values["__range"] = f"{int(end - start)}s"
    values["__rate_interval"] = rate_interval
    out = []
    for p in promql.iter_panels(dash):
        copies = [(values, values)]
        rv = p.get("repeat")
        if rv and found.get(rv):
            copies = [(dict(values, **{rv: promql.regex_escape(v)}), dict(values, **{rv: v})) for v in found[rv]]
        for k, (vals, raw) in enumerate(copies):
            q = dict(p, title=promql.substitute(p["title"], raw), _copy=k, _copies=len(copies))
            data = []
            for t in p["targets"]:
                expr = promql.substitute(t["expr"], vals)
                try:
                    res = prom.query(expr, at=end) if p["type"] == "stat" else prom.query_range(expr, start, end, step)
                except Exception as e:  # noqa: BLE001
                    errors.append(f"{q['title']}: {e}")
                    res = []
                data.append((t, res))
            out.append((q, data))
    return out, errors


def draw(ax, panel, data, start, end):
    ax.set_title(panel["title"], fontsize=8, loc="left")
    if panel["type"] == "timeseries":
        draw_timeseries(ax, panel, data, start, end)
    elif panel["type"] == "stat":
        draw_stat(ax, panel, data)
    elif panel["type"] == "heatmap":
        draw_heatmap(ax, panel, data, start, end)
    ax.tick_params(labelsize=6)


def render(prom, out_dir, start, end, step=5, rate_interval="20s", dash=None):
    """Renders every panel over [start, end]; $__rate_interval becomes rate_interval (Grafana:
    max(4 x scrape interval, step + scrape interval)). Returns (image paths, query errors)."""
    dash = dash or promql.load_dashboard()
    os.makedirs(out_dir, exist_ok=True)
    TSCALE[:] = [1.0, "seconds before end"] if end - start < 300 else [60.0, "minutes before end"]
    panels, errors = collect(prom, dash, start, end, step, rate_interval)
    files = []
    for i, (p, data) in enumerate(panels):
        fig, ax = plt.subplots(figsize=(p["gridPos"]["w"] * 0.5 + 2, p["gridPos"]["h"] * 0.45 + 1))
        draw(ax, p, data, start, end)
        fig.tight_layout()
        name = re.sub(r"[^a-z0-9]+", "-", p["title"].lower()).strip("-")[:70]
        path = os.path.join(out_dir, f"{i + 1:02d}-{name}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        files.append(path)
    # The whole dashboard on Grafana's grid: 24 columns; repeated panels side by side.
    placed, extra, y_shift = [], 0, 0
    rows = [p for p in dash["panels"] if p["type"] == "row"]
    for p, data in panels:
        g = dict(p["gridPos"])
        if p.get("_copies", 1) > 1:
            per_row = min(p.get("maxPerRow", 4), p["_copies"])
            g["w"] = 24 // per_row
            g["x"] = (p["_copy"] % per_row) * g["w"]
            g["y"] += (p["_copy"] // per_row) * g["h"]
        placed.append((p, data, g))
    total_h = max(g["y"] + g["h"] for _, _, g in placed) + extra + y_shift
    fig = plt.figure(figsize=(24, total_h * 0.32))
    for r in rows:
        y = r["gridPos"]["y"]
        fig.text(0.005, 1 - (y + 0.5) / total_h, r["title"], fontsize=12, weight="bold", va="center")
    for p, data, g in placed:
        ax = fig.add_axes([g["x"] / 24 + 0.035 / 2, 1 - (g["y"] + g["h"]) / total_h + 0.9 / total_h,
                           g["w"] / 24 - 0.035, (g["h"] - 1.6) / total_h])
        draw(ax, p, data, start, end)
    path = os.path.join(out_dir, "dashboard.png")
    fig.savefig(path, dpi=60)
    plt.close(fig)
    files.append(path)
    return files, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--step", type=float, default=5)
    ap.add_argument("--rate-interval", default="20s", help="value of $__rate_interval (default 20s: 4 x 5 s scrapes)")
    ap.add_argument("--out", default="deploy/test/out/panels")
    args = ap.parse_args()

    class Remote(e2e_lib.Prometheus):
        def __init__(self, url):
            self.url = url.rstrip("/")

    end = time.time()
    files, errors = render(Remote(args.prometheus), args.out, end - args.minutes * 60, end, args.step, args.rate_interval)
    print("\n".join(files))
    for e in errors:
        print("error:", e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
