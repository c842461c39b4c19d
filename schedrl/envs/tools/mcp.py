"""Tools from MCP servers (Model Context Protocol) over stdio, through the official SDK.

    pip install 'schedrl[mcp]'

    env: tools
    env_args: {mcp: [{command: python, args: [my_server.py]}], parser: hermes}

Each server gets one persistent client session per process and event loop, opened on the first
episode's reset and kept for the run: `list_tools` gives the tools and their JSON schemas once, and
every call goes over the same session (verl opens one per call, the cost `bench/sandbox.py`
measures). A call runs under the tool set's timeout; a result with `isError` becomes the tool's
error output to the model. A call whose server dies under it is an error; the next call starts the
server again, once (`max_restarts`); after that its tools answer with errors. A command that does not
exist is an error naming it.

`session: episode` gives each episode a server of its own (MCP-U RL's and AgentRL's isolation): taken
at reset from a pool that keeps `pool` sessions warm, and at close recycled by calling the server's
`recycle` tool (one that clears its state), or destroyed when no such tool is named
(`schedrl.envs.sessions`). The pool's counts are the run's `session/*` metrics.

`sandbox: true` (or a mapping of `schedrl.sandbox.Limits` fields, plus `expose:` paths and `devices:`,
"gpu" or /dev paths, none by default) starts the
server inside a `Sandbox`: its own uid, no network, rlimits, an empty working directory, and an
environment of PATH and `env` only; "python" there is this interpreter with its packages. Paths in
`args` must then be absolute (or use `-m module`); everything the server starts dies with the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schedrl.envs.sessions import SessionPool, pool_for
from schedrl.envs.tools.schema import Tool


class MCPToolError(RuntimeError):
    """An MCP tool answered with `isError`, or its server is gone."""


@dataclass(frozen=True)
class MCPServer:
    """How to start a stdio MCP server: `command` and `args`, with `env` added to a minimal environment."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    max_restarts: int = 1
    log: str | None = None  # where the server's stderr goes (appended); None: discarded
    sandbox: Any = None  # None: unconfined; else the `Limits` of its Sandbox
    expose: tuple[str, ...] = ()  # with sandbox: host paths bound read-only into it
    devices: tuple[str, ...] | str = ()  # with sandbox: "gpu" or /dev paths it may use
    session: str = "shared"  # shared: one session per process; episode: one per episode, from a pool
    pool: int = 0  # with session episode: idle sessions kept warm
    recycle: str | None = None  # with session episode: the tool that clears a session for reuse

    @classmethod
    def of(cls, spec: Any) -> MCPServer:
        if isinstance(spec, MCPServer):
            return spec
        if isinstance(spec, str):
            return cls(sys.executable if spec == "python" else spec)
        if not isinstance(spec, Mapping) or "command" not in spec:
            raise ValueError(f"an MCP server is {{command: ..., args: [...]}}, got {spec!r}")
        unknown = set(spec) - {"command", "args", "env", "max_restarts", "log", "sandbox", *SESSION_KEYS}
        if unknown:
            raise ValueError(f"MCP server {spec['command']!r}: unknown key(s) {', '.join(sorted(unknown))}")
        command = str(spec["command"])
        limits, expose, devices = _sandbox_limits(command, spec.get("sandbox"))
        return cls(
            sys.executable if command == "python" else command,  # "python": this interpreter
            tuple(str(a) for a in spec.get("args", ())),
            dict(spec.get("env", {})),
            int(spec.get("max_restarts", 1)),
            spec.get("log"),
            limits,
            expose,
            devices,
            *_session_settings(command, spec),
        )

    def key(self) -> tuple:
        return (
            self.command,
            self.args,
            tuple(sorted(self.env.items())),
            self.sandbox,
            self.expose,
            self.devices,
            self.session,
            self.pool,
            self.recycle,
        )


SESSION_KEYS = ("session", "pool", "recycle")


