"""Plots the soak's samples.csv (see host/cli/benches/soak.rs): usage plot.py CSV PNG."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    rows = list(csv.DictReader(open(src)))
    t = [float(r["t_s"]) / 60 for r in rows]
    col = lambda k: [float(r[k]) for r in rows]  # noqa: E731
    runs = [int(r["run"]) for r in rows]
    starts = [t[i] for i in range(1, len(rows)) if runs[i] != runs[i - 1]]
    fig, axes = plt.subplots(3, 1, sharex=True, figsize=(10, 8))
    for ax, key, label in [
        (axes[0], "steps_per_s", "steps/s (acknowledged)"),
        (axes[1], "p99_ms", "p99 from scheduled send (ms)"),
        (axes[2], "rss_mib", "daemon RSS (MiB)"),
    ]:
        ax.plot(t, col(key), linewidth=0.7)
        ax.set_ylabel(label)
        for s in starts:
            ax.axvline(s, color="red", linewidth=0.6, alpha=0.6)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[2].set_ylim(bottom=0)
    axes[2].set_xlabel("minutes (red: the daemon killed with SIGKILL and restarted)")
    fig.suptitle("promptd soak: swaps every second, MCP server killed every minute")
    fig.tight_layout()
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
