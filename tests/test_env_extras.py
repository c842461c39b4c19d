"""An environment adapter whose package is missing names the extra to install."""

from __future__ import annotations

import importlib.util

import pytest

from schedrl.envs import make_env, make_task


@pytest.mark.skipif(importlib.util.find_spec("verifiers") is not None, reason="verifiers is installed")
def test_a_missing_verifiers_names_its_extra():
    with pytest.raises(
        ImportError, match=r"pip install 'schedrl\[verifiers\]'.* or 'schedrl\[verifiers-v1\]'"
    ):
        make_task("verifiers", env_id="any-env").sample("train", 1, 0)


@pytest.mark.skipif(importlib.util.find_spec("openenv") is not None, reason="openenv-core is installed")
def test_a_missing_openenv_names_its_extra():
    source = make_task("openenv", url="http://127.0.0.1:9")
    with pytest.raises(ImportError, match=r"pip install 'schedrl\[openenv\]'"):
        make_env("openenv", source)
