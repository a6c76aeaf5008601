"""Dynamic bubble optimizer (docs/design-notes.md, "Dynamic optimizer"): routing models and replay, routing-dependent durations, gap
prediction without oracles, and the filling policy shared by simulator and runner.

Modules, along the flow: :mod:`.routing` (token counts per expert: uniform, Zipf, drifting, per-layer walks) and
:mod:`.routing_log` (recorded routing, replay); :mod:`.durations` (stage times under routing); :mod:`.planner`
(one EP group's planned order on predicted durations); :mod:`.evaluate` (planned filling on a job, gap errors);
:mod:`.controller` (the torch-free per-EP-group controller: predicted waits, which deferred W to run);
:mod:`.online` (the pipeline executed step by step with that controller: static and dynamic parts of the gain);
:mod:`.studies` (sweeps). Schedule rewrites (split, chunk, defer, fill) are :mod:`tessera_lab.pipeline.passes`.
"""
