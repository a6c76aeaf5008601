"""tessera_lab.pipeline."""