def _session_settings(command: str, spec: Mapping[str, Any]) -> tuple[str, int, str | None]:
    """`session` (shared | episode), and for per-episode sessions the `pool` size and `recycle` tool."""
    where = f"MCP server {command!r}"
    session = spec.get("session", "shared")
    if session not in ("shared", "episode"):
        raise ValueError(f"{where}: session must be 'shared' or 'episode', got {session!r}")
    pool, recycle = spec.get("pool", 0), spec.get("recycle")
    if session == "shared" and ("pool" in spec or recycle is not None):
        raise ValueError(f"{where}: pool and recycle are settings of session: episode")
    if isinstance(pool, bool) or not isinstance(pool, int) or pool < 0:
        raise ValueError(f"{where}: pool must be an integer >= 0 (idle sessions kept warm), got {pool!r}")
    if recycle is not None and (not isinstance(recycle, str) or not recycle):
        raise ValueError(f"{where}: recycle must name the tool that clears a session, got {recycle!r}")
    return session, pool, recycle


def server_limits(**fields: Any) -> Any:
    """Sandbox limits for a server that lives as long as the run: CPU seconds for its whole life, room
    for an interpreter with its threads; `fields` override."""
    from schedrl.sandbox import Limits

    base = {"wall_s": 1e9, "cpu_s": 3600, "memory_mb": 2048, "open_files": 256, "processes": 64}
    return Limits(**{**base, **fields})


def _sandbox_limits(command: str, spec: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...] | str]:
    if spec is None or spec is False:
        return None, (), ()
    if spec is True:
        return server_limits(), (), ()
    if not isinstance(spec, Mapping):
        raise ValueError(f"MCP server {command!r}: sandbox is true or a mapping of limits, got {spec!r}")
    from schedrl.sandbox import Limits

    fields = {f.name for f in dataclasses.fields(Limits)}
    extra = {"expose", "devices"}
    unknown = set(spec) - fields - extra
    if unknown:
        raise ValueError(
            f"MCP server {command!r}: unknown sandbox key(s) {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(fields | extra))})"
        )
    limits = server_limits(**{k: v for k, v in spec.items() if k not in extra})
    devices = spec.get("devices", ())
    devices = (
        devices if devices == "gpu" else (devices,) if isinstance(devices, str) else tuple(map(str, devices))
    )
    return limits, tuple(str(p) for p in spec.get("expose", ())), devices


class MCPSession:
    """One open session to one server, held by a task on the event loop that opened it."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.session: Any = None
        self.tools: list[Any] = []
        self.restarts = 0
        self.calls = 0
        self._task: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None

    @classmethod
    async def attach(cls, client: Any, name: str = "in-process") -> MCPSession:
        """A session over a client that is already open (the SDK's in-process `mcp.Client(server)`, or
        any object with `list_tools` and `call_tool`); it is not restarted, and closing it is the caller's."""
        session = cls(MCPServer(name, max_restarts=0))
        session.tools = list((await client.list_tools()).tools)
        session.session = client
        return session

    async def start(self) -> None:
        cmd = self.server.command
        if shutil.which(cmd) is None and not os.path.exists(cmd):
            raise FileNotFoundError(f"MCP server command {cmd!r} not found")
        try:
            from mcp import StdioServerParameters
        except ImportError as err:
            raise ImportError("MCP tools need the MCP SDK: pip install 'schedrl[mcp]'") from err
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        box = self._sandbox()

        async def serve() -> None:
            errlog = open(self.server.log or os.devnull, "a")  # noqa: SIM115 -- open for the session's life
            try:
                with contextlib.ExitStack() as stack:
                    argv = [cmd, *self.server.args]
                    env = {"PATH": os.environ.get("PATH", ""), **self.server.env}
                    if box is not None:
                        stack.callback(box.close)
                        argv = stack.enter_context(
                            box.confine(argv, limits=self.server.sandbox, env=self.server.env)
                        )
                        env = {"PATH": env["PATH"]}
                    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
                    await self._serve(params, errlog, ready)
            except BaseException as err:  # a server that fails to start or dies: its calls see it
                if not ready.done():
                    ready.set_exception(
                        RuntimeError(f"MCP server {cmd!r} failed: {type(err).__name__}: {err}")
                    )
            finally:
                self.session = None
                errlog.close()

        self._task = asyncio.get_running_loop().create_task(serve())
        await ready

    def _sandbox(self) -> Any:
        if self.server.sandbox is None:
            return None
        from schedrl.sandbox import Sandbox

        python = (
            self.server.command
            if os.path.realpath(self.server.command) == os.path.realpath(sys.executable)
            else None
        )
        return Sandbox(python=python, expose=self.server.expose, devices=self.server.devices)

    async def _serve(self, params: Any, errlog: Any, ready: asyncio.Future) -> None:
        from mcp import ClientSession
        from mcp.client.stdio import stdio_client

        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            self.tools = list((await session.list_tools()).tools)
            self.session = session
            ready.set_result(None)
            assert self._stop is not None
            await self._stop.wait()

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The tool's text output; `MCPToolError` for an error result or a server that is gone."""
        if self.session is None:  # never started, or died: start it again, up to max_restarts times
            if self.restarts >= self.server.max_restarts:
                raise MCPToolError(
                    f"MCP server {self.server.command!r} is gone (restarted {self.restarts} times)"
                )
            self.restarts += 1
            await self.start()
        session = self.session
        assert session is not None
        try:
            result = await session.call_tool(name, dict(arguments))
        except Exception as err:  # the connection broke under this call: the next one starts the server again
            self.session = None
            if self._stop is not None:
                self._stop.set()
            raise MCPToolError(f"MCP call {name!r} failed: {type(err).__name__}: {err}") from err
        self.calls += 1
        text = "\n".join(getattr(c, "text", "") for c in result.content if getattr(c, "type", "") == "text")
        if getattr(result, "is_error", None) or getattr(result, "isError", None):  # SDK 2.x / 1.x
            raise MCPToolError(text or f"MCP tool {name!r} failed")
        return text

    def as_tools(self) -> list[Tool]:
        out = []
        for t in self.tools:

            async def fn(_name: str = t.name, **arguments: Any) -> str:
                return await self.call(_name, arguments)

            schema = {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {},
                },
            }
            out.append(Tool(t.name, fn, schema))
        return out

    async def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            await asyncio.wait([self._task], timeout=5)


