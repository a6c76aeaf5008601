"""Plan exports: Megatron-LM layout, DeepSpeed parts, torch.distributed.pipelining split points, JSON round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from tessera_lab.cli.main import main
from tessera_lab.errors import PartitionError
from tessera_lab.plan.exports import (
    deepspeed_parts, megatron_layout, parse_megatron_layout, parse_plan_json, torch_split_points, write_plan,
)


def test_megatron_layout_hand_example():
    # 5 layers: stage 0 embedding + 2 layers, stage 1 three layers + loss
    assert megatron_layout([0, 2, 5]) == "Ett|tttL"
    assert megatron_layout([0, 7]) == "EtttttttL"


def test_deepspeed_and_torch_hand_example():
    # module list [embedding, layer0..layer4, head]: stage 1 starts at layer 2 = module entry 3
    assert deepspeed_parts([0, 2, 5]) == [0, 3, 7]
    assert torch_split_points([0, 2, 4, 5]) == ["layers.2", "layers.4"]


@given(st.lists(st.integers(1, 9), min_size=1, max_size=12))
def test_layout_round_trip(counts):
    b = [0]
    for c in counts:
        b.append(b[-1] + c)
    assert parse_megatron_layout(megatron_layout(b)) == b
    layout = megatron_layout(b)
    assert layout.count("|") == len(counts) - 1 and layout.count("t") == b[-1]


def test_accounted_split_with_an_embedding_only_and_a_loss_only_stage():
    # Megatron's --account-for-{embedding,loss}-in-pipeline-split over as many virtual stages as layers + 2: the
    # first stage holds the embedding alone, the last the loss alone (Megatron-LM's layout docs write such a last
    # stage "L", as in "Et*3|(tt|)*29,m|L"); module list [embedding, layer0..layer3, head]
    b = [0, 0, 2, 4, 4]
    assert megatron_layout(b) == "E|tt|tt|L" and parse_megatron_layout("E|tt|tt|L") == b
    assert deepspeed_parts(b) == [0, 1, 3, 5, 6]
    assert deepspeed_parts(b, vpp=2) is None  # DeepSpeed gives each rank one contiguous part: no virtual stages
    assert torch_split_points(b) is None  # a loss-only last stage would begin at the final norm: no layer name
    assert torch_split_points([0, 0, 2, 4]) == ["layers.0", "layers.2"]


def test_bad_boundaries():
    with pytest.raises(PartitionError, match="boundaries"):
        megatron_layout([0, 3, 3, 5])  # an empty stage between two others
    with pytest.raises(PartitionError, match="boundaries"):
        megatron_layout([0, 0])
    with pytest.raises(PartitionError, match="characters"):
        parse_megatron_layout("Et*3|tL")


def test_plan_json_round_trip(tmp_path, qwen3_next):
    from tessera_lab.plan.make import make_plan

    d = make_plan(qwen3_next, baselines=()).as_dict()
    path = write_plan(d, tmp_path / "plan.json")
    back = parse_plan_json(path.read_text())
    assert back["boundaries"] == d["boundaries"]
    assert back["schema_version"] == 1
    assert parse_megatron_layout(back["exports"]["megatron_pipeline_model_parallel_layout"]) == d["boundaries"]
    back["schema_version"] = 99
    with pytest.raises(PartitionError, match="schema_version"):
        parse_plan_json(json.dumps(back))


def test_cli_export(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "--pp", "4", "-m", "8", "--export", str(out)]) == 0
    d = parse_plan_json(out.read_text())
    assert d["exports"]["torch_pipelining_split_points"] == [f"layers.{b}" for b in d["boundaries"][1:-1]]


def test_cli_partition_virtual_stages(capsys):
    assert main(["partition", "--costs", "1,2,1,3,1,1,2,4", "--stages", "2", "--vpp", "2", "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    # by hand: 4 chunks over 2 ranks (chunk s on rank s % 2); total 15, so a rank carries >= 8; 8 is reachable
    assert d["bottleneck"] == 8 and len(d["boundaries"]) == 5 and len(d["rank_costs"]) == 2
