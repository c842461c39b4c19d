"""`python`: a tool that runs model-written Python in the sandbox (`env_args.tools:
["schedrl.sandbox.tools:python"]`). Its output, or the error's last lines, is the tool's answer."""

from __future__ import annotations

from schedrl.sandbox.unit_tests import default_pool


async def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it printed.

    Args:
        code: the program's source; print what you want to see
    """
    result = await default_pool().run(code=code)
    if result.timed_out:
        return "error: timed out"
    if result.oom:
        return "error: out of memory"
    if result.exit_code != 0:
        tail = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.exit_code}"]
        return f"error: {tail[0]}"
    return result.stdout
