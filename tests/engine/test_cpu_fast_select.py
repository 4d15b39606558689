"""Choosing the CPU products: config values checked, the CLI's arguments reach EngineConfig."""

from __future__ import annotations

import argparse

import pytest

from app.commands.common import add_model_arguments, engine_config
from app.engine.backend import cpu_backend, select_backend
from app.engine.backend.cpu import CpuBackend
from app.engine.backend.cpu_fast.backend import FastCpuBackend
from app.engine.config import EngineConfig


def test_backends_by_name() -> None:
    assert type(cpu_backend("numpy")) is CpuBackend
    assert isinstance(cpu_backend("numba"), FastCpuBackend)
    assert isinstance(cpu_backend("auto"), FastCpuBackend)  # numba is a dependency: auto finds it
    backend = select_backend("cpu", cpu_kernels="numba", threads=1)
    assert isinstance(backend, FastCpuBackend) and backend.threads == 1


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cpu_kernels", "fast", "cpu_kernels must be auto, numba or numpy"),
    ("threads", 0, "threads must be at least 1"),
])  # fmt: skip
def test_bad_config_values_are_named(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{field: value})


def test_cli_arguments_reach_the_engine_config() -> None:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    config = engine_config(parser.parse_args(["--cpu-kernels", "numpy", "--threads", "2"]))
    assert (config.cpu_kernels, config.threads) == ("numpy", 2)
    default = engine_config(parser.parse_args([]))
    assert (default.cpu_kernels, default.threads) == ("auto", None)
    with pytest.raises(SystemExit):
        parser.parse_args(["--cpu-kernels", "cuda"])
