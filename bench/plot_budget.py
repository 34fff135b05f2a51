"""The replay budget's figure (bench/budget.py), drawn by bench/plots.py: the live version's lag
and the catch-ups running, second by second, in each run."""

from __future__ import annotations

from typing import Any

# run: (label, colour)
RUNS = {"budget": ("replay_slots={slots}, live first at {protect:g} s", "#1f77b4"),
        "budget_unprotected": ("replay_slots={slots}, no live first", "#aec7e8"),
        "all_at_once": ("no budget, no live first", "#d62728"),
        "all_at_once_protected": ("no budget, live first at {protect:g} s", "#ff9896")}


def replay_budget(result: dict[str, Any], plt: Any) -> Any:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.2), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    protect, slots = result["live_lag_protect_s"], result["slots"]
    for run, (label, colour) in RUNS.items():
        found = result.get(run)
        if not found:
            continue
        trace = found["trace"]
        text = label.format(slots=slots, protect=protect)
        at = [s["t"] for s in trace]
        top.plot(at, [s["live_lag_s"] for s in trace], "-", lw=1.2, color=colour,
                 label=f"{text}: at most {found['live_lag_max_s']} s, "
                       f"{found['pauses']} pauses")
        bottom.step(at, [s["holding"] for s in trace], where="post", lw=1.2, color=colour,
                    label=f"{text}: all caught up in "
                          f"{found['first_deploy_to_last_caught_up_s']:.0f} s")
    top.axhline(protect, color="black", ls="--", lw=0.8,
                label=f"live_lag_protect_s = {protect:g} s (live first acts at half)")
    top.set_ylabel("live version's lag (s)")
    top.grid(True, alpha=0.3)
    top.legend(fontsize=7)
    bottom.set_ylabel("catch-ups running")
    bottom.set_xlabel("time since the six were deployed (s)")
    bottom.grid(True, alpha=0.3)
    bottom.legend(fontsize=7)
    fig.suptitle(f"Six catch-ups of {result['events']:,} page views beside a live version "
                 f"under {result['live_rate']:,.0f} page views/s", fontsize=11)
    return fig
