"""``simulate`` states the unit of every time it prints (the user's unit of --f/--b/--w) and applies
``--grad-sync`` to the static simulation too (finding 5 and 16 of the fresh user's findings)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.cli.main import main

INTERLEAVED = ["simulate", "--schedule", "interleaved", "--vpp", "2", "--stages", "4", "--microbatches", "8",
               "--f", "1", "--b", "2", "--w", "1"]


def _json(capsys, argv):
    capsys.readouterr()
    assert main(argv + ["--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)


def test_grad_sync_extends_the_static_interleaved_makespan_by_hand(capsys):
    # interleaved p=4, v=2, m=8, chunk f=1 b=2: busy v*m*(f+b) = 48 per rank, bubble (p-1)*(f+b) = 9 -> 57;
    # each rank holds 2 stages, both reduce-scatters (3 each) after the rank's last action, one after the
    # other on the comm lane: +6 on every rank -> 63, exposed tail 6 per rank
    base = _json(capsys, INTERLEAVED)
    assert base["makespan"] == pytest.approx(57.0) and "grad_sync" not in base
    gs = _json(capsys, INTERLEAVED + ["--grad-sync", "3"])
    assert gs["makespan"] == pytest.approx(63.0)
    assert gs["grad_sync"]["exposed_tail_static_s"] == pytest.approx(6.0)
    assert gs["per_rank_busy"] == base["per_rank_busy"]  # the comm lane adds no compute
    capsys.readouterr()
    assert main(INTERLEAVED + ["--grad-sync", "3"]) == 0
    text = capsys.readouterr().out
    assert "makespan 63 time units" in text
    assert "DP gradient reduce-scatter 3 time units per stage" in text and "(last step) 6 time units" in text


def test_grad_sync_in_a_routed_static_simulation(capsys):
    base = _json(capsys, INTERLEAVED + ["--routing", "zipf:1.2"])
    gs = _json(capsys, INTERLEAVED + ["--routing", "zipf:1.2", "--grad-sync", "3"])
    # rank 0 finishes last in interleaved 1F1B; its two reduce-scatters follow -> +6 on the makespan
    assert gs["makespan"] == pytest.approx(base["makespan"] + 6.0)


def test_dynamic_grad_sync_line_carries_units(capsys):
    capsys.readouterr()
    assert main(INTERLEAVED + ["--routing", "zipf:1.2", "--dynamic", "--grad-sync", "3"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("DP gradient reduce-scatter"))
    assert "3 time units per stage" in line and "(last step, static -> dynamic) 6 -> " in line
    assert line.endswith(" time units, counted in the iterations above")


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(0, 5), st.sampled_from([0.5, 1.0, 2.5]))
def test_1f1b_grad_sync_adds_its_seconds_to_the_makespan(p, extra, gs):
    # 1F1B, one stage per rank: the last rank-0 backward ends the step ((m + p - 1)(f + b) with f=1, b=2); rank 0
    # then reduce-scatters for gs; every other rank's reduce-scatter ends earlier -> makespan + gs
    from tessera_lab.cli.simulate import static_grad_sync, sync_tail
    from tessera_lab.pipeline.schedules import build_schedule
    from tessera_lab.pipeline.simulate import simulate, uniform_durations

    m = p + extra  # 1F1B needs m >= p
    sched = build_schedule("1f1b", p, m)
    d = uniform_durations(1.0, 2.0, None, None)
    plain = simulate(sched, d)
    tl = simulate(sched, d, comm=static_grad_sync(sched, gs))
    assert plain.iteration_time == pytest.approx((m + p - 1) * 3.0)
    assert tl.iteration_time == pytest.approx(plain.iteration_time + gs)
    assert sync_tail(tl) == pytest.approx(gs)
    assert static_grad_sync(sched, 0.0) is None


def test_help_says_unit_and_scope():
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["simulate", "--help"]) == 0
    h = " ".join(buf.getvalue().split())
    assert "--grad-sync S" in h and "same unit as --f" in h and "with or without --routing" in h


def test_simulate_plot_axis_reads_the_tables_time_units(tmp_path, monkeypatch):
    """`simulate --plot`: the Gantt's time axis and titles use the table's unit ("time units"), not seconds."""
    import matplotlib

    matplotlib.use("Agg")
    from tessera_lab.cli import simulate as sim_cli
    from tessera_lab.cli.main import main
    from tessera_lab.ui import plots

    seen = []
    real_gantt, real_pair = plots.gantt, plots.gantt_pair

    def gantt(*a, **k):
        ax = real_gantt(*a, **k)
        seen.append(ax.get_xlabel())
        return ax

    def gantt_pair(*a, **k):
        fig = real_pair(*a, **k)
        seen.extend(ax.get_xlabel() for ax in fig.axes if ax.get_xlabel())
        seen.extend(ax.get_title() for ax in fig.axes if ax.get_title())
        return fig

    monkeypatch.setattr(plots, "gantt", gantt)
    monkeypatch.setattr(plots, "gantt_pair", gantt_pair)
    assert main(["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "2",
                 "--plot", str(tmp_path / "a.png")]) == 0
    assert main(["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "2",
                 "--w", "1", "--routing", "zipf:1.0", "--dynamic", "--steps", "2", "--plot", str(tmp_path / "b.png")]) == 0
    assert seen and all(sim_cli.UNIT in s for s in seen if s.startswith("time")), seen
    assert not [s for s in seen if s == "time (s)" or " s, bubble" in s], seen
