"""Exception types shared by every tessera-lab module.

Every error raised for bad input names the offending field and the allowed range,
so that the CLI can print it as one line and exit with status 2.
"""

from __future__ import annotations


class TesseraError(Exception):
    """Base class of every error tessera-lab raises on purpose."""


class ConfigError(TesseraError, ValueError):
    """A model config, cluster or parallel setting is missing or out of range.

    The message names the field (e.g. ``num_experts_per_tok``) and what is allowed.
    """


class TooFewGPUsError(ConfigError):
    """Too few GPUs for the model's memory: a layout search whose every layout holds more parameter state per GPU
    than fits, or (notebook 11's panel) one in which no planned layout fits.

    Attributes:
        needed: a GPU count the search accepts at which some layout passes both memory bounds (parameter state, then
            saved activations), or ``None`` when none does up to the search's limit.
    """

    def __init__(self, message: str, needed: int | None = None):
        super().__init__(message)
        self.needed = needed


class ScheduleError(TesseraError, ValueError):
    """A pipeline schedule cannot run with the requested settings
    (for example 1F1B with fewer micro-batches than stages)."""


class PartitionError(TesseraError, ValueError):
    """A partition request is impossible (e.g. more stages than layers)."""


class InfeasiblePlanError(PartitionError):
    """No partition fits the memory limit; the message names the stage and the shortfall in GiB."""


class SolverLimitError(PartitionError):
    """The ILP stopped at its limit with no plan, and no heuristic plan fits memory: not proven infeasible."""


class DeadlockError(TesseraError, RuntimeError):
    """The simulator found ranks that can never make progress.

    Attributes:
        stuck: mapping rank -> the next action that rank is blocked on (as text).
    """

    def __init__(self, message: str, stuck: dict[int, str] | None = None):
        super().__init__(message)
        self.stuck = dict(stuck or {})


class ProfileError(TesseraError, ValueError):
    """A profile file is unreadable, of an unknown schema version, or stale."""


class OutputError(TesseraError, OSError):
    """An output cannot be written. The message names the user's path (never a temporary file) and the reason,
    e.g. ``cannot write 'out/plan.json': Permission denied``; ``filename`` is the user's path."""

    def __init__(self, errno: int | None, message: str, filename: str | None = None):
        super().__init__(errno, message)
        self.message = message
        self.filename = filename

    def __str__(self) -> str:
        return self.message
