"""Every environment variable the engine reads, declared once: name, type, default, one line of doc.

They are A/B switches for benchmarks and kernel work, not product settings (those are
`EngineConfig` fields). Read as `envs.PADDOCK_PDL`: parsed at first use and cached for the
process; `reload()` forgets the cache (tests that set a variable call it). docs/configuration.md
is generated from DECLARED (`python -m app.engine.envs docs/configuration.md` rewrites its table;
tests/engine/test_envs.py checks it is in sync).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def _bool(name: str, text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"${name} must be 0 or 1, not {text!r}")


def _int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"${name} must be a whole number, not {text!r}") from None


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        if text not in choices:
            raise ValueError(f"${name} must be one of {', '.join(choices)}, not {text!r}")
        return text

    parse.__name__ = " or ".join(choices)
    return parse


def _text(name: str, text: str) -> str:
    return text


def _defines(name: str, text: str) -> Mapping[str, str]:
    """`NAME=VALUE,NAME2 ...` (commas or spaces): a bare NAME is defined as 1."""
    pairs = (item.partition("=") for item in text.replace(",", " ").split())
    return MappingProxyType({key: value or "1" for key, _, value in pairs})


def _shape(name: str, text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"${name} must be 'rows,warps,units' (three positive numbers), not {text!r}")
    rows, warps, units = (int(p) for p in parts)
    return rows, warps, units


_TYPE_NAMES = {
    _bool: "0 or 1",
    _int: "integer",
    _text: "text",
    _defines: "NAME=VALUE,...",
    _shape: "rows,warps,units",
}


@dataclass(frozen=True)
class EnvVar:
    """One variable, or with `prefix` a family of them (`<name><KEY>`, each parsed by `parse`)."""

    name: str
    parse: Callable[[str, str], Any]
    default: Any
    doc: str
    prefix: bool = False

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES.get(self.parse, self.parse.__name__)

    def read(self, environ: Mapping[str, str]) -> Any:
        """The parsed value from `environ`: unset or empty gives the default; a family gives
        {KEY: value} of every variable named `<name><KEY>`, over its default's entries."""
        if self.prefix:
            found = {
                k.removeprefix(self.name): v for k, v in environ.items() if k.startswith(self.name) and v
            }
            parsed = {key: self.parse(self.name + key, v) for key, v in found.items()}
            return MappingProxyType(dict(sorted({**self.default, **parsed}.items())))
        text = environ.get(self.name, "").strip()
        return self.parse(self.name, text) if text else self.default


