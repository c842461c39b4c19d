"""Tools: schemas from type hints and docstrings, the call parsers, and a turn's calls run concurrently
with every failure returned to the model as the call's output."""

from __future__ import annotations

import asyncio
import time

import pytest

from schedrl.envs.tools import PARSERS, ToolCall, ToolSchemaError, ToolSet, clip_tokens, load_tool, make_tool


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: digits and + - * /, e.g. 12*34
    """
    from schedrl.envs.safe_arith import parse

    return str(parse(expression)[0])


def power(base: int, exponent: int = 2) -> int:
    """Raise a number to a power.

    Args:
        base: the number
        exponent: the power
    """
    return base**exponent


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: ignored
    """
    raise KeyError("no such row")


def test_schema_comes_from_hints_and_docstring():
    tool = make_tool(power)
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "power",
            "description": "Raise a number to a power.",
            "parameters": {
                "type": "object",
                "properties": {
                    "base": {"type": "integer", "description": "the number"},
                    "exponent": {"type": "integer", "description": "the power"},
                },
                "required": ["base"],
            },
            "return": {"type": "integer"},
        },
    }
    assert not tool.is_async


def test_underivable_schemas_name_the_function_and_parameter():
    def untyped(x, y: int) -> int:
        """Adds.

        Args:
            x: one
            y: two
        """
        return y

    def no_doc(x: int) -> int:
        return x

    def star(*values: int) -> int:
        """Sums.

        Args:
            values: numbers
        """
        return 0

    with pytest.raises(ToolSchemaError, match=r"untyped.*Argument x is missing a type hint"):
        make_tool(untyped)
    with pytest.raises(ToolSchemaError, match=r"no_doc.*no docstring"):
        make_tool(no_doc)
    with pytest.raises(ToolSchemaError, match=r"star: parameter 'values' is \*args"):
        make_tool(star)
    with pytest.raises(ValueError, match=r"tool 'tests.nope:calc': cannot import module 'tests.nope'"):
        load_tool("tests.nope:calc")


def test_hermes_parser_reads_one_or_several_calls_per_block():
    tools = {"calc": make_tool(calc), "power": make_tool(power)}
    hermes = PARSERS.get("hermes")()
    assert hermes.stop == "</tool_call>"
    one = hermes.parse(
        'I will compute. <tool_call>{"name": "calc", "arguments": {"expression": "2*3"}}</tool_call>', tools
    )
    assert one == [
        ToolCall("calc", {"expression": "2*3"}, raw='{"name": "calc", "arguments": {"expression": "2*3"}}')
    ]
    two = hermes.parse(
        '<tool_call>[{"name": "calc", "arguments": "{\\"expression\\": \\"1+1\\"}"}, {"name": "power", '
        '"arguments": {"base": 3}}]</tool_call>',
        tools,
    )
    assert [(c.name, c.arguments) for c in two] == [("calc", {"expression": "1+1"}), ("power", {"base": 3})]
    assert hermes.parse("just an answer: 42", tools) == []
    bad = hermes.parse('<tool_call>{"name": "calc", "arguments": {"expression": </tool_call>', tools)
    assert bad[0].name is None and bad[0].error.startswith("malformed JSON")
    assert hermes.format_results(["6"]) == "<tool_response>\n6\n</tool_response>\n"


def test_compact_parser_maps_arguments_to_parameters_in_order():
    tools = {"calc": make_tool(calc), "power": make_tool(power)}
    compact = PARSERS.get("compact")()
    assert compact.stop == ">>"
    calls = compact.parse("<<calc 12*34; power 3, 4>>", tools)
    assert [(c.name, c.arguments) for c in calls] == [
        ("calc", {"expression": "12*34"}),
        ("power", {"base": 3, "exponent": 4}),
    ]
    assert compact.parse("<<power x>>", tools)[0].error == "argument 'base' must be integer, got 'x'"
    assert compact.parse("<<power 1, 2, 3>>", tools)[0].error == "3 arguments, power takes 2"
    assert compact.format_results(["408", "81"]) == "[408][81]"


