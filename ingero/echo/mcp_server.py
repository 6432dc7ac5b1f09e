"""Echo's questions as MCP tools, plus the ``investigate`` prompt (official ``mcp`` SDK).

One server definition, two ways to reach the data: inside ``ingero echo`` (streamable HTTP
at ``/mcp``; tools answer through ``Service`` with the caller's bearer token) and
``ingero mcp --echo URL`` (stdio; tools are a thin client of the HTTP API).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, Protocol

import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from ingero import __version__
from ingero.echo.answers import QUESTIONS
from ingero.echo.auth import AccessDenied, TokenTable
from ingero.echo.jsontext import utf8_safe
from ingero.echo.questions import BadRequest
from ingero.echo.service import SQL_PARAM, SQL_QUESTION, SQL_SUMMARY, Service
from ingero.echo.sql import SQL_OUTPUT_SCHEMA, SqlError
from ingero.runtime.errors import UnavailableError
from ingero.security.bearer import authorization

INVESTIGATE = "investigate"


class ToolFailure(Exception):
    """A tool call that cannot be answered; the message goes back to the model."""


class Backend(Protocol):
    async def ask(
        self, name: str, args: dict[str, Any], headers: Mapping[str, str] | None
    ) -> dict[str, Any]: ...


class LocalBackend:
    """Answers in-process, as the principal of the HTTP request's bearer token."""

    def __init__(self, service: Service, tokens: TokenTable) -> None:
        self.service = service
        self.tokens = tokens

    async def ask(
        self, name: str, args: dict[str, Any], headers: Mapping[str, str] | None
    ) -> dict[str, Any]:
        principal = self.tokens.authenticate((headers or {}).get("authorization"))
        if principal is None:
            raise ToolFailure("a valid bearer token is required")
        try:
            return await anyio.to_thread.run_sync(self.service.answer, name, args, principal)
        except (BadRequest, SqlError, AccessDenied) as exc:
            raise ToolFailure(str(exc)) from None