DECLARED: tuple[EnvVar, ...] = (
    # kernel path choices: the defaults of KernelOptions (kernels/options.py)
    EnvVar("PADDOCK_PDL", _bool, True, "programmatic dependent launches inside decode graphs (sm_90+)"),
    EnvVar("PADDOCK_DECODE_ATTENTION", _bool, True, "decode batches on attention_decode.cu (else attention.cu)"),
    EnvVar("PADDOCK_DECODE_CLUSTERS", _bool, True, "decode attention merges in thread-block clusters (sm_90+)"),
    EnvVar("PADDOCK_CASCADE", _bool, True,
           "decode graphs read the blocks every sequence of the batch shares once (cascade attention: "
           "8 sessions over an 8,000-token prefix step in 8.6 instead of 10.9 ms on an H100)"),
    EnvVar("PADDOCK_CASCADE_OWN_BLOCKS", _int, 0,
           "blocks a (sequence, KV head) of a cascade decode's own keys (attention_decode.cu past the shared prefix); "
           "0: attention_cascade.OWN_BLOCKS (4), or fewer where a plain decode's plan has fewer"),
    EnvVar("PADDOCK_DECODE_SHORT_CONTEXT", _int, 0,
           "decode graphs of up to 8 rows get a second capture whose attention is planned for contexts of at most this "
           "many tokens, replayed for steps whose every context fits (the first capture plans for the model's whole "
           "context: at one sequence, 64 blocks a KV head over a few hundred keys); 0: off (an A/B switch, unmeasured)"),
    EnvVar("PADDOCK_CASCADE_KEY_WARPS", _int, 32,
           "most rows (sequences x query heads a KV head) whose cascade shared part runs on the build whose warps "
           "split each tile's keys (attention_prefill.cu PF_KEY_WARPS; within one of its row tiles: 32 rows, 16 from head "
           "dim 256); 0: never. 32 (8 sessions of Qwen3-8B): "
           "c=8 over an 8,000-token prefix 6.53 -> 6.29 ms a token on an H100; at 64 rows the build is slower"),
    EnvVar("PADDOCK_DECODE_ROPE", _choice("1", "0", "all"), "1",
           "rope + cache write fused into decode attention: 1 where it pays, all wherever supported, 0 never"),
    EnvVar("PADDOCK_GEMV_INT_X", _bool, True, "single-token GEMVs over int16-quantized x (gemv_int.cu)"),
    EnvVar("PADDOCK_GEMV_INT_MULTI", _bool, True, "q/k/v in one int16-x launch too (gemv_int_multi)"),
    EnvVar("PADDOCK_GEMV_RESIDENT", _bool, True, "cap int16-x grids at the blocks the GPU holds at once"),
    EnvVar("PADDOCK_GEMV_MMA_MAX_TOKENS", _int, 0,
           "most tokens a product takes on quantized weights through tensor cores (gemv_mma), from 3; 0: never"),
    EnvVar("PADDOCK_GEMV_MMA_NO_COPY", _int, 64,
           "the same for a weight without a float16 copy (else it is expanded for every product); 0: never"),
    EnvVar("PADDOCK_GEMV_MMA_COPY_", _int, MappingProxyType({"Q4_K": 16}),
           "most tokens a product takes on gemv_mma on a weight of format `<KEY>` (Q4_K, ...) that has a float16 "
           "copy, from 3, over PADDOCK_GEMV_MMA_MAX_TOKENS (0: the copy, through cuBLAS). H100, 2026-12-06, "
           "Qwen3-8B-shaped Q4_K_M: the decode step at 8 / 16 sequences 6.52 -> 5.45 / 7.17 -> 6.03 ms; at 32 "
           "the copies stay faster (Q4_K=32: 8.24 against 7.31 ms)", prefix=True),
    EnvVar("PADDOCK_GEMV_MMA_COPY_TALL", _int, 32,
           "the same bound for a weight of such a format with at least 16,384 rows (a fused gate/up), where larger; "
           "0: none. H100, 2026-12-07, Qwen3-8B-shaped Q4_K_M, the decode step at 20 / 32 sequences: 6.92 -> 6.18 "
           "/ 7.39 -> 6.76 ms (0 against 32, two pairs); 64 is slower than 32 at 40-64 sequences (7.82 against "
           "7.48 ms at 40); served at c=32, 3,769 -> 4,053 tok/s"),
    EnvVar("PADDOCK_GEMV_MMA_SPLITS", _int, 8,
           "most column splits (1, 2, 4, 8) of a row tile of gemv_mma2 where its rows are few; on sm_90+ they add up "
           "in a thread-block cluster, in a fixed order; without clusters at most 2 (float atomics, still the same "
           "bits every run). H100, 2026-12-07, Qwen3-8B-shaped Q4_K_M down (4,096 rows) at 32 tokens: 196.6 / "
           "104.3 / 80.1 / 68.5 us at 1 / 2 / 4 / 8 splits"),
    EnvVar("PADDOCK_Q4R_MAX_TOKENS", _int, 0,
           "most tokens a product takes on Q4_K / Q6_K weights repacked for the tensor cores (gemv_q4r.cu: 0.625 / "
           "1.25 bytes a weight, made at load), from PADDOCK_Q4R_MIN_TOKENS, at most 128; 0: never, and no repacked copies. "
           "Their bytes come out of the float16 weight cache's budget, and `paddock fit` counts them when this is set"),
    EnvVar("PADDOCK_Q4R_MIN_TOKENS", _int, 2, "the fewest tokens a product takes on the repacked weights"),
    EnvVar("PADDOCK_SPLIT_MIXED_STEPS", _bool, False,
           "a step of decodes and one prompt's chunk runs as two graph replays (the decode graph, then the prefill "
           "graph) instead of one eager pass, which costs ~23 ms more than a decode-only step on a Qwen3-8B (H100, "
           "the step cost model's c0 in bench/results/gpu-agent-engine-s21-2026-12-06.jsonl)"),
    EnvVar("PADDOCK_GEMV_MMA_KERNEL", _choice("v1", "v2"), "v2",
           "those products' kernel: v1 gemv_mma.cu, v2 gemv_mma2.cu (staged float16 x; gemv_mma.py)"),
    EnvVar("PADDOCK_GEMV_QB", _int, None, "groups of 16 x columns a thread quantizes at once (default: tuning table)"),
    EnvVar("PADDOCK_FUSED_NORM_MAX_COLS", _int, None,
           "widest x whose add + RMSNorm is fused into the next GEMV (default: tuning table)"),
    EnvVar("PADDOCK_MOE_FUSED_DECODE", _bool, True,
           "MoE at 1 to 4 tokens: products per (token, expert) pair, the down product and the combine in one "
           "launch (kernels/moe.py's moe_few_tokens; 0: the grouped path)"),
    EnvVar("PADDOCK_MOE_INT_X", _bool, True,
           "the grouped MoE products off the tensor cores (decode batches) over int16 x, for formats with integer "
           "codes (moe.cu's moe_grouped_int_<fmt>; 0: float32 x). H200, 2026-12-06: the decode step at 32 "
           "sequences 26.5 -> 19.6 ms on a Gemma-4-26B-A4B-shaped Q4_K_M file, 31.8 -> 21.6 ms on a "
           "Qwen3-30B-A3B-shaped one (8 sequences: 11.0 -> 8.4 ms)"),
    EnvVar("PADDOCK_GEMV_MIN_BLOCKS", _int, None, "XQ_MIN_BLOCKS (register cap) of every int16-x build"),
    EnvVar("PADDOCK_GEMV_MIN_BLOCKS_", _int, MappingProxyType({}),
           "XQ_MIN_BLOCKS of one kernel: `<KEY>` is `<KERNEL>[_<FORMAT>]` (GATED, MULTI_Q4_K, ...)", prefix=True),
    EnvVar("PADDOCK_GEMV_SHAPE_", _shape, MappingProxyType({}),
           "int16-x launch shape of one kernel: `<KEY>` as above, the format-specific key winning", prefix=True),
    EnvVar("PADDOCK_GEMV_FLOAT_X_", _int, MappingProxyType({}),
           "the width from which a one-weight single-token product of format `<KEY>` (Q4_K, ...) goes to the "
           "float32-x kernel instead of int16-x, at any row count (0: never; default: the tuning table's size)",
           prefix=True),
    # serving
    EnvVar("PADDOCK_JOIN_BACKLOG", _bool, True,
           "a stream whose reader is behind the engine gets its piled-up outputs as one (AsyncEngine.generate: "
           "one frame for several steps' tokens); 0: one output a step, for A/B runs of the server's host path"),
    # kernel compilation
    EnvVar("PADDOCK_KERNEL_DEFINES", _defines, MappingProxyType({}),
           "`-D` defines added to every kernel build, for A/B runs of a kernel constant"),
    EnvVar("PADDOCK_KERNEL_CACHE", _text, None, "folder of compiled kernels (default: the user cache folder's paddock/kernels)"),
    EnvVar("XDG_CACHE_HOME", _text, None, "platform: the user cache folder on Linux (default ~/.cache)"),
    EnvVar("LOCALAPPDATA", _text, None, "platform: the user cache folder on Windows"),
)  # fmt: skip
_BY_NAME = {var.name: var for var in DECLARED}
_values: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    var = _BY_NAME.get(name)
    if var is None:
        raise AttributeError(f"{name} is not a declared engine environment variable (app/engine/envs.py)")
    if name not in _values:
        _values[name] = var.read(os.environ)
    return _values[name]