def _run(toolset: ToolSet, calls: list[ToolCall]):
    return asyncio.run(toolset.run(calls))


def test_every_failure_comes_back_as_output_and_is_counted():
    async def slow(seconds: float) -> str:
        """Sleeps.

        Args:
            seconds: how long
        """
        await asyncio.sleep(seconds)
        return "late"

    toolset = ToolSet([calc, power, broken, make_tool(slow, timeout_s=0.05)])
    results = _run(
        toolset,
        [
            ToolCall("calc", {"expression": "6*7"}),
            ToolCall(None, error="malformed JSON: Expecting value at position 3"),
            ToolCall("nope", {}),
            ToolCall("power", {"base": "two"}),
            ToolCall("power", {"bogus": 1}),
            ToolCall("broken", {"x": 1}),
            ToolCall("slow", {"seconds": 5.0}),
        ],
    )
    statuses = ["ok", "malformed", "unknown_tool", "bad_arguments", "bad_arguments", "error", "timeout"]
    assert [r.status for r in results] == statuses
    assert results[0].output == "42"
    assert "unknown tool 'nope'; tools: broken, calc, power, slow" in results[2].output
    assert results[3].output == "error: argument 'base' must be integer, got 'two'"
    assert results[4].output.startswith("error: unknown argument(s) bogus")
    assert results[5].output == "error: KeyError: 'no such row'"
    assert results[6].output == "error: slow timed out after 0.05 s"
    assert toolset.counts == {
        "ok": 1,
        "malformed": 1,
        "unknown_tool": 1,
        "bad_arguments": 2,
        "error": 1,
        "timeout": 1,
    }


def test_calls_of_one_turn_run_concurrently():
    """Three calls that each wait until all three have started: run one after another, the first would
    time out waiting for the others."""

    async def main():
        started: list[str] = []
        gate = asyncio.Event()

        def make(name: str):
            async def waits(tag: str) -> str:
                """Waits for the others.

                Args:
                    tag: a label
                """
                started.append(tag)
                if len(started) == 3:
                    gate.set()
                await gate.wait()
                return tag

            waits.__name__ = waits.__qualname__ = name
            return waits

        toolset = ToolSet([make("a"), make("b"), make("c")], timeout_s=2.0)
        return await toolset.run([ToolCall(n, {"tag": n}) for n in "abc"])

    assert [(r.status, r.output) for r in asyncio.run(main())] == [("ok", "a"), ("ok", "b"), ("ok", "c")]


def test_sync_tools_run_off_the_event_loop():
    def blocking(seconds: float) -> str:
        """Blocks its thread.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "done"

    async def main():
        toolset = ToolSet([blocking], timeout_s=2.0)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        task = asyncio.create_task(ticker())
        out = await toolset.run([ToolCall("blocking", {"seconds": 0.2})])
        task.cancel()
        return out, ticks

    out, ticks = asyncio.run(main())
    assert out[0].output == "done" and ticks > 5  # the loop kept running while the tool blocked


def test_per_tool_concurrency_limit():
    running, peak = 0, 0

    async def limited(i: int) -> int:
        """One at a time.

        Args:
            i: an index
        """
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return i

    toolset = ToolSet([make_tool(limited, max_concurrency=2)])
    results = _run(toolset, [ToolCall("limited", {"i": i}) for i in range(6)])
    assert [r.output for r in results] == [str(i) for i in range(6)] and peak == 2


def test_clip_keeps_head_and_tail_in_tokens(tokenizer):
    text = "0123456789" * 5
    ids = clip_tokens(tokenizer, text, 20)
    assert len(ids) == 20
    decoded = tokenizer.decode(ids)
    assert decoded.startswith("01234567") and decoded.endswith("23456789") and "..." in decoded
    assert clip_tokens(tokenizer, "short", 20) == tokenizer("short", add_special_tokens=False).input_ids
    assert clip_tokens(tokenizer, text, 4) == tokenizer("0123", add_special_tokens=False).input_ids
