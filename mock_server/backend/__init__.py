"""The state machine, without HTTP: configuration (``config``), domain errors (``errors``),
request models (``schemas``), stored data (``records``), the primitive registry
(``primitives``), ordered execution (``ordering``) and the ``Backend`` (``state``). Imports
``engine`` only, never Starlette or ``http``."""
