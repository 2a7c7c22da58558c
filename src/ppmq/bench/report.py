"""Results as a terminal table, a JSON file and one PNG chart per workload.

Every figure is the median of the runs; a ratio ppmq/peer is taken within each
run (both measured minutes apart on the same machine) and then the median of those.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

# figure key, column heading, format
COLUMNS = (
    ("messages", "messages", "{:,.0f}"),
    ("msgs_per_s", "msg/s", "{:,.0f}"),
    ("ratio", "ppmq/x", "{:.2f}"),
    ("cpu_s_per_10k", "CPU s/10k", "{:.2f}"),
    ("sys_cpu_s_per_10k", "of it kernel", "{:.2f}"),
    ("client_cpu_s_per_10k", "client CPU", "{:.2f}"),
    ("busiest_client_pct", "busiest client %", "{:.0f}"),
    ("peak_rss_mb", "peak RSS MB", "{:.0f}"),
    ("full_anon_mb", "anon MB", "{:.1f}"),
    ("disk_mb", "disk MB", "{:.1f}"),
    ("p50_ms", "p50 ms", "{:.2f}"),
    ("p99_ms", "p99 ms", "{:.2f}"),
)
BACKLOG_COLUMNS = (
    ("messages", "messages", "{:,.0f}"),
    ("publish_msgs_per_s", "publish msg/s", "{:,.0f}"),
    ("msgs_per_s", "drain msg/s", "{:,.0f}"),
    ("ratio", "ppmq/x", "{:.2f}"),
    ("cpu_s_per_10k", "CPU s/10k", "{:.2f}"),
    ("sys_cpu_s_per_10k", "of it kernel", "{:.2f}"),
    ("empty_anon_mb", "anon empty MB", "{:.1f}"),
    ("full_anon_mb", "anon full MB", "{:.1f}"),
    ("full_file_mb", "file MB", "{:.0f}"),
    ("peak_rss_mb", "peak RSS MB", "{:.0f}"),
    ("disk_mb", "disk MB", "{:.1f}"),
)


def summarize(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict]:
    """Per system: the runs, the median of each figure, and same-run ratios to ppmq."""
    out: dict[str, dict] = {}
    for system, figures in runs.items():
        keys = figures[0].keys() if figures else ()
        out[system] = {"runs": figures, "median": {k: statistics.median(f[k] for f in figures) for k in keys}}
    ours = runs.get("ppmq")
    for system, summary in out.items():
        if ours and system != "ppmq":
            ratios = [a["msgs_per_s"] / b["msgs_per_s"] for a, b in zip(ours, runs[system])]
            if ratios:
                summary["median"]["ratio"] = statistics.median(ratios)
    return out


def _rows(workload: str, summary: dict[str, dict]) -> list[list[str]]:
    columns = BACKLOG_COLUMNS if workload == "backlog" else COLUMNS
    rows = [["system", *(heading for _, heading, _ in columns)]]
    for system, s in summary.items():
        med = s["median"]
        rows.append([system, *(fmt.format(med[k]) if k in med else "-" for k, _, fmt in columns)])
    return rows


def _runs(summary: dict[str, dict]) -> int:
    return max((len(s["runs"]) for s in summary.values()), default=0)


def table(workload: str, summary: dict[str, dict], versions: dict[str, str]) -> str:
    """The terminal's table: aligned columns, then what each system was."""
    rows = _rows(workload, summary)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"== {workload} (median of {_runs(summary)} runs)"]
    lines += ["  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in rows]
    lines += [f"   {system}: {versions[system]}" for system in summary if system in versions]
    return "\n".join(lines)


def markdown(results: dict) -> str:
    """Every workload's table for docs/performance.md."""
    out = []
    for workload, entry in results["workloads"].items():
        rows = _rows(workload, entry["systems"])
        out += [f"### {workload} (median of {_runs(entry['systems'])} runs)", ""]
        out += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        out += [""] + [f"- {system}: {version}" for system, version in entry["versions"].items()] + [""]
    return "\n".join(out)


def write_json(path: Path, report: dict) -> None:
    path.write_text(json.dumps(report, indent=1) + "\n")


def chart(path: Path, workload: str, summary: dict[str, dict]) -> None:
    """Bars of the headline figure per system, with the spread of the runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in summary if summary[s]["runs"]]
    latency = workload.startswith("latency")
    keys = ("p50_ms", "p99_ms") if latency else ("msgs_per_s",)
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        values = [[r[key] for r in summary[s]["runs"]] for s in systems]
        meds = [statistics.median(v) for v in values]
        err = [[m - min(v) for m, v in zip(meds, values)], [max(v) - m for m, v in zip(meds, values)]]
        xs = [x + (i - (len(keys) - 1) / 2) * width for x in range(len(systems))]
        ax.bar(xs, meds, width, yerr=err, capsize=4, label=key.replace("_", " "))
    ax.set_xticks(range(len(systems)), systems)
    ax.set_ylabel("ms publish to delivery" if latency else ("drain msg/s" if workload == "backlog" else "msg/s, first publish to last ack"))
    ax.set_title(f"{workload}: median and spread of the runs")
    if latency:
        ax.legend()
        ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
