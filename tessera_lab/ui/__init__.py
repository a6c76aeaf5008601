"""tessera_lab.ui."""
