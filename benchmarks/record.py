"""Where a benchmark run's results go, and which of them the repository keeps.

    python -m benchmarks.record benchmarks/results/raw/<stamp>.json   # re-record a raw run as latest

Every run of ``benchmarks.run`` writes its raw output (every record, latency samples and RSS
series included: megabytes) to ``benchmarks/results/raw/<stamp>.json``, which git ignores.
A full run (the harness's default arguments) made at a commit is also *recorded*: its compact
summary becomes ``benchmarks/results/latest.json`` (medians and per-round values of every
metric, ratios to the best peer, latency percentiles, machine facts, the commit: tens of KB)
and its plots ``latest-throughput.png``, ``latest-latency.png``, ``latest-rss.png``. Those are
what git tracks and what docs/performance.md quotes; a previous run is in git history.

A run has a commit id when ``git rev-parse HEAD`` answers and ``git status --porcelain
--untracked-files=no`` is empty, at the start of the run and again at its end with the same
HEAD: the measured code is a commit's. Untracked files are not looked at (the package's code
is tracked). A full run refuses to start without a commit id; a partial run writes raw output
only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["LATEST", "RAW", "RESULTS", "NotRecordable", "commit_id", "compact", "main", "record_latest"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RAW = RESULTS / "raw"
LATEST = RESULTS / "latest.json"
_PERCENTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99, "p99.9": 0.999}
_LATENCY_SAMPLES = {"start": "start_latency_samples", "result": "result_latency_samples"}


class NotRecordable(Exception):
    """The run cannot be recorded: no commit id (not a git checkout, or tracked files changed)."""


def commit_id(root: Path = ROOT) -> str:
    """The commit the working tree is at, or :class:`NotRecordable` saying why there is none."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NotRecordable(f"{root} is not a git checkout with a commit ({exc})") from exc
    if status.stdout.strip():
        changed = ", ".join(line[3:] for line in status.stdout.splitlines()[:5])
        raise NotRecordable(f"tracked files differ from HEAD ({changed}): commit them, then run again")
    return head.stdout.strip()


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    out = {name: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) for name, q in _PERCENTILES.items()}
    out["max"] = round(ordered[-1], 3)
    out["n"] = len(ordered)
    return out


def compact(result: dict[str, Any]) -> dict[str, Any]:
    """The summary of a raw result that the repository keeps: everything but the samples and
    series, plus latency percentiles over every round's samples (errors cut to their first line)."""
    summary = {
        system: {
            metric: {**entry, "errors": [str(e).splitlines()[0][:200] for e in entry.get("errors", [])][:3]}
            for metric, entry in metrics.items()
        }
        for system, metrics in result["summary"].items()
    }
    latency: dict[str, dict[str, list[float]]] = {}
    for record in result["records"]:
        for kind, metric in _LATENCY_SAMPLES.items():
            if record.get("metric") == metric and record.get("samples"):
                latency.setdefault(record["system"], {}).setdefault(kind, []).extend(record["samples"])
    return {
        "commit": result["meta"].get("commit"),
        "meta": result["meta"],
        "args": result["args"],
        "peers_status": result["peers_status"],
        "summary": summary,
        "ratios": result["ratios"],
        "targets": result.get("targets", []),
        "latency_ms": {
            system: {kind: _percentiles(samples) for kind, samples in kinds.items()}
            for system, kinds in latency.items()
        },
        "medians": {
            system: {metric: entry.get("median") for metric, entry in metrics.items()}
            for system, metrics in result["summary"].items()
        },
        "latency_note": "percentiles over all rounds' samples, in ms; summary medians are medians of per-round values",
        "breakdowns": [  # records that are not samples or series: the latency stages per round
            {k: v for k, v in r.items() if k not in ("value", "load1")}
            for r in result["records"]
            if r.get("value") is None and not r.get("error") and "samples" not in r and "series" not in r
        ],
        "raw": f"benchmarks/results/raw/{result['meta']['started']}.json (not in git)",
    }


def record_latest(raw_path: Path, *, plots: bool = True) -> list[Path]:
    """Write latest.json (and, with matplotlib, the latest-*.png plots) from a raw result."""
    result = json.loads(raw_path.read_text())
    if not result["meta"].get("commit"):
        raise NotRecordable(f"{raw_path} names no commit: it was not measured at a commit")
    LATEST.write_text(json.dumps(compact(result), indent=1) + "\n")
    written = [LATEST]
    if plots:
        from benchmarks.plot import plot

        written += plot(raw_path, RESULTS, stem="latest")
    return written


def main() -> None:
    """Re-record a raw result as the latest (after a fix to the summary or the plots)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path, help="a raw result, benchmarks/results/raw/<stamp>.json")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args()
    try:
        for path in record_latest(a.raw, plots=not a.no_plot):
            print(path)
    except NotRecordable as exc:
        raise SystemExit(f"not recorded: {exc}") from exc


if __name__ == "__main__":
    main()
