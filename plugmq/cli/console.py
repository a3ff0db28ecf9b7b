"""``plugmq console``: the web console over the admin endpoints of running ``plugmq serve`` brokers."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import click

__all__ = ["command"]


def _bind(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"{listen!r} is not HOST:PORT", param_hint="--listen")
    sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), int(port)))
    except OSError as exc:
        sock.close()
        raise click.ClickException(f"cannot listen on {listen} ({exc.strerror}); pick another --listen") from exc
    sock.listen(128)  # connections wait in the backlog from now on, until uvicorn accepts them
    return sock


@click.command("console")
@click.option("--server", "servers", multiple=True, required=True, metavar="HOST:PORT",
              help="A running plugmq serve (its admin endpoint); repeat for several. In a cluster one is enough: "
                   "the console finds every broker through it.")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT",
              help="Where the console listens (port 0 picks a free port). Loopback by default.")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The servers run TLS: the CA certificate that signed theirs.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A client certificate, when the servers ask for one (with --tls-key).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Its private key.")
@click.option("--sample-s", type=float, default=10.0, show_default=True,
              help="How often the console samples lag and offsets for its charts (seconds).")
def command(servers: tuple[str, ...], listen: str, tls_ca: Path | None, tls_cert: Path | None,
            tls_key: Path | None, sample_s: float) -> None:
    """Serve the web console: cluster, topics, consumer groups, messages, traces, dead letters.

    Prints 'plugmq console: listening on http://HOST:PORT' once it accepts connections. Sign in with
    an admin account of the brokers' ACL ([server.acl.accounts.<key>] admin = true).
    """
    try:
        import uvicorn

        from plugmq.console.app import Console, build_app
        from plugmq.console.brokers import Fleet, TlsFiles
    except ModuleNotFoundError as exc:
        raise click.ClickException(f"plugmq console needs the 'console' extra ({exc.name} is missing): "
                                   "pip install 'plugmq[console]'") from exc
    if tls_ca is None and (tls_cert is not None or tls_key is not None):
        raise click.UsageError("--tls-cert and --tls-key need --tls-ca (the servers' CA)")
    if sample_s <= 0:
        raise click.BadParameter("must be > 0", param_hint="--sample-s")
    host = listen.rpartition(":")[0].strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"plugmq console: WARNING: listening on {host}, beyond loopback, over plain HTTP; put it behind "
                   "TLS or keep it on 127.0.0.1", err=True)
    fleet = Fleet(servers, TlsFiles(tls_ca, tls_cert, tls_key) if tls_ca is not None else None)
    console = Console(fleet, sample_s=sample_s)
    sock = _bind(listen)
    address = sock.getsockname()
    server = uvicorn.Server(uvicorn.Config(build_app(console), log_level="warning", lifespan="on"))
    click.echo(f"plugmq console: listening on http://{address[0]}:{address[1]} (brokers via {', '.join(servers)})")
    sys.stdout.flush()
    try:
        server.run(sockets=[sock])
    finally:
        fleet.close()
