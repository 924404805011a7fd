"""``python -m mixle``: the same as the ``mixle`` command."""

from mixle.cli import main

raise SystemExit(main())
