"""``ingero mcp --echo URL``: Echo's questions as an MCP server on stdio (for MCP clients)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import click

from ingero.runtime.errors import ConfigError

TOKEN_ENV = "INGERO_ECHO_TOKEN"


ECHO_OPTION = click.option(
    "--echo", "echo_url", required=True, help="Echo's API base URL, e.g. http://echo:8081"
)
TOKEN_FILE_OPTION = click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help=f"file holding the bearer token (else ${TOKEN_ENV})",
)


def echo_token(token_file: str | None) -> str | None:
    """Echo's bearer token: the file's, else ``$INGERO_ECHO_TOKEN``, else none."""
    if not token_file:
        return os.environ.get(TOKEN_ENV)
    try:
        return Path(token_file).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{token_file}: cannot read token: {exc}") from None


@click.command("mcp")
@ECHO_OPTION
@TOKEN_FILE_OPTION
def mcp(echo_url: str, token_file: str | None) -> None:
    """Serve Echo's tools and the `investigate` prompt over MCP stdio."""
    from ingero.echo.mcp_server import RemoteBackend, check_reachable, serve_stdio

    token = echo_token(token_file)
    check_reachable(echo_url)
    anyio.run(serve_stdio, RemoteBackend(echo_url, token))
