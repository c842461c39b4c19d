"""MCP servers as tool sets: one persistent stdio session per server, errors as the model's output."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is the optional extra schedrl[mcp]")

from schedrl.envs import make_env, make_task  # noqa: E402
from schedrl.envs.tools import ToolSet  # noqa: E402
from schedrl.envs.tools.mcp import MCPServer, MCPToolError, mcp_tools, session_for  # noqa: E402
from schedrl.envs.tools.parsers import ToolCall  # noqa: E402

SERVER = {"command": sys.executable, "args": [str(Path(__file__).parent / "mcp_server.py")]}


@pytest.mark.subprocess
def test_tools_and_schemas_come_from_list_tools_and_calls_share_one_session():
    async def go():
        tools = {t.name: t for t in await mcp_tools([SERVER])}
        assert {"add", "fail", "pid", "die"} <= set(tools)
        props = tools["add"].schema["function"]["parameters"]["properties"]
        assert (
            props["a"]["type"] == "integer"
            and tools["add"].schema["function"]["description"] == "Add two integers."
        )
        toolset = ToolSet(list(tools.values()), timeout_s=10)
        results = await toolset.run(
            [ToolCall("add", {"a": 2, "b": 3}), ToolCall("pid", {}), ToolCall("pid", {})]
        )
        session = await session_for(SERVER)
        return results, session

    results, session = asyncio.run(go())
    assert [r.status for r in results] == ["ok", "ok", "ok"] and results[0].output == "5"
    assert results[1].output == results[2].output  # the same server process: one session
    assert session.calls == 3 and session.restarts == 0


@pytest.mark.subprocess
def test_an_error_result_is_the_tools_error_output():
    async def go():
        toolset = ToolSet(await mcp_tools([SERVER]))
        return await toolset.run([ToolCall("fail", {"reason": "no such file"})])

    (r,) = asyncio.run(go())
    assert r.status == "error" and "no such file" in r.output


@pytest.mark.subprocess
def test_a_server_that_dies_is_restarted_once_then_reports_errors():
    async def go():
        session = await session_for({**SERVER, "max_restarts": 1})
        first = await session.call("pid", {})
        with pytest.raises(MCPToolError):
            await session.call("die", {})
        second = await session.call("pid", {})  # restarted: a new server process
        with pytest.raises(MCPToolError):
            await session.call("die", {})
        with pytest.raises(MCPToolError, match="is gone"):
            await session.call("pid", {})
        return first, second, session.restarts

    first, second, restarts = asyncio.run(go())
    assert first != second and restarts == 1


def test_a_command_that_does_not_exist_is_named():
    with pytest.raises(FileNotFoundError, match="MCP server command 'no-such-mcp-server' not found"):
        asyncio.run(mcp_tools([{"command": "no-such-mcp-server"}]))
    with pytest.raises(ValueError, match="unknown key"):
        asyncio.run(mcp_tools([{"command": "x", "port": 3}]))


@pytest.mark.subprocess
def test_an_episode_calls_an_mcp_tool():
    source = make_task("calc", min_digits=2, max_digits=2)
    env = make_env("tools", source, mcp=[SERVER])
    task = source.sample("train", 1, seed=0)[0]

    async def play():
        await env.reset(task, 0)
        return await env.step("<<add 20, 22>>")

    out = asyncio.run(play())
    assert out.info["tools"] == ["ok"] and "42" in out.observation.text


def test_tools_through_the_sdks_in_process_client():
    mcp = pytest.importorskip("mcp")
    if not hasattr(mcp, "Client"):
        pytest.skip("the in-process mcp.Client is in SDK 2.x")
    import importlib.util

    from schedrl.envs.tools.mcp import MCPSession

    spec = importlib.util.spec_from_file_location("mcp_test_server", Path(__file__).parent / "mcp_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    async def go():
        async with mcp.Client(module.server) as client:
            session = await MCPSession.attach(client)
            toolset = ToolSet(session.as_tools())
            return await toolset.run(
                [ToolCall("add", {"a": 40, "b": 2}), ToolCall("fail", {"reason": "nope"})]
            )

    ok, failed = asyncio.run(go())
    assert (ok.status, ok.output) == ("ok", "42")
    assert failed.status == "error" and "nope" in failed.output


@pytest.mark.sandbox
def test_a_server_started_inside_the_sandbox_is_confined_and_leaves_nothing_behind(monkeypatch):
    from schedrl.envs.tools.mcp import MCPSession
    from schedrl.sandbox.sandbox import BASE_DIR, unavailable_reason
    from schedrl.sandbox.slots import uid_range

    if reason := unavailable_reason():
        pytest.skip(reason)
    monkeypatch.setenv("SCHEDRL_TEST_SECRET", "hunter2")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    spec = MCPServer.of(
        {
            **SERVER,
            "env": {"GREETING": "hi"},
            "sandbox": {"memory_mb": 1024, "expose": [str(Path(__file__).parent)]},
        }
    )

    async def go():
        session = MCPSession(spec)
        await session.start()
        try:
            added = await session.call("add", {"a": 40, "b": 2})
            probe = json.loads(await session.call("probe", {"port": port}))
            (run_dir,) = [
                p for p in (BASE_DIR / "runs").iterdir() if p.name.startswith(f"run-{probe['uid']}-")
            ]
            return added, probe, run_dir
        finally:
            await session.close()

    try:
        added, probe, run_dir = asyncio.run(go())
    finally:
        listener.close()
    assert added == "42"
    assert probe["uid"] in uid_range() and not probe["connected"]  # its own uid, no network
    assert "GREETING" in probe["env"] and "SCHEDRL_TEST_SECRET" not in probe["env"]
    pgrep = subprocess.run(["pgrep", "-U", str(probe["uid"])], capture_output=True)
    assert pgrep.returncode == 1, "a server process survived the session"
    assert not run_dir.exists()
    assert MCPServer.of({**SERVER, "sandbox": {"devices": "gpu"}}).devices == "gpu"  # GPU nodes only if asked
    assert MCPServer.of({**SERVER, "sandbox": True}).devices == ()
    assert MCPServer.of({**SERVER, "sandbox": {"devices": "/dev/nvidia0"}}).devices == ("/dev/nvidia0",)
    with pytest.raises(ValueError, match="unknown sandbox key"):
        MCPServer.of({**SERVER, "sandbox": {"memory": 1}})
