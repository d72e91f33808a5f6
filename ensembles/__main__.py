import sys

from ensembles.cli import main

sys.exit(main())
