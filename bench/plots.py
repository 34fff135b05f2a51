"""The performance page's figures, drawn with matplotlib from the bench's results.

    .venv/bin/python bench/plots.py
    .venv/bin/python bench/plots.py --record NAME -- .venv/bin/python bench/replay.py ...

Without arguments: reads bench/results/*.json and writes docs/img/replay-throughput.svg and
replay-startup.svg (bench/replay.py --source kafka archive), switch-latency.svg (bench/switch.py
--per-switch), cutover-experiment.svg (cutover_trace.py) and replay-budget.svg (budget.py). Each
plots the newest result of its bench (by ``recorded_at``), with a footnote on which machine and
when it ran, in red when the machine was busy. The output is byte-identical from the same results.

With ``--record NAME -- COMMAND``: runs the bench COMMAND (``--json`` added if missing), and
writes its JSON to bench/results/NAME.json with the command, the date, the machine (cores,
memory, CPU model, Python and Spark versions, load before and after) and the commit. Results
recorded before this script (without ``bench`` and ``recorded_at``) are not plotted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from importlib import metadata
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [] if str(ROOT) in sys.path else [str(ROOT)]  # run as a script, bench/ too
from bench.plot_budget import replay_budget  # noqa: E402

RESULTS = ROOT / "bench" / "results"
IMAGES = ROOT / "docs" / "img"
Result = dict[str, Any]


# Recording ---------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """What the results depend on: the machine, and the load on it before the run."""
    return {"cores": os.cpu_count(), "memory_gib": _memory_gib(), "cpu": _cpu_model(),
            "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "pyspark": _version("pyspark"),
            "load_average_before": [round(x, 2) for x in os.getloadavg()]}


def code() -> dict[str, Any]:
    """The commit checked out; with PYTHONPATH (the bench run from an export of a commit, as
    ``git archive``), that path and the commit in its COMMIT file."""
    found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                           text=True, check=False)
    out: dict[str, Any] = {"commit": found.stdout.strip() or None}
    path = os.environ.get("PYTHONPATH")
    if path:
        marker = Path(path.split(os.pathsep)[0], "COMMIT")
        out |= {"pythonpath": path,
                "pythonpath_commit": marker.read_text().strip() if marker.exists() else None}
    return out


def record(name: str, command: list[str]) -> Path:
    """Run a bench with --json and keep its results with the command, date and machine."""
    if "--json" not in command:
        command = [*command, "--json"]
    script = next((Path(a).stem for a in command if a.endswith(".py")), command[0])
    about = machine()
    began = datetime.now(UTC)
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    about["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    out = done.stdout
    start = out.find("\n{") + 1 if not out.startswith("{") else 0  # after any stray lines
    found = json.loads(out[start:])
    result = {"bench": script, "command": shlex.join(command), "date": began.date().isoformat(),
              "recorded_at": began.isoformat(timespec="seconds"),
              "wall_s": round((datetime.now(UTC) - began).total_seconds(), 1),
              "machine": about, "code": code(), **found}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


# Plotting ----------------------------------------------------------------------------------
COLOURS = {"kafka": "#1f77b4", "archive": "#ff7f0e", "peer": "#2ca02c", "warm": "#9467bd",
           "floor": "#7f7f7f"}


def newest(results: list[Result], bench: str) -> Result | None:
    """The newest recorded result of ``bench``, or None."""
    found = [r for r in results if r.get("bench") == bench and "recorded_at" in r]
    return max(found, key=lambda r: str(r["recorded_at"])) if found else None


def shown(command: str) -> str:
    """The bench command as the docs show it: its script from the repository root, the
    interpreter and --json left out."""
    words = shlex.split(command)
    start = next((i for i, w in enumerate(words) if w.endswith(".py")), 0)
    words = ["bench/" + Path(words[start]).name, *words[start + 1:]]
    return shlex.join(w for w in words if w != "--json")


def footnote(fig: Any, result: Result, timed: bool = True) -> int:
    """The machine, date and command under the figure; returns its number of lines."""
    m, code = result["machine"], result.get("code") or {}
    commit = code.get("pythonpath_commit") or code.get("commit")
    lines = [f"{shown(result['command'])}  ·  commit {commit[:7]}" if commit
             else shown(result["command"]),
             f"{result['date']}  ·  {m['cores']} cores, {m['cpu']}, {m['memory_gib']} GiB, "
             f"Python {m['python']}" + (f", PySpark {m['pyspark']}" if m.get("pyspark") else "")
             + f"  ·  load average {m['load_average_before'][0]} before"
             + (f", {m['load_average_after'][1]} over the last 5 min after"
                if "load_average_after" in m else "")]
    # Busy: what else ran in the minute before the bench began (the bench's own processes
    # load the machine after, by design).
    load = m["load_average_before"][0]
    busy = timed and bool(m["cores"]) and load > 1.5 * m["cores"]
    if busy:
        fig.text(0.01, 0.01, f"A shared machine, busy (load {load} on {m['cores']} cores): "
                 "these figures are slower than a quiet machine's.", fontsize=6.5,
                 color="#d62728", va="bottom", ha="left")
    fig.text(0.01, 0.01 + (0.1 if busy else 0) / fig.get_figheight(), "\n".join(lines),
             fontsize=6.5, color="#555555", va="bottom", ha="left")
    return len(lines) + busy


def _thousands(ax: Any, axis: str = "y") -> None:
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: f"{v / 1000:,.0f}k" if v >= 1000 else f"{v:,.0f}")
    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(fmt)


def replay_throughput(result: Result, plt: Any) -> Any:
    runs = sorted(result["runs"], key=lambda r: r["events"])
    events = [r["events"] for r in runs]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    series: list[tuple[str, str, list[Result]]] = [("kafka", "kappa from Kafka", runs)]
    if all("from_archive" in r for r in runs):
        series.append(("archive", "kappa from the archive", [r["from_archive"] for r in runs]))
    for key, label, rows in series:
        ax.plot(events, [r["kappa_records_per_s_with_start"] for r in rows], "o-",
                color=COLOURS[key], label=f"{label}: deploy to caught up")
        ax.plot(events, [r["kappa_records_per_s_without_start"] for r in rows], "o--",
                color=COLOURS[key], alpha=0.7, label=f"{label}: Spark up to caught up")
    ax.plot(events, [r["peer_records_per_s"] for r in runs], "s-", color=COLOURS["peer"],
            label="peer (bench/peer.py, one process)")
    ax.set_xscale("log")
    ax.set_xticks(events, [f"{n:,}" for n in events])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    _thousands(ax)
    ax.set_xlabel("events in the log (count, log scale)")
    ax.set_ylabel("records/s")
    ax.set_title("Replay throughput: pageview_counts v1 replayed to caught up")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper left")
    return fig


def replay_startup(result: Result, plt: Any) -> Any:
    runs = sorted(result["runs"], key=lambda r: r["events"])
    kinds: list[tuple[str, str, str | None]] = [("kafka", "cold, from Kafka", None)]
    if all("from_archive" in r for r in runs):
        kinds.append(("archive", "cold, from the archive", "from_archive"))
    if all("warm_spare" in r for r in runs):
        kinds.append(("warm", "warm spare, from Kafka", "warm_spare"))
    fig, ax = plt.subplots(figsize=(9, 4.6))
    width = 0.8 / len(kinds)
    top = max(x["deploy_to_caught_up_s"] for run in runs
              for x in (run, run.get("from_archive", run), run.get("warm_spare", run)))
    for k, (colour, label, section) in enumerate(kinds):
        rows = [r[section] if section else r for r in runs]
        xs = [i + (k - (len(kinds) - 1) / 2) * width for i in range(len(runs))]
        caught = [r["deploy_to_caught_up_s"] for r in rows]
        first = [r["deploy_to_first_batch_s"] for r in rows]
        ax.bar(xs, caught, width * 0.92, color=COLOURS[colour], alpha=0.35,
               label=f"{label}: caught up")
        ax.bar(xs, first, width * 0.5, color=COLOURS[colour], label=f"{label}: first batch")
        for x, c, f in zip(xs, caught, first, strict=True):
            ax.annotate(f"{c:.1f}", (x, c), ha="center", va="bottom", fontsize=7)
            inside = f > 0.12 * top  # tall enough to hold its label
            ax.annotate(f"{f:.1f}", (x, f), ha="center", va="top" if inside else "bottom",
                        fontsize=6.5, color="white" if inside else "black",
                        xytext=(0, -2 if inside else 1), textcoords="offset points")
    if all("deploy_to_spark_session_up_s" in r for r in runs):
        xs = [i - (len(kinds) - 1) / 2 * width for i in range(len(runs))]
        ax.plot(xs, [r["deploy_to_spark_session_up_s"] for r in runs], "_", color="black",
                markersize=18, mew=2, label="cold: Spark session up")
    ax.set_xticks(range(len(runs)), [f"{r['events']:,} events" for r in runs])
    ax.set_ylabel("seconds from the deploy call (s)")
    ax.set_xlabel("log replayed (count of events)")
    ax.set_title("Replay start-up: from the deploy call to the first batch and to caught up")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def switch_latency(result: Result, plt: Any) -> Any:
    switches, floor = result.get("switch_ms"), result.get("floor_ms")
    readers = f"{result.get('reader_statements', 0):,} reader statements ran meanwhile"
    if not switches or not floor:  # only the summary: its percentiles side by side
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        names = ["p50", "p99"]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [result[f"switch_{n}_ms"] for n in names], 0.4,
               color=COLOURS["kafka"], label="switch")
        ax.bar([x + 0.2 for x in xs], [result[f"floor_two_round_trips_{n}_ms"] for n in names],
               0.4, color=COLOURS["floor"], label="floor: two empty round trips")
        ax.set_xticks(list(xs), names)
        ax.set_ylabel("latency (ms)")
    else:
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4.4),
                                          gridspec_kw={"width_ratios": [3, 2]})
        numbers = range(1, len(switches) + 1)
        left.plot(numbers, switches, "o-", ms=3, lw=0.8, color=COLOURS["kafka"],
                  label="switch (ab / promote / rollback)")
        left.plot(numbers, floor, "s-", ms=3, lw=0.8, color=COLOURS["floor"],
                  label="floor: two empty round trips, just after")
        left.set_xlabel("switch (number, in order)")
        left.set_ylabel("latency (ms, log scale)")
        left.set_yscale("log")
        left.grid(True, alpha=0.3)
        left.legend(fontsize=7.5)
        for values, colour, label in ((switches, COLOURS["kafka"], "switch"),
                                      (floor, COLOURS["floor"], "floor")):
            ordered = sorted(values)
            share = [(i + 1) / len(ordered) for i in range(len(ordered))]
            right.step(ordered, share, where="post", color=colour, label=label)
        for name, colour in (("switch", COLOURS["kafka"]),
                             ("floor_two_round_trips", COLOURS["floor"])):
            right.axvline(result[f"{name}_p99_ms"], color=colour, ls=":", lw=1)
        right.set_xscale("log")
        right.set_xlabel("latency (ms, log scale); dotted: p99")
        right.set_ylabel("share of switches at or below (fraction)")
        right.grid(True, alpha=0.3)
        right.legend(fontsize=7.5, loc="lower right")
        ax = left
    fig.suptitle("Alias switch latency while readers query the alias: "
                 f"p50 {result['switch_p50_ms']} ms, p99 {result['switch_p99_ms']} ms "
                 f"(floor p99 {result['floor_two_round_trips_p99_ms']} ms)", fontsize=11)
    waiting = result.get("switch_time_share_waiting_for_a_cpu")
    ax.set_title(textwrap.fill(f"{result['switches']} switches; {readers}" + (
        f"; {waiting:.0%} of the switches' time was spent waiting for a CPU"
        if waiting is not None else ""), 80), fontsize=8)
    return fig


def cutover_experiment(result: Result, plt: Any) -> Any:
    from datetime import datetime as dt

    found = result["experiment"]
    looks = found["looks"]
    began = dt.fromisoformat(str(looks[0]["at"]))
    at = [(dt.fromisoformat(str(k["at"])) - began).total_seconds() for k in looks]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 3]})
    top.step(at, [k["next_percent"] for k in looks], where="post", color=COLOURS["kafka"],
             label="candidate's share of keys (set at each look)")
    top.plot(at, [k["next_percent"] for k in looks], ".", color=COLOURS["kafka"])
    counts = [(t, m["baseline"]["count"], m["candidate"]["count"]) for t, k in
              zip(at, looks, strict=True) for m in k["evidence"].get("metrics", [])
              if m["metric"] == "converts"]
    observed = [(t, 100 * (c - c0) / (b - b0 + c - c0)) for (_, b0, c0), (t, b, c)
                in pairwise(counts) if b - b0 + c - c0 > 0]
    top.plot([t for t, _ in observed], [v for _, v in observed], "x", ms=4,
             color=COLOURS["peer"], label="candidate's share of readers since the last look")
    top.set_ylabel("share (%)")
    top.set_ylim(0, 100)
    top.grid(True, alpha=0.3)
    top.legend(fontsize=7.5, loc="lower right")
    judged = [(t, m) for t, k in zip(at, looks, strict=True)
              for m in k["evidence"].get("metrics", []) if m["metric"] == "converts"
              and m["interval"] is not None]
    times = [t for t, _ in judged]
    low = [100 * m["interval"][0] for _, m in judged]
    high = [100 * m["interval"][1] for _, m in judged]
    design = found["design"]
    level = 100 * (1 - design["alpha"] / len(design["metrics"]))
    bottom.fill_between(times, low, high, color=COLOURS["archive"], alpha=0.3,
                        label=f"always-valid {level:g} % interval of the difference")
    bottom.plot(times, [100 * m["difference"] for _, m in judged], "o-", ms=3,
                color=COLOURS["archive"], label="estimated difference (candidate - baseline)")
    truth = result.get("true_rates")
    if truth:
        v1, v2 = truth.values()
        bottom.axhline(100 * (v2 - v1), color="black", ls=":", lw=1,
                       label=f"true difference ({100 * v2:g} % against {100 * v1:g} %)")
    bottom.axhline(0, color="black", lw=0.8)
    last = looks[-1]
    for ax in (top, bottom):
        ax.axvline(at[-1], color="#d62728", ls="--", lw=1)
    decided = f"look {last['look']}, {at[-1]:.0f} s: {last['verdict'].replace('_', ' ')}"
    if judged:
        d = judged[-1][1]
        decided += (f"\n{100 * d['difference']:+.1f} pp in [{100 * d['interval'][0]:+.1f}, "
                    f"{100 * d['interval'][1]:+.1f}]")
    bottom.annotate(decided,
                    (at[-1], max(high) if high else 0), xytext=(-4, -2),
                    textcoords="offset points", ha="right", va="top", color="#d62728",
                    fontsize=8)
    bottom.set_xlabel("time since the test started (s)")
    bottom.set_ylabel("conversion rate difference (percentage points)")
    bottom.grid(True, alpha=0.3)
    bottom.legend(fontsize=7.5, loc="lower right")
    fig.suptitle(f"Outcome cutover, {design['strategy']}: share and evidence until the "
                 f"decision ({len(looks) - 1} looks)", fontsize=11)
    top.set_title(f"{result['source']}:\n" + textwrap.fill(
        result["cutover_command"], 130, break_on_hyphens=False), fontsize=7)
    return fig


# File name: (bench, plot, whether its figures are times that a busy machine slows down).
FIGURES = {"replay-throughput.svg": ("replay", replay_throughput, True),
           "replay-startup.svg": ("replay", replay_startup, True),
           "switch-latency.svg": ("switch", switch_latency, True),
           "cutover-experiment.svg": ("cutover_trace", cutover_experiment, False),
           "replay-budget.svg": ("budget", replay_budget, True)}


def draw(results_dir: Path = RESULTS, out: Path = IMAGES) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "kappa-bench"
    plt.rcParams["svg.fonttype"] = "path"
    results = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (bench, plot, timed) in FIGURES.items():
        result = newest(results, bench)
        if result is None:
            print(f"{name}: no recorded {bench} result in {results_dir}; skipped",
                  file=sys.stderr)
            continue
        fig = plot(result, plt)
        lines = footnote(fig, result, timed)
        fig.tight_layout(rect=(0, (lines * 0.1 + 0.05) / fig.get_figheight(), 1, 1))
        fig.savefig(out / name, format="svg", metadata={"Date": None})
        plt.close(fig)
        written.append(out / name)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", metavar="NAME",
                        help="run the bench command after -- and write bench/results/NAME.json")
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=IMAGES, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.record:
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("--record NAME needs a bench command after --")
        print(record(args.record, command).relative_to(ROOT))
        return 0
    if args.command:
        parser.error(f"unexpected arguments: {' '.join(args.command)}")
    for path in draw(args.results, args.out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
