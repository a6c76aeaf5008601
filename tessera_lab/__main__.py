"""``python -m tessera_lab`` runs the command line (Ctrl-C while it is still starting up: one line, exit 130)."""

import sys

try:
    from tessera_lab.cli.main import main
except KeyboardInterrupt:  # interrupted while importing (seconds on a busy machine): no traceback
    print(f"tessera-lab {(sys.argv[1:] or [''])[0]}: interrupted".replace("  ", " "), file=sys.stderr)
    sys.exit(130)

sys.exit(main())