class RemoteBackend:
    """Answers by calling Echo's HTTP API (for ``ingero mcp --echo URL`` over stdio)."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    async def ask(
        self, name: str, args: dict[str, Any], headers: Mapping[str, str] | None
    ) -> dict[str, Any]:
        return await asyncio.to_thread(self.call, name, args)

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """One question (or SQL) answered by Echo over HTTP; ToolFailure when it is not."""
        url = f"{self.base_url}/api/v1/{urllib.parse.quote(name)}"
        data = None
        if name == SQL_QUESTION:
            data = json.dumps(args).encode()
        else:
            query = {k: str(v) for k, v in args.items() if v is not None}
            if query:
                url += "?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", authorization(self.token))
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                result: dict[str, Any] = json.loads(response.read())
                return result
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except ValueError:
                message = exc.reason
            raise ToolFailure(f"echo answered {exc.code}: {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ToolFailure(f"cannot reach echo at {self.base_url}: {exc}") from None


def tools() -> list[types.Tool]:
    read_only = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
    out = [
        types.Tool(
            name=q.name,
            description=q.summary,
            input_schema=q.input_schema(),
            output_schema=q.output,
            annotations=read_only,
        )
        for q in QUESTIONS.values()
    ]
    out.append(
        types.Tool(
            name=SQL_QUESTION,
            description=SQL_SUMMARY,
            input_schema={
                "type": "object",
                "properties": {"query": SQL_PARAM.schema()},
                "required": ["query"],
                "additionalProperties": False,
            },
            output_schema=SQL_OUTPUT_SCHEMA,
            annotations=read_only,
        )
    )
    return out


def investigate_text(cluster_id: str, job_id: str | None) -> str:
    scope = f"cluster {cluster_id}" + (f", job {job_id}" if job_id else "")
    job_arg = f', "job_id": "{job_id}"' if job_id else ""
    return (
        f"Investigate stragglers in {scope} with ingero echo's tools, step by step.\n"
        f'1. Call `summary` with {{"cluster_id": "{cluster_id}"}}: how many nodes, events,'
        " drains and straggler episodes, and whether any episode is still open. Every question"
        ' takes a window: "last": "24h" (or "30m", "7d"), or since/until in Unix seconds.\n'
        f'2. Call `stragglers` with {{"cluster_id": "{cluster_id}"{job_arg}, "order_by": "time"}}'
        ' and again with "order_by": "depth": which nodes spent the most time below the'
        " threshold, and which fell furthest below it. A node high on both is the first suspect.\n"
        "3. For the top node, call `events` with its node_id (and job_id) to see when its"
        " episodes began and ended, its scores against the threshold and the dominant signal;"
        + (f" call `job_report` for job {job_id};" if job_id else " call `job_report` for its job;")
        + " call `drains` to see whether it was drained.\n"
        "   For a job that spans several nodes, call `collective_lag` with"
        + (f' {{"job_id": "{job_id}"}}' if job_id else " its job_id")
        + ": its ranks ranked by how late they enter the NCCL collectives behind their"
        " peers (lag p50/p95, how often last, on which node), any hung collective with the"
        " ranks and nodes that never entered it (or none: every rank inside, a network or"
        " NVLink problem rather than a rank), and nodes whose clock was off (their lag"
        " figures are doubtful). A rank that is late most often names the node that holds"
        " the job back, even when every node's own score looks alike.\n"
        f'4. Call `outliers` with {{"cluster_id": "{cluster_id}"}} to see whether the node is'
        " also low in score history outside its episodes (a persistent problem) or only in"
        " this job (a transient or job-specific one). If many nodes straggle at once, suspect"
        " a shared cause (network, storage, scheduler) rather than one node.\n"
        "5. Ask the operator to run the node's own explanation on that node:"
        " `ingero explain" + (f" --job {job_id}" if job_id else "") + "` (it reads the node's"
        " trace and prints causal chains first: host, GPU and CUDA/NCCL changes linked to"
        " the throughput drop by time and process, each with evidence, a confidence and a fix"
        " hint, and where the node records call stacks the lines of the job the calls came"
        " from (file:line and caller, in the chain and in the fix hint); `--json` keeps the"
        " chains and the frames). Across the job's nodes at once: `ingero explain"
        + (f" --job-nodes {job_id}" if job_id else " --nodes <its nodes>")
        + "`, which also names the rank that reaches the NCCL collectives last. Relate the"
        " top chain to the dominant signal.\n"
        "6. Call `cost` for the same scope to state what the straggling cost in GPU-hours and"
        " money. Finish with: the straggling node(s), since when, how often, how deep, the"
        " likely cause, and what to do next."
    )


def build_server(backend: Backend) -> Server[Any]:
    """The MCP server: every Echo question as a read-only tool, plus ``investigate``."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools())

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        headers = getattr(ctx.request, "headers", None)
        try:
            if params.name not in (*QUESTIONS, SQL_QUESTION):
                raise ToolFailure(f"unknown tool {params.name!r}")
            result = await backend.ask(params.name, dict(params.arguments or {}), headers)
        except ToolFailure as exc:
            return types.CallToolResult(content=[types.TextContent(text=str(exc))], is_error=True)
        text = json.dumps(result, separators=(",", ":"))  # ASCII: lone surrogates escaped
        return types.CallToolResult(
            content=[types.TextContent(text=text)],
            # UTF-8 on the wire; an escaped surrogate in the text may be one UTF-8 cannot hold
            structured_content=utf8_safe(result) if "\\ud" in text else result,
        )

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(
            prompts=[
                types.Prompt(
                    name=INVESTIGATE,
                    description="Walk from the cluster summary to the stragglers to the"
                    " node's own `ingero explain`",
                    arguments=[
                        types.PromptArgument(
                            name="cluster_id", description="Cluster to look at", required=True
                        ),
                        types.PromptArgument(
                            name="job_id", description="Slurm job to focus on", required=False
                        ),
                    ],
                )
            ]
        )

    async def get_prompt(
        ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        if params.name != INVESTIGATE:
            raise ValueError(f"unknown prompt {params.name!r}")
        args = params.arguments or {}
        cluster_id = args.get("cluster_id")
        if not cluster_id:
            raise ValueError("the investigate prompt needs cluster_id")
        return types.GetPromptResult(
            description=f"Investigate stragglers in cluster {cluster_id}",
            messages=[
                types.PromptMessage(
                    role="user",
                    content=types.TextContent(
                        text=investigate_text(cluster_id, args.get("job_id") or None)
                    ),
                )
            ],
        )

    return Server(
        "ingero-echo",
        version=__version__,
        instructions="Cluster straggler questions: start with the `investigate` prompt.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )


async def serve_stdio(backend: Backend) -> None:
    server = build_server(backend)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def check_reachable(base_url: str) -> None:
    """Fail early with one clear line when Echo cannot be reached (before speaking MCP)."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/healthz", timeout=10):
            pass
    except (urllib.error.URLError, OSError) as exc:
        raise UnavailableError(f"cannot reach echo at {base_url}: {exc}") from None
