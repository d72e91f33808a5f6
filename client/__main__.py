"""`python -m client`: see client/cli.py."""

from client.cli import main

raise SystemExit(main())
