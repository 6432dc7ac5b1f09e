"""``ingero mcp --echo URL``: Echo's questions as an MCP server on stdio (for MCP clients)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import click

from ingero.runtime.errors import ConfigError

TOKEN_ENV = "INGERO_ECHO_TOKEN"


@click.command("mcp")
@click.option(
    "--echo", "echo_url", required=True, help="Echo's API base URL, e.g. http://echo:8081"
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help=f"file holding the bearer token (else ${TOKEN_ENV})",
)
def mcp(echo_url: str, token_file: str | None) -> None:
    """Serve Echo's tools and the `investigate` prompt over MCP stdio."""
    from ingero.echo.mcp_server import RemoteBackend, check_reachable, serve_stdio

    token = os.environ.get(TOKEN_ENV)
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{token_file}: cannot read token: {exc}") from None
    check_reachable(echo_url)
    anyio.run(serve_stdio, RemoteBackend(echo_url, token))
