"""The HTTP layer (Starlette): the route table (``routes``), endpoints (``endpoints``), JSON and
error responses (``responses``), ``create_app`` (``app``), the control plane (``control``), fault
injection (``faults``) and the request log (``logs``). Imports ``backend`` and ``engine``."""
