"""Where the uneven EP dispatch copies its expert-major index to the device. On CUDA a copy from pageable host
memory (``tensor.to(device)``) is a ``cudaMemcpyAsync`` followed by a synchronize of the current stream
(c10/cuda ``memcpy_and_sync``): made after the dispatch's all-to-all, it holds the host until the all-to-all has
run, every MoE layer and micro-batch. Built before it, right after the count exchange's host read (which has already
drained the stream), it waits for nothing. A CPU run cannot show the stall; these tests check the order of the
calls, in the module dispatch (:meth:`ExpertParallelComm.dispatch`) and node by node (:class:`StageProgram`), and
that the count exchange is recorded under its node's (stage, micro-batch)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    if dist.is_initialized():  # pragma: no cover - the file runs alone in its worker
        pytest.skip("a process group exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield dist.new_group([0]), dist.new_group([0])
    finally:
        dist.destroy_process_group()


def test_module_dispatch_builds_the_index_before_the_all_to_all(one_rank, monkeypatch):
    from tessera_lab.runner.runtime import moe

    log = []
    real_index, real_a2a = moe.expert_major, moe.all_to_all
    monkeypatch.setattr(moe, "expert_major", lambda *a, **k: (log.append("index"), real_index(*a, **k))[1])
    monkeypatch.setattr(moe, "all_to_all", lambda *a, **k: (log.append(k.get("name", a[-1])), real_a2a(*a, **k))[1])
    comm = moe.ExpertParallelComm(*one_rank, 1, 0, 4)
    x = torch.arange(12.0).reshape(6, 2)
    xs, handle = comm.dispatch(x, torch.tensor([1, 2, 0, 3]))
    assert log == ["index", "ep_dispatch"]
    assert [t.tolist() for t in xs] == [x[:1].tolist(), x[1:3].tolist(), [], x[3:].tolist()]  # rows per expert
    assert handle.per_expert == [1, 2, 0, 3]


def test_node_program_builds_the_index_before_the_dispatch_wait(one_rank, monkeypatch):
    from tessera_lab.runner.runtime import nodes
    from tessera_lab.runner.runtime.moe import ExpertParallelComm
    from tessera_lab.runner.runtime.specs import TinyConfig
    from tessera_lab.runner.runtime.topology import build_stages

    cfg = TinyConfig(ep_dispatch="uneven")
    comm = ExpertParallelComm(*one_rank, 1, 0, cfg.num_experts)
    _, stages = build_stages(cfg, [0, 1, cfg.num_layers], [1], 2)
    stage = stages[1]
    stage.comm = comm
    log, counts = [], []
    real_index, real_wait = nodes.expert_major, nodes.StageProgram._wait
    monkeypatch.setattr(nodes, "expert_major", lambda *a, **k: (log.append("index"), real_index(*a, **k))[1])
    monkeypatch.setattr(nodes.StageProgram, "_wait", lambda self, node: (log.append(node), real_wait(self, node))[1])

    def hook(name, start, end, nbytes, action=None):
        if name == "ep_counts":
            counts.append(action)

    comm.hook = hook
    prog = nodes.StageProgram(stage, 3, comm, lambda *a: None, lambda: 0.0,
                              targets=torch.zeros(1, cfg.seq_len, dtype=torch.int64))
    prog.begin(torch.randn(1, cfg.seq_len, cfg.hidden_size, requires_grad=True))
    for k in prog.fwd_keys:
        prog.forward(k)
    moe_layers = [i for i in prog.order if prog.layers[i].moe is not None]
    assert moe_layers, "the stage has no MoE layer to check"
    for i in moe_layers:
        assert log.index("index") < log.index(f"L{i}.dispatch")
        log.remove("index")
    assert counts == [(1, 3)] * len(moe_layers)  # the node's (stage, micro-batch), whichever thread runs it
