"""``python -m tessera_lab.runner``: a worker under ``torchrun``, else the local spawner (see :mod:`.launch`)."""

import sys

from tessera_lab.runner.launch.launch import main

if __name__ == "__main__":
    sys.exit(main())
