"""EngineHost: loading, switching and unloading the local model off the caller's thread, and its status."""

from __future__ import annotations

import threading

import pytest

from app.engine.config import EngineConfig
from app.engine.interface import ModelInfo
from app.studio.runtime import EngineHost, MemoryUse, RuntimeStatus, load_error_message, process_memory
from app.studio.tasks import SyncExecutor


class StubEngine:
    """What the host needs of an engine: its ModelInfo, stats and close()."""

    def __init__(self, config: EngineConfig) -> None:
        self.model = ModelInfo(f"{config.model}-name", f"/models/{config.model}", "llama", "Q4_K_M", 1_000,
                               4096, "cpu")
        self.closed = False

    def stats(self):
        from app.engine.interface import EngineStats

        return EngineStats(0, 0, 16, 64, 0, 0, 0, 0, 0, device_memory_used_bytes=0)

    def close(self) -> None:
        self.closed = True


def _factory(built: list[StubEngine]):
    def make(config: EngineConfig) -> StubEngine:
        if config.model == "broken.gguf":
            raise ValueError("broken.gguf is not a GGUF file (bad magic b'JUNK')")
        if config.model == "missing.gguf":
            raise FileNotFoundError("model 'missing.gguf' not found: no such file or folder")
        built.append(StubEngine(config))
        return built[-1]

    return make


def test_load_reports_what_is_loaded_and_every_step_to_listeners():
    built: list[StubEngine] = []
    host = EngineHost(_factory(built), executor=SyncExecutor())
    seen: list[RuntimeStatus] = []
    host.subscribe(seen.append)
    result = host.load(EngineConfig(model="a.gguf")).result()
    assert result.ok and result.value == host.status
    assert [s.state for s in seen] == ["loading", "ready"]
    status = host.status
    assert (status.model, status.quantization, status.context_length, status.device) == \
        ("a.gguf-name", "Q4_K_M", 4096, "cpu")
    assert host.client is built[0]


def test_switching_loads_the_new_model_before_releasing_the_old_one():
    built: list[StubEngine] = []
    host = EngineHost(_factory(built), executor=SyncExecutor())
    host.load(EngineConfig(model="a.gguf"))
    seen: list[str] = []
    host.subscribe(lambda s: seen.append(f"{s.state}:{len(built)}:{built[0].closed}"))
    host.load(EngineConfig(model="b.gguf"))
    assert seen == ["loading:1:False", "unloading:2:False", "ready:2:True"]  # b was made while a served
    assert host.client is built[1] and host.status.model == "b.gguf-name"
    host.unload()
    assert host.client is None and host.status.state == "empty" and built[1].closed


def test_a_failed_switch_keeps_the_old_model_loaded():
    built: list[StubEngine] = []
    host = EngineHost(_factory(built), executor=SyncExecutor())
    host.load(EngineConfig(model="a.gguf"))
    result = host.load(EngineConfig(model="broken.gguf")).result()
    assert not result.ok and "bad magic" in result.error_message
    assert host.client is built[0] and not built[0].closed
    status = host.status
    assert status.ready and status.model == "a.gguf-name" and "bad magic" in status.problem
    assert status.message.endswith("a.gguf-name is still loaded.")


def test_on_the_gpu_the_old_model_is_released_first():
    built: list[StubEngine] = []

    def make(config: EngineConfig) -> StubEngine:
        engine = _factory(built)(config)
        engine.model = ModelInfo(engine.model.name, engine.model.path, "llama", "Q4_K_M", 1_000, 4096, "cuda:0")
        return engine

    host = EngineHost(make, executor=SyncExecutor())
    host.load(EngineConfig(model="a.gguf"))
    seen: list[str] = []
    host.subscribe(lambda s: seen.append(f"{s.state}:{len(built)}:{built[0].closed}"))
    host.load(EngineConfig(model="b.gguf"))
    assert seen[1:] == ["unloading:1:False", "loading:1:True", "ready:2:True"]


@pytest.mark.parametrize(("model", "words"), [("broken.gguf", "bad magic"), ("missing.gguf", "was not found")])
def test_a_failed_load_is_a_status_with_a_readable_message(model, words):
    host = EngineHost(_factory([]), executor=SyncExecutor())
    result = host.load(EngineConfig(model=model)).result()
    assert not result.ok and host.client is None
    assert host.status.state == "error"
    assert words in host.status.message and model in host.status.message
    assert result.error_message == host.status.message
    assert "Traceback" not in host.status.message


def test_load_runs_on_the_hosts_own_thread():
    threads: list[str] = []

    def factory(config: EngineConfig) -> StubEngine:
        threads.append(threading.current_thread().name)
        return StubEngine(config)

    host = EngineHost(factory)
    try:
        assert host.load(EngineConfig(model="a.gguf")).result(timeout=10).ok
        assert threads and threads[0] != threading.current_thread().name
    finally:
        host.shutdown()


def test_memory_snapshot_reads_the_engine_stats_and_the_process():
    host = EngineHost(_factory([]), executor=SyncExecutor())
    assert host.memory().kv_blocks_total == 0
    host.load(EngineConfig(model="a.gguf"))
    memory = host.memory()
    assert (memory.kv_blocks_used, memory.kv_blocks_total) == (16, 64)
    assert memory.process_bytes == pytest.approx(process_memory(), rel=0.5)
    assert "RAM" in memory.describe() and "KV 25%" in memory.describe()
    assert MemoryUse(None, 3 << 30).describe() == "GPU 3.00 GiB"


def test_adopt_takes_an_already_loaded_engine():
    host = EngineHost(_factory([]), executor=SyncExecutor())
    engine = StubEngine(EngineConfig(model="x"))
    host.adopt(engine)
    assert host.client is engine and host.status.ready and host.status.model == "x-name"


def test_error_messages_name_the_model():
    assert "not enough memory" in load_error_message("big.gguf", MemoryError())
    assert load_error_message("m", RuntimeError("no CUDA device")) == "Could not load m: no CUDA device"