def __dir__() -> list[str]:
    return sorted([*globals(), *_BY_NAME])


def reload() -> None:
    """Forget every cached value: the next read sees the environment as it is now (tests)."""
    _values.clear()


TABLE_BEGIN = "<!-- envs table: generated by python -m app.engine.envs docs/configuration.md -->"
TABLE_END = "<!-- end of envs table -->"


def markdown() -> str:
    """docs/configuration.md's table of switches."""
    rows = [
        f"| `{v.name}{'<KEY>' if v.prefix else ''}` | {v.type_name} | {_default_text(v)} | {v.doc} |"
        for v in DECLARED
    ]
    return (
        "\n".join(["| variable | type | default | what it does |", "| --- | --- | --- | --- |", *rows]) + "\n"
    )


def _default_text(var: EnvVar) -> str:
    if isinstance(var.default, Mapping) and var.default:
        return ", ".join(f"{key}={value}" for key, value in var.default.items())
    if var.prefix or var.default is None or isinstance(var.default, Mapping):
        return "unset"
    if isinstance(var.default, bool):
        return "1" if var.default else "0"
    return str(var.default)


def with_table(doc: str) -> str:
    """`doc` with the text between TABLE_BEGIN and TABLE_END replaced by markdown()."""
    head, begin, rest = doc.partition(TABLE_BEGIN)
    _, end, tail = rest.partition(TABLE_END)
    if not begin or not end:
        raise ValueError(f"the document has no {TABLE_BEGIN!r} ... {TABLE_END!r} section")
    return f"{head}{TABLE_BEGIN}\n{markdown()}{TABLE_END}{tail}"


def set_library_default(name: str, value: str) -> None:
    """Give a variable that another library reads (not the engine: e.g. libgomp's OMP_WAIT_POLICY) a
    default, keeping the user's value where set; the one place the engine writes the environment."""
    os.environ.setdefault(name, value)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        path = Path(sys.argv[1])
        path.write_text(with_table(path.read_text()))
    else:
        print(markdown(), end="")
