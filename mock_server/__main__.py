"""``python -m mock_server`` / ``whitney-mock``: serve the mock over HTTP with uvicorn.

Base models: ``--base-model ID:vocab_size=N,eos=N[,bos=N][,max_context=N][,max_lora_rank=N]``
and ``--base-model-from [ID=]DIR`` (a local Hugging Face model folder), both repeatable, in
the order given; without either, ``WHITNEY_MOCK_BASE_MODELS`` (declarations separated by
``;``) and ``WHITNEY_MOCK_BASE_MODEL_FROM`` (folders separated by ``;``); without any, the
built-in ``whitney-mock/tiny-byte``. A bad declaration stops the mock before it serves: one
line on stderr naming it, exit code 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from typing import TYPE_CHECKING

from .backend.config import API_PREFIX, DEFAULT_API_KEY

if TYPE_CHECKING:
    from .engine.specs import ModelSpec

#: Environment variables read when no ``--base-model``/``--base-model-from`` is given.
ENV_BASE_MODELS = "WHITNEY_MOCK_BASE_MODELS"
ENV_BASE_MODEL_FROM = "WHITNEY_MOCK_BASE_MODEL_FROM"
DECLARATION_SYNTAX = "ID:vocab_size=N,eos=N[,bos=N][,max_context=N][,max_lora_rank=N]"


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps help at spaces only: a declaration's syntax stays in one piece."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="whitney-mock", formatter_class=_HelpFormatter,
        description="Serve the whitney-kit mock of the Whitney training API over HTTP. "
                    "Everything is in memory; nothing is downloaded.",
        epilog=f"Environment: WHITNEY_MOCK_API_KEYS (comma separated keys), "
               f"WHITNEY_MOCK_CONTROL_PLANE=1 (serve /_mock/), WHITNEY_MOCK_CONTROL_KEY "
               f"(its control key), {ENV_BASE_MODELS} "
               f"(declarations separated by ';') and {ENV_BASE_MODEL_FROM} (folders "
               f"separated by ';'), both read only when no --base-model/--base-model-from "
               f"is given. Example: --base-model Qwen/Qwen3-4B:vocab_size=151936,eos=151645,"
               f"bos=151643,max_context=40960")
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
    parser.add_argument("--control-key", default=os.environ.get("WHITNEY_MOCK_CONTROL_KEY") or None,
                        metavar="KEY",
                        help="bearer key of the control plane for what touches every tenant "
                             "(reset, faults without a run, every trace); API keys reach only "
                             "their own runs there (default: $WHITNEY_MOCK_CONTROL_KEY, else "
                             "generated and printed at startup)")
    parser.add_argument("--base-model", action="append", dest="declarations",
                        type=lambda text: ("--base-model", text), metavar="SPEC",
                        help=f"serve this base model, declared as {DECLARATION_SYNTAX} (vocab, "
                             f"eos, bos abbreviate vocab_size, eos_token_id, bos_token_id; "
                             f"defaults max_context=2048, max_lora_rank=64); repeatable. "
                             f"Capabilities list exactly the declared models (default: the "
                             f"built-in whitney-mock/tiny-byte)")
    parser.add_argument("--base-model-from", action="append", dest="declarations",
                        type=lambda text: ("--base-model-from", text), metavar="[ID=]DIR",
                        help="serve the base model of a local Hugging Face model folder "
                             "(config.json, generation_config.json, tokenizer_config.json; "
                             "read offline): its vocab_size, eos/bos ids and max_context; its "
                             "id is ID or the folder's name; repeatable")
    parser.add_argument("--log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug"],
                        help="log level of the mock and uvicorn; 'info' logs one structured "
                             "line per request (default warning)")
    return parser


def api_keys_from(args: argparse.Namespace) -> list[str]:
    if args.api_keys:
        return list(args.api_keys)
    env = [k.strip() for k in os.environ.get("WHITNEY_MOCK_API_KEYS", "").split(",") if k.strip()]
    return env or [DEFAULT_API_KEY]


def declarations_from(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(source, text) of every base model declaration: the flags in the order given, else
    the environment's."""
    if args.declarations:
        return list(args.declarations)
    found = [(ENV_BASE_MODELS, item.strip())
             for item in os.environ.get(ENV_BASE_MODELS, "").split(";") if item.strip()]
    found += [(ENV_BASE_MODEL_FROM, item.strip())
              for item in os.environ.get(ENV_BASE_MODEL_FROM, "").split(";") if item.strip()]
    return found


def base_models_from(args: argparse.Namespace) -> list[ModelSpec]:
    """The declared base models (``ValueError`` with one line naming where a bad one came
    from); an empty list means the built-in model."""
    from .engine.specs import base_model_from_folder, declare_base_models, parse_base_model

    specs = []
    for source, text in declarations_from(args):
        from_folder = source in ("--base-model-from", ENV_BASE_MODEL_FROM)
        try:
            specs.append(base_model_from_folder(text) if from_folder else parse_base_model(text))
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    return list(declare_base_models(specs)) if specs else []


def describe_model(entry: dict[str, object]) -> str:
    """One banner line for a capabilities ``base_models[]`` entry."""
    numbers = ", ".join(f"{key} {value}" for key, value in entry.items() if key != "id")
    return f"  base model {entry['id']}: {numbers}"


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

    from .engine.allocator import tune_malloc
    from .engine.model import pin_blas_threads
    from .http.app import create_app
    from .http.logs import configure_logging

    configure_logging(args.log_level)
    tune_malloc()  # this process is the server: no per-call page faults (engine/allocator.py)
    pin_blas_threads()  # and one BLAS thread for good: the per-call guard has nothing to do
    keys = api_keys_from(args)
    try:
        base_models = base_models_from(args)
        app = create_app(api_keys=keys, seed=args.seed, order_wait_ms=args.order_wait_ms,
                         cancel_delay_ms=args.cancel_delay_ms, control_plane=args.control_plane,
                         control_key=args.control_key, base_models=base_models)
    except ValueError as exc:  # one line naming the problem, before anything is served
        print(f"whitney-mock: {exc}", file=sys.stderr)
        return 2
    if not _is_loopback(args.host):
        print(f"WARNING: serving on {args.host}, not loopback: anyone who can reach this "
              f"address and knows a key can use the mock.", file=sys.stderr)
    port = args.port
    if port == 0:  # name the free port the kernel chooses, so the banner's URL is usable
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                args.host, 0, type=socket.SOCK_STREAM)[0]
            with socket.socket(family, kind, proto) as probe:
                probe.bind(address)
                port = probe.getsockname()[1]
        except OSError:
            pass  # uvicorn reports what is wrong with the address
    host = f"[{args.host}]" if ":" in args.host else args.host
    masked = ", ".join(k[:4] + "…" if len(k) > 8 else k[:1] + "…" for k in keys)
    root = f"http://{host}:{port}"
    print(f"whitney mock serving {root}{API_PREFIX}  --base-url {root}  keys: {masked}",
          flush=True)
    if args.control_plane:
        print(f"dashboard: {root}/_mock/ui  (open it in a browser, enter one of the keys)",
              flush=True)
    for entry in app.state.backend.capabilities()["base_models"]:
        print(describe_model(entry), flush=True)
    # Our request log (logs.py) replaces uvicorn's access log: one structured line per request.
    uvicorn.run(app, host=args.host, port=port, log_level=args.log_level, access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
