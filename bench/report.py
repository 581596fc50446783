"""The outputs of a run: a JSON file under ``bench/results/``, and docs/benchmarks.md with plots.

The page is regenerated from JSON: this run's results, plus the newest full (not
``--quick``) run's results for the benchmarks this run left out. The explanation of
missed targets is prose kept in ``bench/analysis.md`` and included as it is.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.machine import REPO

RESULTS_DIR = REPO / "bench" / "results"
DOCS_DIR = REPO / "docs"
ANALYSIS = REPO / "bench" / "analysis.md"
LOAD_ANALYSIS = REPO / "bench" / "load_analysis.md"  # the prose of the Load section
ORDER = [
    "dispatch",
    "fanout",
    "timeout",
    "relay",
    "connections",
    "turn",
    "plans",
    "first_event",
    "throughput",
    "fairness",
    "load",
    "tracing",
]


def write_results(run: dict[str, Any], results_dir: Path) -> Path:
    """Write one run's JSON; returns its path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    commit = str(run["machine"]["commit"]).replace("+", "-")
    suffix = "-quick" if run.get("quick") else ""
    path = results_dir / f"{stamp}-{commit}{suffix}.json"
    path.write_text(json.dumps(run, indent=2) + "\n")
    return path


def _older_full_runs(results_dir: Path, exclude: Path | None) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(results_dir.glob("*.json"), reverse=True):
        if path == exclude:
            continue
        try:
            run = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not run.get("quick"):
            runs.append(run)
    return runs


def merged(run: dict[str, Any], results_dir: Path, this_file: Path | None) -> dict[str, Any]:
    """This run, completed by the newest full run's results of the benchmarks it left out.

    ``sources`` lists every run the page draws on (when, which commit, which benchmarks).
    """
    have = {_merge_key(r) for r in run["results"]} | {e["id"] for e in run.get("errors", [])}
    results = list(run["results"])
    profiles = dict(run.get("profiles") or {})
    sources = [_source(run, sorted({r["id"] for r in run["results"]}))]
    borrowed_from: dict[str, str] = {}
    for older in _older_full_runs(results_dir, this_file):
        taken: set[str] = set()
        for result in older["results"]:
            key = _merge_key(result)
            if key in have:
                continue
            source = borrowed_from.setdefault(key, older["started_at"])
            if source == older["started_at"]:  # every variant from the same, newest run
                results.append({**result, "from_run": source})
                taken.add(result["id"])
        for bench_id in sorted(taken):  # a set: sorted, or the page changes from run to run
            if bench_id in (older.get("profiles") or {}):
                profiles.setdefault(bench_id, older["profiles"][bench_id])
        if taken:
            sources.append(_source(older, sorted(taken)))
    return {**run, "results": results, "profiles": profiles, "sources": sources}


def _merge_key(result: dict[str, Any]) -> str:
    """What a newer run's result replaces: every variant of its benchmark, but a run on
    PostgreSQL (``load@200-postgres``, ``--postgres``) only the PostgreSQL variants, so the
    page shows the load run on both databases; and the variants another benchmark makes
    (``load_per_call``'s ``-per-call``, ``turn_quick``'s ``quick``) only their own."""
    variant = str(result.get("variant", ""))
    key = str(result["id"])
    if "-per-call" in variant:
        key += "-per-call"
    if variant == "quick":
        key += "-quick"
    return f"{key}-postgres" if variant.endswith("-postgres") else key


def _source(run: dict[str, Any], ids: list[str]) -> dict[str, Any]:
    return {
        "started_at": run["started_at"],
        "commit": run["machine"]["commit"],
        "duration_s": run["duration_s"],
        "ids": ids,
        "rounds": run.get("rounds", {}),
    }


# -- the page --------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}" if value else "0"
    return f"{text} {unit}".strip()


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "—"}[met]


def _sort_key(result: dict[str, Any]) -> tuple[int, str]:
    rid = result["id"]
    return (ORDER.index(rid) if rid in ORDER else len(ORDER), result.get("variant", ""))


