"""Paper-scale study: expert width vs hidden EP communication, the paper's points, scale rows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tessera_lab.errors import ConfigError
from tessera_lab.report.study import (
    describe_paper_points,
    expert_width_study,
    paper_point_widths,
    paper_reported,
    parallel_for_gpus,
    scale_study,
)


@pytest.mark.slow
def test_hidden_fraction_of_ep_comm_rises_with_expert_width():
    df = expert_width_study(widths=(256, 1024, 4096))
    assert df["feasible"].all()
    hidden = list(df["hidden_fraction"])
    exposed = list(df["exposed_share"])
    assert hidden[0] < hidden[1] < hidden[2]
    assert exposed[0] > exposed[1] > exposed[2]
    assert all(0 <= h <= 1 for h in hidden)
    pts = paper_point_widths(df)
    medium = next(p for p in pts if p["job"] == "medium_job")
    # the medium job's 26% hidden lies inside this range for our model
    assert medium["width_reaching_hidden"] is not None and 256 < medium["width_reaching_hidden"] < 4096
    lines = describe_paper_points(pts)
    assert len(lines) == 2 and all("paper" in l for l in lines)


def test_paper_point_interpolation_by_hand():
    rep = paper_reported()
    df = pd.DataFrame({"width": [100, 400], "feasible": [True, True], "hidden_fraction": [0.2, 0.8],
                       "exposed_share": [0.5, 0.05]})
    pts = {p["job"]: p for p in paper_point_widths(df, rep)}
    # hidden 0.73: (0.73 - 0.2) / 0.6 of the way in log2 width from 100 to 400
    want = 2 ** (math.log2(100) + (0.73 - 0.2) / 0.6 * 2)
    assert pts["large_job"]["width_reaching_hidden"] == pytest.approx(want)
    assert pts["medium_job"]["width_reaching_hidden"] == pytest.approx(2 ** (math.log2(100) + 0.06 / 0.6 * 2))
    assert pts["large_job"]["width_reaching_exposed_share"] is not None
    none = paper_point_widths(df.assign(hidden_fraction=[0.1, 0.2]), rep)
    assert none[0]["width_reaching_hidden"] is None
    assert "does not reach" in describe_paper_points(none)[0]
    assert rep["overlap"]["large_job"]["ep_comm_hidden_fraction"] == 0.73


def test_scale_rows_and_parallel():
    p = parallel_for_gpus(4096)
    assert p.world_size == 4096 and p.dp == 64
    with pytest.raises(ConfigError):
        parallel_for_gpus(1000)
    df = scale_study((4096,), {"qwen3_next": "qwen3-next-80b-a3b"}, dynamic_routing=None)
    assert list(df["setup"]) == ["uniform, 1F1B", "uniform, overlapped", "full loop"]
    mfu = dict(zip(df["setup"], df["mfu"]))
    assert mfu["full loop"] > mfu["uniform, overlapped"] > mfu["uniform, 1F1B"]
    assert (df["gpus"] == 4096).all()
