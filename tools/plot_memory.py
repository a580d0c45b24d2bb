#!/usr/bin/env python3
"""Draws a zshard trace's memory timeline: each rank's device memory by ledger category over the
traced step (stacked), with the plan's peak as a line when the trace carries it.

    python3 tools/plot_memory.py trace.json memory.png [--title TEXT]

The trace is the Chrome/Perfetto JSON that engine_config::trace writes (02_train_gpt --trace
FILE). Needs matplotlib (pip install matplotlib). Exit status: 0 written, 2 bad input (a
message on stderr, no traceback), 3 matplotlib missing. The trace is read before matplotlib is
imported, so bad input is reported as such with or without it.
"""
import argparse
import json
import sys

CATEGORIES = ["sharded_params", "gathered_params", "grad_buckets", "grad_shards",
              "optimizer_state", "activations", "scratch"]
MIB = 1024.0 * 1024.0


class BadInput(Exception):
    """Input the script cannot use: reported on stderr with exit status 2."""


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    except OSError as e:
        raise BadInput(f"cannot read trace '{path}': {e.strerror or e}")
    except ValueError as e:  # not JSON, or not text at all (UnicodeDecodeError is a ValueError)
        raise BadInput(f"'{path}' is not a JSON trace ({type(e).__name__}: {e})")
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise BadInput(f"'{path}' has no traceEvents list: not a Chrome trace")
    series = {}  # rank -> [(ts_us, [bytes per category])]
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "C" and e.get("cat") == "memory":
            try:
                args = e.get("args", {})
                series.setdefault(int(e["pid"]), []).append((float(e["ts"]), [int(args.get(c, 0)) for c in CATEGORIES]))
            except (KeyError, TypeError, ValueError, AttributeError) as err:
                raise BadInput(f"'{path}' has a malformed memory counter event ({err!r}): {json.dumps(e)[:200]}")
    if not series:
        raise BadInput(f"'{path}' has no memory counter events (was the trace recording?)")
    meta = trace.get("otherData", {})
    return series, meta if isinstance(meta, dict) else {}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    try:
        series, meta = load(a.trace)
    except BadInput as e:
        print(f"plot_memory: {e}", file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_memory: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 3
    plan_peak = meta.get("plan_peak_bytes")
    ranks = sorted(series)
    fig, axes = plt.subplots(len(ranks), 1, figsize=(9, 1.6 * len(ranks) + 1.0), sharex=True, squeeze=False)
    t0 = min(s[0][0] for s in series.values())
    ymax = max(sum(v) for s in series.values() for _, v in s)
    if plan_peak:
        ymax = max(ymax, plan_peak)
    for ax, r in zip(axes[:, 0], ranks):
        pts = sorted(series[r], key=lambda p: p[0])
        # a step function: each sample holds until the next one
        xs, ys = [], [[] for _ in CATEGORIES]
        for i, (t, v) in enumerate(pts):
            t_ms = (t - t0) / 1000.0
            if i:
                xs.append(t_ms)
                for c in range(len(CATEGORIES)):
                    ys[c].append(ys[c][-1])
            xs.append(t_ms)
            for c, b in enumerate(v):
                ys[c].append(b / MIB)
        ax.stackplot(xs, ys, labels=CATEGORIES, linewidth=0)
        if plan_peak:
            ax.axhline(plan_peak / MIB, color="black", linestyle="--", linewidth=1, label="plan peak")
        ax.set_ylim(0, ymax / MIB * 1.08)
        ax.set_ylabel(f"rank {r}\nMiB")
        ax.grid(axis="y", alpha=0.3)
    axes[-1, 0].set_xlabel("time in the traced step, ms")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=4, fontsize=8, frameon=False)
    step = meta.get("traced_step")
    title = a.title or ("device memory by ledger category" + (f", step {int(step)}" if step is not None else ""))
    fig.suptitle(title, y=0.99, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.90))
    try:
        fig.savefig(a.png, dpi=80)
    except OSError as e:
        print(f"plot_memory: cannot write '{a.png}': {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"plot_memory: {len(ranks)} rank(s), peak {ymax / MIB:.2f} MiB -> {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
