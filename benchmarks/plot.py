"""PNG plots from a results JSON of benchmarks.run (needs matplotlib in the venv).

    python -m benchmarks.plot benchmarks/results/<timestamp>.json [--out-dir DIR]

Writes next to the JSON (or into --out-dir):
  <stem>-throughput.png  one-worker processing rate of every system; durable_tasks' drain rate
                         vs worker processes; dispatcher rows/s vs dispatcher processes
  <stem>-latency.png     distribution (CDF) of submit->start latency of every system at the
                         paced rate, and durable_tasks' submit->result
  <stem>-rss.png         durable_tasks worker VmRSS vs tasks done (when the run measured it)
Bars and points are medians over rounds; whiskers span the min..max of the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

DT = "durable_tasks"
DT_COLOR = "black"
#: durable_tasks' README path (def handler, pydantic payload, dict result, defaults) beside its headline.
README_BAR = "durable_tasks, README path"
README_COLOR = "tab:blue"


def _values(summary: dict[str, Any], system: str, metric: str) -> list[float]:
    return list(summary.get(system, {}).get(metric, {}).get("values", []))


def _med_err(values: list[float]) -> tuple[float, list[float]]:
    m = statistics.median(values)
    return m, [m - min(values), max(values) - m]


def _samples(records: list[dict[str, Any]], system: str, metric: str) -> list[float]:
    out: list[float] = []
    for r in records:
        if r.get("system") == system and r.get("metric") == metric:
            out += r.get("samples", [])
    return out


def _save(fig: Any, target: Path) -> None:
    # A 256-colour palette: the plots are lines and flat bars, and the repository keeps them.
    from PIL import Image

    fig.savefig(target, dpi=100)
    with Image.open(target) as image:
        image.convert("RGB").quantize(colors=256).save(target, optimize=True)


def plot(path: Path, out_dir: Path | None = None, stem: str | None = None) -> list[Path]:
    """Draw the plots of the raw result at ``path`` into ``out_dir`` (default: beside it), named
    ``<stem>-*.png`` (default: the result's own stem)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data: dict[str, Any] = json.loads(Path(path).read_text())
    summary, records, meta = data["summary"], data["records"], data["meta"]
    args = data.get("args", {})
    out_dir = out_dir or Path(path).parent
    stem = stem or Path(path).stem
    title_note = f"{args.get('n', '?')} tasks, {args.get('rounds', '?')} round(s), {meta.get('cpus')} CPUs"
    written: list[Path] = []

    # -- throughput ----------------------------------------------------------------------
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2), gridspec_kw={"width_ratios": [1.5, 1, 1]})
    ax = axes[0]
    bars = []
    for system in summary:
        metric = "drain_rate_w1" if system == DT else "processing_rate"
        vals = _values(summary, system, metric)
        if vals:
            bars.append((system, *_med_err(vals)))
    if readme := _values(summary, DT, "readme_drain_rate"):  # the path the README teaches, at defaults
        bars.append((README_BAR, *_med_err(readme)))
    bars.sort(key=lambda b: -b[1])
    if bars:
        names = [b[0] for b in bars]
        ax.bar(
            names,
            [b[1] for b in bars],
            yerr=[[b[2][0] for b in bars], [b[2][1] for b in bars]],
            color=[{DT: DT_COLOR, README_BAR: README_COLOR}.get(n, "tab:gray") for n in names],
            capsize=3,
        )
        for i, b in enumerate(bars):
            ax.annotate(f"{b[1]:,.0f}", (i, b[1] + b[2][1]), ha="center", va="bottom", fontsize=8)
        ax.tick_params(axis="x", rotation=35)
        plt.setp(ax.get_xticklabels(), ha="right", rotation_mode="anchor")
    ax.set_ylabel("tasks/s")
    ax.set_title("one worker process, pre-enqueued no-op tasks (peers at their defaults)")

    ax = axes[1]
    xs: list[int] = []
    ys: list[float] = []
    errs: list[list[float]] = [[], []]
    for w in (1, 2, 4):
        vals = _values(summary, DT, f"drain_rate_w{w}")
        if vals:
            m, e = _med_err(vals)
            xs.append(w)
            ys.append(m)
            errs[0].append(e[0])
            errs[1].append(e[1])
    if xs:
        ax.errorbar(xs, ys, yerr=errs, marker="o", color=DT_COLOR, capsize=3, label="durable_tasks drain")
        ax.plot(xs, [ys[0] * x for x in xs], ls=":", color=DT_COLOR, alpha=0.5, label="linear from 1 worker")
        ax.set_ylim(0, max(y + e for y, e in zip(ys, errs[1], strict=True)) * 1.5)  # the ideal line is clipped
    for metric in sorted(m for m in summary.get(DT, {}) if m.startswith("drain_rate_w1_c")):  # the default's
        label = f"1 worker, concurrency {metric.removeprefix('drain_rate_w1_c')} (default)"
        rate = statistics.median(_values(summary, DT, metric))
        ax.plot([1], [rate], marker="s", color="tab:orange", ls="", label=label)
    ax.set_xticks([1, 2, 4])
    ax.set_xlabel("worker processes")
    ax.set_ylabel("tasks/s")
    if not xs:
        ax.set_ylim(bottom=0)
    ax.set_title(f"durable_tasks: drain vs workers ({meta.get('cpus')} CPUs shared)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)

    ax = axes[2]
    for metric, label, marker in (
        ("dispatch_rate_d{}", "dispatch only (rows/s)", "o"),
        ("pipeline_rate_d{}_w1", "outbox->result, 1 worker (tasks/s)", "^"),
    ):
        xs, ys, errs = [], [], [[], []]
        for d in (1, 2):
            vals = _values(summary, DT, metric.format(d))
            if vals:
                m, e = _med_err(vals)
                xs.append(d)
                ys.append(m)
                errs[0].append(e[0])
                errs[1].append(e[1])
        if xs:
            ax.errorbar(xs, ys, yerr=errs, marker=marker, capsize=3, label=label)
    ax.set_xticks([1, 2])
    ax.set_xlabel("dispatcher processes")
    ax.set_ylabel("per second")
    ax.set_ylim(bottom=0)
    ax.set_title("durable_tasks: dispatchers")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.suptitle(f"Throughput ({title_note})")
    fig.tight_layout()
    target = out_dir / f"{stem}-throughput.png"
    _save(fig, target)
    plt.close(fig)
    written.append(target)

    # -- latency -------------------------------------------------------------------------
    fig, ax = plt.subplots(figsize=(12, 5.5))
    curves = []
    for system in summary:
        s = sorted(_samples(records, system, "start_latency_samples"))
        if s:
            curves.append((statistics.median(s), system, s))
    for _, system, s in sorted(curves):
        ys = [(i + 1) / len(s) for i in range(len(s))]
        style = {"color": DT_COLOR, "lw": 2.4} if system == DT else {"lw": 1.2}
        reached = [
            r["achieved_rate"]
            for r in records
            if r.get("system") == system and r.get("metric") == "start_latency_p50" and r.get("achieved_rate")
        ]
        note = f" (reached {statistics.median(reached):.0f}/s)" if reached else ""
        ax.step([max(x, 0.01) for x in s], ys, where="post", label=f"{system} submit->start{note}", **style)
    res = sorted(_samples(records, DT, "result_latency_samples"))
    if res:
        ys = [(i + 1) / len(res) for i in range(len(res))]
        ax.step([max(x, 0.01) for x in res], ys, where="post", color=DT_COLOR, ls="--", lw=1.6,
                label=f"{DT} submit->result (committed)")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds (log scale)")
    ax.set_ylabel("fraction of tasks")
    ax.axhline(0.5, color="k", lw=0.5, ls=":")
    ax.axhline(0.99, color="k", lw=0.5, ls=":")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"Latency, paced at {args.get('lat_rate', 0):g} tasks/s, warm worker ({title_note})")
    fig.tight_layout()
    target = out_dir / f"{stem}-latency.png"
    _save(fig, target)
    plt.close(fig)
    written.append(target)

    # -- worker memory -------------------------------------------------------------------
    series = next((r["series"] for r in records if r.get("metric") == "worker_rss_series" and r.get("series")), None)
    if series:
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot([p[0] for p in series], [p[1] for p in series], color=DT_COLOR)
        ax.set_xlabel("tasks done")
        ax.set_ylabel("worker VmRSS, MiB")
        ax.set_ylim(0, max(p[1] for p in series) * 1.2)
        ax.grid(True, alpha=0.25)
        ax.set_title(f"durable_tasks: one worker's resident memory over {series[-1][0]:,} tasks")
        fig.tight_layout()
        target = out_dir / f"{stem}-rss.png"
        _save(fig, target)
        plt.close(fig)
        written.append(target)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--out-dir", type=Path, default=None)
    a = ap.parse_args()
    for png in plot(a.results, a.out_dir):
        print(png)


if __name__ == "__main__":
    main()
