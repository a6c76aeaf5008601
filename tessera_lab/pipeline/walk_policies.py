"""The walker's processor-sharing policy: processor sharing, the CPU testbed's resource model: a ``step`` and an
``advance`` hook that :class:`tessera_lab.pipeline.walk.Walk` drives; it walks no list itself."""

from __future__ import annotations

from typing import Any

from tessera_lab.errors import ConfigError

class SharingPolicy:
    """Processor sharing as a policy with a resource model on the walker (by clock, every rank's clock the shared
    time ``t``): the hook ``step(r)`` starts rank ``r``'s next action when its inputs are there by ``t`` (or notes
    when they will be); ``advance()`` asks the resource model for the computing ranks' speed, moves ``t`` to the
    next completion or arrival, ends what completed (its outputs produced) and makes every rank due again."""

    def __init__(self, walk: Any, programs, speed, spent, p2p: float):
        R = len(programs)
        self.walk, self.programs, self.speed, self.spent, self.p2p = walk, programs, speed, spent, p2p
        self.pos = [0] * R
        self.state = ["idle"] * R  # idle (waiting for inputs) | cpu | block
        self.left = [0.0] * R  # remaining work (cpu) or blocked seconds (block)
        self.busy = [0.0] * R
        self.pending: list[float] = []  # arrival times of inputs not there yet
        self.t = 0.0

    def ready(self, r: int) -> float | None:
        """When rank ``r``'s next action has all its inputs (``None``: one is not produced yet)."""
        done, p2p, at = self.walk.arrival, self.p2p, 0.0
        for kind, s, i, cross in self.programs[r][self.pos[r]][0]:
            if (kind, s, i) not in done:
                return None
            at = max(at, done[(kind, s, i)] + (p2p if cross else 0.0))
        return at

    def step(self, r: int) -> bool:
        if self.state[r] == "idle" and self.pos[r] < len(self.programs[r]):
            at = self.ready(r)
            if at is not None and at <= self.t + 1e-15:
                self.state[r], self.left[r] = "cpu", self.programs[r][self.pos[r]][2]
            elif at is not None:
                self.pending.append(at)
        return False

    def advance(self) -> bool:
        programs, pos, state, left, busy, R = self.programs, self.pos, self.state, self.left, self.busy, len(self.pos)
        if all(pos[r] >= len(programs[r]) for r in range(R)):
            return False
        n_cpu = sum(1 for r in range(R) if state[r] == "cpu")
        n_wait = sum(1 for r in range(R) if state[r] != "cpu" and pos[r] < len(programs[r]))
        rate = self.speed(n_cpu, n_wait)
        dts = [left[r] / rate for r in range(R) if state[r] == "cpu"]
        dts += [left[r] for r in range(R) if state[r] == "block"]
        dts += [a - self.t for a in self.pending]
        if not dts:
            stuck = {r: pos[r] for r in range(R) if pos[r] < len(programs[r])}
            raise ConfigError(f"simulate_shared: no rank can progress (rank -> next action index: {stuck})")
        dt = max(0.0, min(dts))
        self.spent(dt, n_cpu)
        for r in range(R):
            if state[r] == "cpu":
                left[r] -= rate * dt
                busy[r] += dt
            elif state[r] == "block":
                left[r] -= dt
                busy[r] += dt
        self.t = t = self.t + dt
        for r in range(R):
            if state[r] == "cpu" and left[r] <= 1e-12:
                d = programs[r][pos[r]][3]
                state[r], left[r] = ("block", d) if d > 0 else ("end", 0.0)
            if state[r] == "block" and left[r] <= 1e-12:
                state[r] = "end"
            if state[r] == "end":
                for p in programs[r][pos[r]][1]:
                    self.walk.produce(p, t)
                pos[r] += 1
                state[r] = "idle"
        self.pending = []
        for r in range(R):  # every rank looks again at the new time
            self.walk.clock[r] = t
            self.walk.resume(r)
        return True