def _table(results: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "| benchmark | median | p99 | baseline median | baseline p99 | ratio | target | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=_sort_key):
        m, b = r["measured"], r["baseline"]
        unit = m["unit"]
        ratio = r["ratio"]
        lines.append(
            "| `{label}` | {med} | {p99} | {bmed} | {bp99} | {ratio} | {target} | {met} |".format(
                label=r["label"],
                med=_fmt(m["median"], unit),
                p99=_fmt(m["p99"], unit),
                bmed=_fmt(b["median"], b["unit"]) if b else "—",
                bp99=_fmt(b["p99"], b["unit"]) if b else "—",
                ratio=f"{ratio:.2f}x" if ratio is not None else "—",
                target=r["target"],
                met=_verdict(r["met"]),
            )
        )
    return lines


def _details(results: Sequence[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for r in sorted(results, key=_sort_key):
        lines.append(f"### `{r['label']}`")
        lines.append("")
        lines.append(r["what"] + ".")
        if r.get("from_run"):
            lines.append(f"(From the run of {r['from_run']}.)")
        extra = {k: v for k, v in r.get("extra", {}).items() if k != "profiles"}
        if extra:
            lines.append("")
            lines.append(
                "Also measured: " + ", ".join(f"`{k}` = {json.dumps(v)}" for k, v in extra.items())
            )
        for note in r.get("notes", []):
            lines.append("")
            lines.append(f"> {note}")
        lines.append("")
    return lines


def _load_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    x, m = r.get("extra", {}), r["measured"]
    b = r.get("baseline") or {}
    n = x.get("conversations", "?")
    return [
        ("conversations at once (one WebSocket client each)", str(n)),
        (
            "gateways / orchestrators / tool workers (prefork slots each)",
            f"{x.get('gateways')} / {x.get('orchestrators')} / {x.get('tool_workers')} "
            f"({x.get('tools_concurrency')})",
        ),
        ("turns completed, seen by their client", f"{x.get('completed')} of {n}"),
        ("turns completed, in SQL", f"{x.get('sql_turn_statuses', {}).get('completed', 0)} of {n}"),
        ("`user_turn` answered with `error`", str(x.get("refused"))),
        (
            "turns/s (clients' clock; SQL's clock)",
            f"{x.get('turns_per_s')}; {x.get('turns_per_s_sql')}",
        ),
        ("turn latency p50 / p99", f"{_fmt(m['median'], 'ms')} / {_fmt(m['p99'], 'ms')}"),
        ("the same turn alone, p50", _fmt(b.get("median"), "ms")),
        (
            "events in the streams / received",
            f"{x.get('events_expected')} / {x.get('events_received')}",
        ),
        ("lost events", str(x.get("lost_events"))),
        ("duplicated events", str(x.get("duplicated_events"))),
        ("out-of-order events", str(x.get("out_of_order_events"))),
        (
            "tool executions / calls asked",
            f"{x.get('tool_executions')} / {x.get('tool_executions_expected')}",
        ),
        ("run wall time", _fmt(x.get("wall_s"), "s")),
    ]


def _load_cpu_table(x: dict[str, Any]) -> list[str]:
    """CPU per turn by process, and bare Celery making the same task hops (issue 20)."""
    cpu: dict[str, float] = x.get("cpu_s") or {}
    per_turn: dict[str, float] = x.get("cpu_ms_per_turn") or {}
    bare: dict[str, Any] = x.get("bare_celery") or {}
    if not per_turn:
        return []  # a run from before these figures
    hops = x.get("hops") or {}
    lines = [
        "CPU per turn by process (each process with its children; the bench process is the "
        "clients and the fake model, outside the stack; on PostgreSQL, the server's processes "
        "are a row of the stack, as SQLite's work is inside the services'):",
        "",
        "| process | CPU s | ms per turn |",
        "|---|---:|---:|",
    ]
    for name, seconds in sorted(cpu.items(), key=lambda i: -i[1]):
        lines.append(f"| {name} | {seconds:.2f} | {per_turn.get(name, 0.0):.1f} |")
    lines.append(f"| **the stack** | | **{x.get('stack_cpu_ms_per_turn', 0.0):.1f}** |")
    if bare:
        for name, ms in bare.get("cpu_ms_per_turn", {}).items():
            lines.append(f"| bare Celery: {name} | {bare['cpu_s'].get(name, 0.0):.2f} | {ms:.1f} |")
        total = bare.get("cpu_ms_per_turn_total", 0.0)
        lines.append(f"| **bare Celery, the same hops** | | **{total:.1f}** |")
    lines.append("")
    if bare:
        tasks = hops.get("tool_tasks")
        in_tasks = f", the calls in {tasks} tool tasks" if tasks is not None else ""
        lines.append(
            f"Task hops per turn: {hops.get('per_turn')} ({hops.get('run_turn_deliveries')} "
            f"`run_turn` deliveries and {hops.get('tool_calls')} tool calls in all{in_tasks}, "
            f"counted from the {hops.get('counted_from')}). Bare Celery made them as "
            f"{bare.get('tasks')} no-op tasks on {bare.get('workers')} workers in rounds of "
            f"{bare.get('rounds')} ({bare.get('wall_s')} s, {bare.get('cpu_ms_per_task')} ms of "
            "CPU per task, its workers, Redis and the producer). **The stack's CPU per turn: "
            f"{x.get('cpu_ratio_to_bare_celery')}x bare Celery's** (target ≤ 2.5x, issue 20)."
        )
        lines.append("")
    commands = x.get("redis_commands_per_turn")
    if commands:
        top = ", ".join(f"`{name}` {n}" for name, n in commands["by_command"].items())
        lines += [
            f"Redis commands per turn: {commands['total']} (the most frequent: {top}). A count, "
            "not a time: it does not move with the machine's speed or load.",
            "",
        ]
    return lines


def _load_section(run: dict[str, Any]) -> list[str]:
    """The load run of issue 7: its figures, the machine, and what went wrong (with logs)."""
    results = [r for r in run["results"] if r["id"] == "load"]
    if not results:
        return []
    machine = run["machine"]
    commits = {s["started_at"]: s["commit"] for s in run.get("sources", [])}
    lines = [
        "## Load",
        "",
        "Issue 7's load run, `python -m bench --only load` (about a minute on 2 cores): "
        "every conversation starts at once; after the run each client's events are compared "
        "with its conversation's Redis stream (the reference), SQL is read for every turn "
        "and tool call, and `count_calls` counters say how often the tool really ran.",
        "",
    ]
    for r in sorted(results, key=_sort_key):
        commit = commits.get(r.get("from_run", run["started_at"]), machine["commit"])
        x = r.get("extra", {})
        lines += [
            f"### `{r['label']}`: {_verdict(r['met'])} ({r['target']})",
            "",
            f"**Machine:** {machine['cores']} cores ({machine['cpu']}), Python "
            f"{machine['python']}, Redis {machine['redis']}, commit `{commit}`; load average "
            f"{x.get('loadavg_1m_before', '?')} before, {x.get('loadavg_1m_after', '?')} after.",
            "",
            "| | |",
            "|---|---|",
            *(f"| {k} | {v} |" for k, v in _load_rows(r)),
            "",
        ]
        cpu = x.get("cpu_s") or {}
        if cpu:
            wall = x.get("wall_s") or 0
            lines.append(
                f"CPU seconds during the {wall:.0f} s run: "
                + ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items(), key=lambda i: -i[1]))
                + "."
            )
            lines.append("")
            lines.extend(_load_cpu_table(x))
        for note in r.get("notes", []):
            lines.append(f"> {note}")
            lines.append("")
        problems = x.get("log_problems") or {}
        if problems:
            lines.append("Problems the services logged during the run (count, then samples):")
            lines.append("")
            lines.append("```")
            for process, found in problems.items():
                lines.append(f"{process}: {found['errors']} errors, {found['warnings']} warnings")
                lines.extend(f"  {sample}" for sample in found["samples"][:3])
            lines.append("```")
            lines.append("")
    if LOAD_ANALYSIS.exists():
        lines.append(LOAD_ANALYSIS.read_text().rstrip())
        lines.append("")
    return lines


def _profiles(run: dict[str, Any]) -> list[str]:
    profiles = run.get("profiles") or {}
    if not profiles:
        return []
    lines = [
        "## Profiles",
        "",
        "Taken with `python -m bench --profile`: py-spy attached to each service process "
        "during an extra, unmeasured pass of the benchmark (wall clock, waiting included, "
        f"non-blocking, {run.get('profile_rate_hz', 250)} Hz). Only stacks through the "
        "measured path count (the turn loop, the WebSocket session and its SQL threads, "
        "the tool task), so idle threads and background loops are left out. Shares are of "
        "those samples; inclusive = the function or anything it called.",
        "",
        "Profiles marked **CPU** (`load`, whose target is CPU per turn) count only samples "
        "of a thread holding the GIL (`py-spy --gil`): Python's work, not waiting, and not "
        "C code that releases the GIL (SQLite's own work, a socket `send`). Their table "
        "*by library* shares the samples out by the library Signalbox's code called (the "
        "HTTP client under the `anthropic` SDK counts as the SDK's); `signalbox` is time in "
        "Signalbox's own code.",
        "",
    ]
    for bench_id, per_process in profiles.items():
        for p in per_process:
            kind = ", **CPU**" if p.get("cpu") else ""
            lines.append(f"### `{bench_id}`: {p['process']} ({p['samples']} samples{kind})")
            lines.append("")
            if p.get("error"):
                lines.append(f"No profile: {p['error']}")
                lines.append("")
                continue
            lines.append("| inclusive | function | | self | function |")
            lines.append("|---|---|---|---|---|")
            for (fi, si), (fs, ss) in zip(p["inclusive"], p["self"], strict=False):
                lines.append(f"| {si:.0%} | `{fi}` | | {ss:.0%} | `{fs}` |")
            lines.append("")
            if p.get("libraries"):
                lines.append("| by library | share |")
                lines.append("|---|---|")
                lines.extend(f"| `{name}` | {share:.0%} |" for name, share in p["libraries"])
                lines.append("")
    return lines


def _sources(run: dict[str, Any]) -> list[str]:
    sources = run.get("sources") or [_source(run, sorted({r["id"] for r in run["results"]}))]
    lines = ["**Runs** this page shows:", ""]
    for src in sources:
        # A benchmark's results may carry a shorter id (`load_per_call` reports as `load`).
        shown = [
            k for k in src["rounds"] if any(k == i or k.startswith(f"{i}_") for i in src["ids"])
        ]
        rounds = ", ".join(f"{k} {src['rounds'][k]}" for k in shown)
        lines.append(
            f"- {src['started_at']}, commit `{src['commit']}`, {src['duration_s']:.0f} s: "
            f"{', '.join(f'`{i}`' for i in src['ids'])} (measured rounds: {rounds})"
        )
    return lines


def render_markdown(run: dict[str, Any], plots: Sequence[str]) -> str:
    """docs/benchmarks.md for ``run`` (already merged)."""
    machine = run["machine"]
    caption = (
        f"{machine['cores']} cores ({machine['cpu']}), Python {machine['python']}, "
        f"Redis {machine['redis']}, {machine['os']}, commit `{machine['commit']}`"
    )
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m bench` (bench/report.py); edit bench/analysis.md "
        "for the prose. -->",
        "",
        "Signalbox measured against the bare engine underneath it (Celery, Redis) in the same "
        "run, on the same machine, so the ratios hold on a noisy machine. Every benchmark "
        "runs a fixed number of rounds after a warm-up; the baselines run interleaved with "
        "the measured rounds. Benchmarks measure; nothing here is asserted by the test "
        "suite (tests/test_bench_smoke.py only checks that the suite runs).",
        "",
        f"**Machine:** {caption}. fd limit {machine['fd_limit']}.",
        "",
        *_sources(run),
        "",
        "Run it: `python -m bench` (the whole suite, about 15 minutes on 2 cores), "
        "`python -m bench --only relay,turn --rounds 10`, `python -m bench --quick` (tiny "
        "sizes, no page), `python -m bench --profile` (also profiles the services, in an "
        "extra pass that is not measured). It starts its own Redis, SQLite database, fake "
        "Messages API server and services; results are written to `bench/results/*.json`, "
        "and `python -m bench.report` rebuilds this page from them.",
        "",
        "## Results",
        "",
        *_table(run["results"]),
        "",
        "Ratio: median over baseline median (for throughput, how much of the bare "
        "Celery rate Signalbox reaches). A dash: not measurable in this run (see the notes).",
        "",
    ]
    for error in run.get("errors", []):
        lines.append(f"- `{error['id']}` did not run to the end: {error['error']}")
    if run.get("errors"):
        lines.append("")
    for plot in plots:
        lines.append(f"![{plot}]({plot})")
        lines.append("")
    lines.extend(_load_section(run))
    if ANALYSIS.exists():
        lines.append(ANALYSIS.read_text().rstrip())
        lines.append("")
    lines.append("## Each benchmark")
    lines.append("")
    lines.extend(_details(run["results"]))
    lines.extend(_profiles(run))
    return "\n".join(lines).rstrip() + "\n"


# -- the plots -------------------------------------------------------------------------


def _caption(run: dict[str, Any]) -> str:
    m = run["machine"]
    commits = list(dict.fromkeys(s["commit"] for s in run.get("sources", []))) or [m["commit"]]
    return (
        f"{m['cores']} cores ({m['cpu']}) · Python {m['python']} · Redis {m['redis']} · "
        f"commit {', '.join(commits)}"
    )


def render_plots(run: dict[str, Any], docs_dir: Path) -> list[str]:
    """PNG plots of ``run`` in ``docs_dir``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    results = sorted(run["results"], key=_sort_key)
    caption = _caption(run)

    def save(fig: Any, name: str) -> None:
        fig.text(0.01, 0.01, caption, fontsize=7, color="dimgray")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        fig.savefig(docs_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)

    latency = [
        r for r in results if r["measured"]["unit"] == "ms" and r["measured"]["median"] is not None
    ]
    if latency:
        fig, ax = plt.subplots(figsize=(10, 4.8))
        labels = [r["label"] for r in latency]
        xs = range(len(latency))
        width = 0.38
        ours = [r["measured"]["median"] for r in latency]
        ours_p99 = [r["measured"]["p99"] - r["measured"]["median"] for r in latency]
        base = [r["baseline"]["median"] if r["baseline"] else 0 for r in latency]
        base_p99 = [
            (r["baseline"]["p99"] - r["baseline"]["median"]) if r["baseline"] else 0
            for r in latency
        ]
        ax.bar(
            [x - width / 2 for x in xs], ours, width, yerr=[[0] * len(ours), ours_p99],
            label="Signalbox (bar: median, whisker: p99)", color="tab:blue", capsize=3,
        )  # fmt: skip
        ax.bar(
            [x + width / 2 for x in xs], base, width, yerr=[[0] * len(base), base_p99],
            label="baseline, same run", color="tab:gray", capsize=3,
        )  # fmt: skip
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms (log scale)")
        ax.set_title("Latency: Signalbox vs its baseline")
        ax.legend(fontsize=8)
        save(fig, "bench-latency.png")

    relay = [r for r in results if r["id"] == "relay"]
    if relay:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        colours = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
        for colour, r in zip(colours, relay, strict=False):
            for series, style in ((r["measured"], "-"), (r["baseline"], ":")):
                samples = sorted(series["samples"]) if series else []
                if not samples:
                    continue
                ys = [(i + 1) / len(samples) for i in range(len(samples))]
                who = "relay" if style == "-" else "raw XREAD"
                ax.plot(samples, ys, style, color=colour, label=f"{who}, {r['variant']} conv.")
        ax.set_xscale("log")
        ax.set_xlabel("append → received (ms, log scale)")
        ax.set_ylabel("fraction of events")
        ax.set_title("Relay latency (CDF): WebSocket vs raw XADD → XREAD BLOCK")
        ax.legend(fontsize=7)
        save(fig, "bench-relay.png")

    throughput = [r for r in results if r["id"] == "throughput"]
    if throughput:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        procs = [int(str(r["variant"]).rstrip("p") or 1) for r in throughput]
        ax.plot(procs, [r["measured"]["median"] for r in throughput], "o-", label="Signalbox")
        ax.plot(
            procs, [r["baseline"]["median"] for r in throughput], "s--", label="bare Celery",
            color="tab:gray",
        )  # fmt: skip
        ax.set_xticks(procs)
        ax.set_xlabel("worker processes (2 prefork slots each)")
        ax.set_ylabel("trivial calls per second (median)")
        ax.set_title("Throughput")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        save(fig, "bench-throughput.png")

    turn = [r for r in results if r["id"] in ("turn", "first_event", "load")]
    if turn:
        fig, axes = plt.subplots(1, len(turn), figsize=(5 * len(turn), 4.2), squeeze=False)
        for ax, r in zip(axes[0], turn, strict=False):
            data = [r["measured"]["samples"]]
            names = ["Signalbox"]
            if r["baseline"] and r["baseline"]["samples"]:
                data.append(r["baseline"]["samples"])
                names.append("baseline")
            ax.boxplot(data)
            ax.set_xticks(range(1, len(names) + 1))
            ax.set_xticklabels(names)
            ax.set_ylabel("ms")
            ax.set_title(r["label"])
        save(fig, "bench-turns.png")
    return written


def write_docs(run: dict[str, Any], docs_dir: Path) -> Path:
    """Regenerate ``benchmarks.md`` and its plots in ``docs_dir``."""
    plots = render_plots(run, docs_dir)
    page = docs_dir / "benchmarks.md"
    page.write_text(render_markdown(run, plots))
    return page


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report [RUN.json]``: rewrite docs/benchmarks.md from stored JSON.

    Without a file, the newest full run under ``bench/results/`` is used.
    """
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args:
        path = Path(args[0])
    else:
        runs = [p for p in sorted(RESULTS_DIR.glob("*.json")) if not p.stem.endswith("-quick")]
        if not runs:
            print(f"no full run under {RESULTS_DIR}; run `python -m bench` first")
            return 1
        path = runs[-1]
    run = json.loads(path.read_text())
    page = write_docs(merged(run, path.parent, path), DOCS_DIR)
    print(f"docs: {page} (from {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
