"""The ``megatron`` pair order is Megatron-Core's, read from a pinned upstream commit.

Upstream: NVIDIA/Megatron-LM d428de40c139dd091d3a91baf041e9128811a4d7,
megatron/core/models/common/model_chunk_schedule_plan.py, ``TransformerLayerSchedulePlan.run``: the backward
combine before the forward attention, the backward MLP before the forward dispatch, the backward dispatch before
the forward MLP, the forward combine before the backward attention.
"""

from tessera_lab.runner.runtime import orders as od


def test_pinned_source():
    assert od.MEGATRON_SOURCE == {"repo": "NVIDIA/Megatron-LM", "commit": "d428de40c139dd091d3a91baf041e9128811a4d7",
                                  "file": "megatron/core/models/common/model_chunk_schedule_plan.py",
                                  "function": "TransformerLayerSchedulePlan.run"}
    assert "d428de40c139" in od.ORDER_SOURCES["megatron"]
    assert set(od.ORDER_SOURCES) == set(od.NAMED_ORDERS)


def test_megatron_template_equals_the_upstream_sequence():
    # the upstream calls, transcribed by hand from the pinned file (mtp and backward_dw calls carry no key of ours)
    upstream = ["b.moe_combine", "f.attn", "b.mlp", "f.moe_dispatch", "b.moe_dispatch", "f.mlp", "f.moe_combine",
                "b.attn"]
    ours = {"attn": "pre", "moe_dispatch": "dispatch", "mlp": "experts", "moe_combine": "combine"}
    expected = []
    for c in upstream:
        side, node = c.split(".")
        k = f"{side}.{ours[node]}"
        # our 'post' (unpermute, shared expert, residual) sits in Megatron's combine node: before the backward
        # combine, after the forward one
        expected += ([f"b.post", k] if k == "b.combine" else [k, "f.post"] if k == "f.combine" else [k])
    assert tuple(expected) == od.NAMED_ORDERS["megatron"]
    assert od.megatron_order() == od.NAMED_ORDERS["megatron"]
    assert od.check_template(od.NAMED_ORDERS["megatron"]) == od.NAMED_ORDERS["megatron"]
    pos = {k: i for i, k in enumerate(od.NAMED_ORDERS["megatron"])}
    assert pos["b.combine"] < pos["f.pre"] and pos["b.dispatch"] < pos["f.experts"]
