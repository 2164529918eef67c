"""The vLLM plugin's settings from the environment (docs/VLLM.md 1): what each variable
accepts, and a clear error for what it does not (nothing captured other than what was asked).
No vLLM needed."""

from __future__ import annotations

import pytest

from llm_instrumentation.vllm._settings import ENV_ROTATE, Settings, parse_size


def test_nothing_without_an_output() -> None:
    assert Settings.from_env({}) is None
    assert Settings.from_env({"STRAP_VLLM_OUTPUT": "  "}) is None


def test_defaults_and_values(tmp_path) -> None:
    s = Settings.from_env({"STRAP_VLLM_OUTPUT": str(tmp_path)})
    assert s is not None and s.modules == ("model.layers.*",) and s.requests == "all" and s.rotate_bytes is None
    s = Settings.from_env({"STRAP_VLLM_OUTPUT": str(tmp_path), "STRAP_VLLM_MODULES": "model.layers.1, model.norm",
                           "STRAP_VLLM_REQUESTS": "Opt-In", ENV_ROTATE: "512MiB"})
    assert s is not None and s.modules == ("model.layers.1", "model.norm") and s.requests == "opt-in"
    assert s.rotate_bytes == 512 << 20


@pytest.mark.parametrize("text,want", [("1073741824", 1 << 30), ("512MiB", 512 << 20), ("2 GB", 2 * 10**9),
                                       ("1.5KiB", 1536), ("64kb", 64000), ("3b", 3), ("1TiB", 1 << 40)])
def test_sizes(text: str, want: int) -> None:
    assert parse_size(text, ENV_ROTATE) == want


@pytest.mark.parametrize("text", ["abc", "-1", "0", "0.5", "1XB", "nan", "inf", "1e400", "GiB", "1 2MB"])
def test_bad_sizes_are_errors(text: str) -> None:
    with pytest.raises(ValueError, match=ENV_ROTATE):
        parse_size(text, ENV_ROTATE)


def test_bad_values_are_errors(tmp_path) -> None:
    base = {"STRAP_VLLM_OUTPUT": str(tmp_path)}
    for extra, msg in (({"STRAP_VLLM_REQUESTS": "some"}, "STRAP_VLLM_REQUESTS"),
                       ({"STRAP_VLLM_PRESET": "nope"}, "STRAP_VLLM_PRESET"),
                       ({ENV_ROTATE: "lots"}, ENV_ROTATE)):
        with pytest.raises(ValueError, match=msg):
            Settings.from_env({**base, **extra})
