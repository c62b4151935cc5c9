"""``python -m mock_server`` / ``whitney-mock``: serve the mock over HTTP with uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from .backend.config import API_PREFIX, DEFAULT_API_KEY


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="whitney-mock",
        description="Serve the whitney-kit mock of the Whitney training API over HTTP. "
                    "Everything is in memory; nothing is downloaded.",
        epilog="Environment: WHITNEY_MOCK_API_KEYS (comma separated keys), "
               "WHITNEY_MOCK_CONTROL_PLANE=1 (serve /_mock/).")
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface to bind (default 127.0.0.1; others print a warning)")
    parser.add_argument("--port", type=int, default=8765, help="TCP port (default 8765; 0 = any)")
    parser.add_argument("--api-key", action="append", dest="api_keys", metavar="KEY",
                        help=f"accepted bearer key; repeat for several tenants "
                             f"(default: $WHITNEY_MOCK_API_KEYS or {DEFAULT_API_KEY!r})")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for ids and unseeded sampling (default 0)")
    parser.add_argument("--order-wait-ms", type=int, default=None,
                        help="how long a request ahead of its seq is held before 409 seq_gap "
                             "(default 2000)")
    parser.add_argument("--cancel-delay-ms", type=int, default=50,
                        help="time a cancelled run spends in 'cancelling' (default 50)")
    parser.add_argument("--control-plane", action="store_true",
                        default=os.environ.get("WHITNEY_MOCK_CONTROL_PLANE") == "1",
                        help="serve the /_mock/ control plane (trace, faults, reset)")
    parser.add_argument("--log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug"],
                        help="log level of the mock and uvicorn; 'info' logs one structured "
                             "line per request (default warning)")
    return parser


def api_keys_from(args: argparse.Namespace) -> list[str]:
    if args.api_keys:
        return args.api_keys
    env = [k.strip() for k in os.environ.get("WHITNEY_MOCK_API_KEYS", "").split(",") if k.strip()]
    return env or [DEFAULT_API_KEY]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, build the app and serve it until interrupted."""
    args = build_parser().parse_args(argv)
    import uvicorn

    from .http.app import create_app
    from .http.logs import configure_logging

    configure_logging(args.log_level)
    keys = api_keys_from(args)
    app = create_app(api_keys=keys, seed=args.seed, order_wait_ms=args.order_wait_ms,
                     cancel_delay_ms=args.cancel_delay_ms, control_plane=args.control_plane)
    if not _is_loopback(args.host):
        print(f"WARNING: serving on {args.host}, not loopback: anyone who can reach this "
              f"address and knows a key can use the mock.", file=sys.stderr)
    masked = ", ".join(k[:4] + "…" if len(k) > 8 else k[:1] + "…" for k in keys)
    print(f"whitney mock serving http://{args.host}:{args.port}{API_PREFIX}  keys: {masked}",
          flush=True)
    if args.control_plane:
        print(f"dashboard: http://{args.host}:{args.port}/_mock/ui  (open it in a browser, "
              f"enter one of the keys)", flush=True)
    # Our request log (logs.py) replaces uvicorn's access log: one structured line per request.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
