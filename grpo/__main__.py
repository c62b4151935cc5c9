"""``python -m grpo``: see :mod:`grpo.cli`."""

from grpo.cli import main

raise SystemExit(main())
