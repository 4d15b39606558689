"""Launch-shape tuning of the CUDA kernels, as data: `default.json` for every GPU, `sm<arch>.json`
beside it for what one architecture measured differently (its entries replace default's, key by key).

`for_arch("90")` gives the `Tuning` of one GPU family; the backend looks its shapes up there and
passes them to the kernel wrappers. The figures behind the values are in docs/tuning-log.md; the
sweep that measures them is bench/micro/gemv_sweep.py (its `write_tuning` writes this format).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TUNING_DIR = Path(__file__).resolve().parent
GEMV_INT_KERNELS = ("SINGLE", "GATED", "MULTI")


@dataclass(frozen=True)
class LaunchShape:
    """One int16-x GEMV build and launch (gemv_int.cu)."""

    rows: int  # rows per warp (gate/up: of each)
    warps: int  # per block
    units: int  # 32-weight units a lane takes per step
    min_blocks: (
        int  # XQ_MIN_BLOCKS of the build: the blocks per multiprocessor ptxas must fit (its register cap)
    )

    @classmethod
    def from_data(cls, data: dict[str, int]) -> LaunchShape:
        return cls(data["rows"], data["warps"], data["units"], data["min_blocks"])

    def to_data(self) -> dict[str, int]:
        return {"rows": self.rows, "warps": self.warps, "units": self.units, "min_blocks": self.min_blocks}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s entries in place, nested tables merged key by key."""
    merged = dict(base)
    for key, value in over.items():
        merged[key] = (
            merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
        )
    return merged


@dataclass(frozen=True, eq=False)
class Tuning:
    """The tuning tables of one GPU family, with the look-ups the wrappers need."""

    arch: str | None
    data: dict[str, Any]

    # -- gemv.cu (float32 x, up to 8 tokens) ---------------------------------------------------
    def gemv_rows(self, bucket: int, qtype_name: str) -> int:
        """Rows per block of gemv.cu for a token bucket and format (a compiled variant)."""
        gemv = self.data["gemv"]
        if bucket == 1 and qtype_name in gemv["single_token_rows"]:
            return gemv["single_token_rows"][qtype_name]
        return gemv["rows_per_block"][str(bucket)]

    def fused_rows(self, bucket: int) -> int:
        """Rows per block of each weight in gemv_multi (gate + up rows together in gemv_gated)."""
        gemv = self.data["gemv"]
        return gemv["fused_rows_single_token"] if bucket == 1 else gemv["rows_per_block"][str(bucket)]

    # -- gemv_int.cu (int16 x, one token) ------------------------------------------------------
    def gemv_int_shape(self, kernel: str, n_cols: int, first_format: str) -> LaunchShape:
        """The launch shape of int16-x kernel `kernel` (SINGLE, GATED, MULTI) over `n_cols` columns
        whose first weight has `first_format`: by width, and from `wide_cols` on by format where
        that format measured better with its own."""
        table = self.data["gemv_int"]
        wide = n_cols >= table["wide_cols"]
        by_format = table["wide_by_format"].get(f"{kernel}_{first_format}")
        if wide and by_format is not None:
            return LaunchShape.from_data(by_format)
        return LaunchShape.from_data(table["shapes"][kernel]["wide" if wide else "narrow"])

    def float_x_from(self, qtype_name: str) -> tuple[int, int] | None:
        """(columns, rows) from which a one-weight product of `qtype_name` measured faster on the float32-x
        kernel than on any int16-x shape (None: at no size)."""
        cut = self.data["gemv_int"]["single_float_x"].get(qtype_name)
        return None if cut is None else (cut["from_cols"], cut["from_rows"])

    @property
    def gemv_int_wide_cols(self) -> int:
        return self.data["gemv_int"]["wide_cols"]

    @property
    def gemv_int_by_format(self) -> tuple[str, ...]:
        """The `<KERNEL>_<FORMAT>` keys with a wide shape of their own."""
        return tuple(sorted(self.data["gemv_int"]["wide_by_format"]))

    @property
    def groups_per_thread(self) -> int:
        """XQ_QB's cap: groups of 16 columns of x a thread loads at once when it quantizes x."""
        return self.data["gemv_int"]["groups_per_thread"]

    @property
    def fused_norm_max_cols(self) -> int:
        """The widest x whose add + RMSNorm is fused into the product after it."""
        return self.data["gemv_int"]["fused_norm_max_cols"]

    # -- attention_decode.cu -------------------------------------------------------------------
    @property
    def decode_blocks_per_sm(self) -> int:
        return self.data["attention_decode"]["blocks_per_sm"]

    def decode_rope_pays(self, n_seqs: int, q_width: int) -> bool:
        """Whether rope + cache write fused into decode attention beats the two launches."""
        table = self.data["attention_decode"]
        return n_seqs <= table["rope_max_seqs"] and q_width >= table["rope_min_q_width"]


def overlay(measured: dict[tuple[str, str, int], LaunchShape], base: Tuning) -> dict[str, Any]:
    """The `sm<arch>.json` entries that make `base` give the `measured` best int16-x shapes, keyed
    (kernel, first weight's format, columns): a wide shape goes in by format, a narrow one for the
    kernel (the table has no narrow shapes by format); those `base` already gives are left out."""
    wide_cols = base.gemv_int_wide_cols
    shapes: dict[str, Any] = {}
    by_format: dict[str, Any] = {}
    for (kernel, first_format, n_cols), shape in sorted(measured.items()):
        if base.gemv_int_shape(kernel, n_cols, first_format) == shape:
            continue
        if n_cols >= wide_cols:
            by_format[f"{kernel}_{first_format}"] = shape.to_data()
        else:
            shapes.setdefault(kernel, {})["narrow"] = shape.to_data()
    table = {k: v for k, v in (("shapes", shapes), ("wide_by_format", by_format)) if v}
    return {"gemv_int": table} if table else {}


def write_overlay(
    arch: str, measured: dict[tuple[str, str, int], LaunchShape], folder: Path = TUNING_DIR
) -> Path:
    """Merge `overlay(measured, ...)` into `folder/sm<arch>.json` (made if absent); returns its path."""
    path = folder / f"sm{arch}.json"
    data = merge(_read(path), overlay(measured, for_arch(arch, folder)))
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    for_arch.cache_clear()
    return path


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


@functools.cache
def for_arch(arch: str | None, folder: Path = TUNING_DIR) -> Tuning:
    """The tuning of compute capability `arch` ("90"; None: default.json alone)."""
    data = _read(folder / "default.json")
    if arch is not None:
        data = merge(data, _read(folder / f"sm{arch}.json"))
    return Tuning(arch, data)


DEFAULT = for_arch(None)
