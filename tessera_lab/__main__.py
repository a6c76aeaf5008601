"""``python -m tessera_lab`` runs the command line."""

import sys

from tessera_lab.cli.main import main

sys.exit(main())
