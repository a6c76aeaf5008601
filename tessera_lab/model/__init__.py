"""tessera_lab.model."""
