"""`%wb serve`: an OpenAI-compatible endpoint over the kernel's models (workbench.server).

    %wb serve [start] [--port N] [--host H] [--only ID ...] [--api-key KEY] [--scope-header H]
    %wb serve status | stop

The server runs in the kernel's process over the same engines, so `%wb models`, the views,
the widgets and the cache tables show what outside clients are doing.
"""

from __future__ import annotations

from typing import Any

from IPython.core.magic_arguments import argument, magic_arguments

from workbench.notebook.host import MagicsHost


@magic_arguments(name="wb serve")
@argument("action", nargs="?", default="start", choices=["start", "status", "stop"], help="what to do")
@argument("--port", type=int, default=0, metavar="N", help="port (0: a free one)")
@argument("--host", default="127.0.0.1", metavar="H", help="address (loopback unless --api-key and a remote one)")
@argument("--only", action="append", metavar="ID", help="serve only this model (repeat for more; "
                                                         "default: every loaded model)")
@argument("--api-key", metavar="KEY", help="clients send Authorization: Bearer KEY")
@argument("--scope-header", metavar="H", help="the header naming each request's cache scope (tenant)")
def serve_command(m: MagicsHost, args: Any) -> Any:
    """Serve the loaded models over OpenAI's HTTP API (start | status | stop)."""
    from workbench import server
    from workbench.notebook.commands import usage_errors  # commands.py registers this one

    if args.action == "stop":
        print(f"stopped {server.stop_all()} server(s)")
        return None
    if args.action == "status":
        running = server.running()
        print("\n".join(repr(s) for s in running) if running else "no server is running (%wb serve starts one)")
        return None
    remote = args.host not in ("127.0.0.1", "localhost", "::1")
    with usage_errors():
        srv = server.serve(args.only, host=args.host, port=args.port, api_key=args.api_key,
                           allow_remote=remote and args.api_key is not None, scope_header=args.scope_header)
    key = "'<your --api-key>'" if args.api_key else "'unused'"
    print(f"serving at {srv.url}/v1 (OpenAI's API; %wb serve stop ends it)\n"
          f"  from openai import OpenAI\n"
          f"  client = OpenAI(base_url={srv.url + '/v1'!r}, api_key={key})")
    return None
