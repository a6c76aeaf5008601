"""python -m tessera_lab.cli"""

import sys

from tessera_lab.cli.main import main

sys.exit(main())