_SESSIONS: dict[tuple, asyncio.Future] = {}  # (event loop, server) -> the future of its session


async def session_for(server: MCPServer | Mapping | str) -> MCPSession:
    """The process's session to `server` on the running event loop, opened on first use; episodes that
    reset at the same moment wait for the one start."""
    spec = MCPServer.of(server)
    loop = asyncio.get_running_loop()
    key = (id(loop), spec.key())
    pending = _SESSIONS.get(key)
    if pending is None:
        pending = loop.create_future()
        _SESSIONS[key] = pending
        session = MCPSession(spec)
        try:
            await session.start()
        except BaseException as err:
            del _SESSIONS[key]  # a later episode may try again
            pending.set_exception(err)
            pending.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        pending.set_result(session)
    return await asyncio.shield(pending)


async def mcp_tools(servers: Sequence[MCPServer | Mapping | str]) -> list[Tool]:
    """Every tool of every server, each a `Tool` whose calls go over that server's session."""
    tools: list[Tool] = []
    for server in servers:
        tools += (await session_for(server)).as_tools()
    return tools


Held = list[tuple[SessionPool, MCPSession]]  # an episode's own sessions, with the pools they go back to


def episode_pool(server: MCPServer) -> SessionPool[MCPSession]:
    """The running event loop's pool of per-episode sessions to `server` (`session: episode`)."""

    async def start() -> MCPSession:
        session = MCPSession(server)
        await session.start()
        return session

    async def recycle(session: MCPSession) -> None:
        assert server.recycle is not None
        await session.call(server.recycle, {})

    return pool_for(
        ("mcp", server.key()),
        lambda: SessionPool(start, MCPSession.close, server.pool, recycle if server.recycle else None),
    )


async def episode_tools(servers: Sequence[MCPServer]) -> tuple[list[Tool], Held]:
    """The tools of `servers` for one episode: a shared server's over the process's session, a
    per-episode server's over a session of the episode's own, taken from its pool (returned in `held`,
    for `release_sessions` at the episode's close)."""
    tools: list[Tool] = []
    held: Held = []
    try:
        for server in servers:
            if server.session == "episode":
                pool = episode_pool(server)
                session = await pool.acquire()
                held.append((pool, session))
            else:
                session = await session_for(server)
            tools += session.as_tools()
    except BaseException:
        await release_sessions(held)
        raise
    return tools, held


async def release_sessions(held: Held) -> None:
    """Give an episode's sessions back to their pools: recycled (a session whose server is still up) or
    destroyed."""
    for pool, session in held:
        await pool.release(session, healthy=session.session is not None)
