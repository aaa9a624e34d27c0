"""`python -m sluicebench`: what bench/run hands over to once everything is installed."""

from sluicebench.cli import main

raise SystemExit(main())
