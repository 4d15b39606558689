"""Reading a sentence-transformers model folder: which files, which pipeline, which window.

A folder has `config.json`, `model.safetensors` and `tokenizer.json` at its root, and may
have `modules.json` (the pipeline: Transformer -> Pooling -> optional Normalize),
`sentence_bert_config.json` (`max_seq_length`) and the pooling module's `config.json`.
A plain Hugging Face BERT folder without them gets mean pooling and the model's full
position range as its window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.embeddings.pooling import PoolingConfig

_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class EmbeddingFolder:
    root: Path
    pooling: PoolingConfig
    max_seq_length: int | None  # None: not declared, use the model's position range
    normalizes: bool  # the folder's own pipeline ends in Normalize

    @property
    def config_path(self) -> Path:
        return self.root / "config.json"

    @property
    def weights_path(self) -> Path:
        return self.root / "model.safetensors"

    @property
    def tokenizer_path(self) -> Path:
        return self.root / "tokenizer.json"

    @classmethod
    def read(cls, path: str | Path) -> EmbeddingFolder:
        root = Path(path)
        if not root.is_dir():
            raise FileNotFoundError(f"embedding model folder {root} does not exist or is not a folder")
        missing = [
            n for n in ("config.json", "model.safetensors", "tokenizer.json") if not (root / n).is_file()
        ]
        if missing:
            raise FileNotFoundError(f"embedding model folder {root} lacks {', '.join(missing)}")
        modules = _read_json(root / "modules.json") if (root / "modules.json").is_file() else None
        pooling = PoolingConfig()
        normalizes = False
        if modules is not None:
            for module in modules:
                kind, module_path = module.get("type", ""), module.get("path", "")
                if kind == _POOLING:
                    pooling = PoolingConfig.from_file(root / module_path / "config.json")
                elif kind == _NORMALIZE:
                    normalizes = True
                elif kind != _TRANSFORMER:
                    raise ValueError(
                        f"{root / 'modules.json'}: module type {kind!r} is not supported "
                        f"(supported: Transformer, Pooling, Normalize)"
                    )
        st_config = root / "sentence_bert_config.json"
        max_seq_length = _read_json(st_config).get("max_seq_length") if st_config.is_file() else None
        return cls(root, pooling, None if max_seq_length is None else int(max_seq_length), normalizes)

    def load_tensors(self) -> dict[str, np.ndarray]:
        from safetensors.numpy import load_file

        try:
            return load_file(str(self.weights_path))
        except Exception as error:  # safetensors raises its own SafetensorError and TypeError (bf16)
            raise ValueError(f"cannot read weights {self.weights_path}: {error}") from error


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
