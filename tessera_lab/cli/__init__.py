"""tessera_lab.cli."""
