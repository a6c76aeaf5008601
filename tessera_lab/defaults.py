"""Defaults every layer shares, in a module that imports nothing (the command line reads them while building its
parser, before any planning code is imported)."""

#: the model ``plan``, ``report`` and ``measure`` use when none is named
DEFAULT_MODEL = "qwen3-next-80b-a3b"
#: the GPU of the default cluster
DEFAULT_GPU = "H200"
