"""``python -m padpipe``: the ``padpipe`` command line (see :mod:`padpipe.cli`)."""

from padpipe.cli import main

raise SystemExit(main())
