"""Measuring layer pairs with the runtime (``tessera-lab measure``: events on CUDA, wall clock on CPU)."""
