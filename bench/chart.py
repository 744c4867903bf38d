"""Draw bench/compare.py's JSON as a PNG: latency against concurrent streams, a line per system and path.

Run by compare.py with bench/.venv's Python (matplotlib is pinned in bench/requirements.txt):

    bench/.venv/bin/python bench/chart.py bench/results/compare-latest.json bench/results/compare-latest.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(source: str, target: str) -> None:
    report = json.loads(open(source).read())
    figure, axes = plt.subplots(1, 3, figsize=(16, 5), constrained_layout=True)
    panels = (
        ("ttft_p50_ms", "time to first token, p50"),
        ("chunk_p50_ms", "chunk latency, p50"),
        ("chunk_p99_ms", "chunk latency, p99"),
    )
    for ax, (key, title) in zip(axes, panels, strict=True):
        for system in report["systems"]:
            rows = [row for row in report["streams"] if row["system"] == system and row[key] is not None]
            ax.plot([row["streams"] for row in rows], [row[key] for row in rows], marker="o", label=system)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    runs = report.get("repeat", 1)
    medians = f", medians of {runs} runs" if runs > 1 else ""
    figure.suptitle(
        f"{report['chunks']} chunks a stream, {report['delay_ms']} ms apart{medians}; {report['when']}; "
        f"{report['machine']}",
        fontsize=9,
    )
    figure.savefig(target, dpi=90)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
