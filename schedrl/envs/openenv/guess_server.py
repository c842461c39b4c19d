"""An OpenEnv server of the higher/lower game, for the `openenv` adapter's tests and recipe.

    python -m schedrl.envs.openenv.guess_server --port 8000      # needs schedrl[openenv]

`reset(seed)` picks a secret in [0, high] from the seed; each step's action is `{"guess": int}`; the
observation's `message` is `+` (higher), `-` (lower) or `=` (found, reward 1, done); past `max_guesses`
the episode ends with reward 0. `--step-delay-s` makes each step that slow (a server that does not
answer in time).
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from openenv.core import Action, Environment, Observation, State, create_fastapi_app


class GuessAction(Action):
    guess: int


class GuessObservation(Observation):
    message: str = ""


class GuessState(State):
    secret: int = 0


class GuessGame(Environment[GuessAction, GuessObservation, GuessState]):
    SUPPORTS_CONCURRENT_SESSIONS = True
    high, max_guesses, step_delay_s = 63, 6, 0.0

    def __init__(self) -> None:
        super().__init__()
        self._state = GuessState()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GuessObservation:
        self._state = GuessState(episode_id=episode_id, secret=random.Random(seed).randint(0, self.high))
        return GuessObservation(message=f"guess 0-{self.high}")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        time.sleep(self.step_delay_s)
        self._state.step_count += 1
        secret = self._state.secret
        if action.guess == secret:
            return GuessObservation(message="=", done=True, reward=1.0)
        if self._state.step_count >= self.max_guesses:
            return GuessObservation(message="out of guesses", done=True, reward=0.0)
        return GuessObservation(message="+" if secret > action.guess else "-", reward=0.0)

    @property
    def state(self) -> GuessState:
        return self._state


def make_app(high: int = 63, max_guesses: int = 6, step_delay_s: float = 0.0, max_sessions: int = 64) -> Any:
    """The FastAPI app serving the game (one environment per WebSocket session)."""
    game = type(
        "Game", (GuessGame,), {"high": high, "max_guesses": max_guesses, "step_delay_s": step_delay_s}
    )
    return create_fastapi_app(game, GuessAction, GuessObservation, max_concurrent_envs=max_sessions)


def serve_in_thread(**game: Any) -> tuple[str, Any]:
    """Serve the game on a free loopback port from a daemon thread (tests, examples); returns its URL
    once it answers `/health`, and the uvicorn server (set `should_exit` to stop it)."""
    import socket
    import threading
    import urllib.request

    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(make_app(**game), host="127.0.0.1", port=port, log_level="critical")
    )
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return url, server
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the guess server on {url} did not start")


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--high", type=int, default=63)
    ap.add_argument("--max-guesses", type=int, default=6)
    ap.add_argument("--step-delay-s", type=float, default=0.0)
    args = ap.parse_args()
    app = make_app(args.high, args.max_guesses, args.step_delay_s)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
