"""The memory plan counts gemv_q4r's repacked copies (PADDOCK_Q4R_MAX_TOKENS), as dense.py makes them: Q4_K
in the 4-bit layout (codes 0.5 + scale pairs 0.125 bytes a weight), Q6_K and a fused group where a Q6_K part
meets Q4_K ones in the byte layout (1 + 0.25), each with a float32 factor per row."""

from __future__ import annotations

from dataclasses import replace

from app.engine.plan.device import GiB
from app.engine.plan.memory import FitOptions, memory, weight_copy_bytes
from app.engine.plan.shape import ModelShape, repacked_bytes

HIDDEN, FF, Q_ROWS, KV_ROWS = 4096, 12288, 4096, 1024


def four_bit(rows: int, cols: int) -> int:
    return rows * cols // 2 + rows * cols // 8 + 4 * rows


def byte_layout(rows: int, cols: int) -> int:
    return rows * cols + rows * cols // 4 + 4 * rows


def layer(i: int, v: str = "Q4_K", down: str = "Q4_K") -> list[tuple[str, str, tuple[int, int]]]:
    return [
        (f"blk.{i}.attn_q.weight", "Q4_K", (Q_ROWS, HIDDEN)),
        (f"blk.{i}.attn_k.weight", "Q4_K", (KV_ROWS, HIDDEN)),
        (f"blk.{i}.attn_v.weight", v, (KV_ROWS, HIDDEN)),
        (f"blk.{i}.attn_output.weight", "Q4_K", (HIDDEN, Q_ROWS)),
        (f"blk.{i}.ffn_gate.weight", "Q4_K", (FF, HIDDEN)),
        (f"blk.{i}.ffn_up.weight", "Q4_K", (FF, HIDDEN)),
        (f"blk.{i}.ffn_down.weight", down, (HIDDEN, FF)),
        (f"blk.{i}.attn_norm.weight", "F32", (HIDDEN,)),
    ]


def test_a_q4_k_layer_is_all_in_the_four_bit_layout() -> None:
    expected = (four_bit(Q_ROWS + 2 * KV_ROWS, HIDDEN) + four_bit(HIDDEN, Q_ROWS) + four_bit(2 * FF, HIDDEN)
                + four_bit(HIDDEN, FF))  # fmt: skip
    assert repacked_bytes(layer(0)) == expected


def test_a_q6_k_value_puts_the_whole_qkv_in_the_byte_layout() -> None:
    """Q4_K_M's layers with a Q6_K attn_v / ffn_down: the fused q/k/v is packed as one, in bytes."""
    expected = (byte_layout(Q_ROWS + 2 * KV_ROWS, HIDDEN) + four_bit(HIDDEN, Q_ROWS) + four_bit(2 * FF, HIDDEN)
                + byte_layout(HIDDEN, FF))  # fmt: skip
    assert repacked_bytes(layer(3, v="Q6_K", down="Q6_K")) == expected


def test_a_part_that_does_not_pack_leaves_the_others_their_own_copies() -> None:
    """A Q8_0 value: q and k keep their own 4-bit copies, not one stacked with the value."""
    tensors = layer(1, v="Q8_0")
    without_qkv = repacked_bytes([t for t in tensors if "attn_" not in t[0] or "output" in t[0]])
    assert repacked_bytes(tensors) - without_qkv == four_bit(Q_ROWS, HIDDEN) + four_bit(KV_ROWS, HIDDEN)


def test_the_embedding_and_odd_shapes_are_not_counted_and_the_head_is() -> None:
    vocab = 151936
    assert repacked_bytes([("token_embd.weight", "Q4_K", (vocab, HIDDEN))]) == 0
    assert repacked_bytes([("output.weight", "Q6_K", (vocab, HIDDEN))]) == byte_layout(vocab, HIDDEN)
    assert repacked_bytes([("output.weight", "Q8_0", (vocab, HIDDEN))]) == 0
    assert repacked_bytes([("blk.0.ffn_down.weight", "Q4_K", (HIDDEN, 100))]) == 0  # not whole 256-blocks
    assert repacked_bytes([("blk.0.ffn_down.weight", "Q4_K", (40, HIDDEN))]) == 0  # not whole 16-row tiles


def test_the_weight_cache_takes_them_only_when_the_switch_is_on() -> None:
    tensors = [t for i in range(36) for t in layer(i, *(("Q6_K", "Q6_K") if i % 2 else ()))]
    tensors.append(("output.weight", "Q6_K", (151936, HIDDEN)))
    shape = ModelShape("qwen3", 36, HIDDEN, 32, 8, 128, FF, 151936, 40960, 5 * GiB,
                       repacked_bytes=repacked_bytes(tensors))  # fmt: skip
    assert 5.5e9 < shape.repacked_bytes < 6.5e9  # Qwen3-8B Q4_K_M: about 6 GB with its Q6_K head
    free = 120 * GiB
    off = memory(shape, FitOptions(repack_max_tokens=0), "cuda", free)
    on = memory(shape, FitOptions(repack_max_tokens=128), "cuda", free)
    assert off.weight_cache == weight_copy_bytes(shape)
    assert on.weight_cache - off.weight_cache == shape.repacked_bytes
    assert on.total - off.total == shape.repacked_bytes
    assert memory(replace(shape, repacked_bytes=0), FitOptions(repack_max_tokens=128), "cuda",
                  free).weight_cache == off.weight_cache  # fmt: skip
    # the same budget (a share of the free memory) caps float16 and repacked copies together, and with the
    # repacked ones counted a GPU needs more room before the "auto" rule takes any
    tight = 2 * (shape.weight_bytes + weight_copy_bytes(shape, repacked=True))
    assert memory(shape, FitOptions(repack_max_tokens=128), "cuda", tight).weight_cache == int(0.35 * tight)
    assert memory(shape, FitOptions(repack_max_tokens=128), "cuda", tight - 1).weight_cache == 0
    assert memory(shape, FitOptions(repack_max_tokens=0), "cuda", tight - 1).weight_cache > 0
