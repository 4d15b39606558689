"""The checks Qwen2.5-VL's, PaddleOCR-VL's and Muse Glimmer's vision configs share (merged_patches.py):
each parser refuses a head size the 2D rotary embedding cannot split, and the two dynamic-resolution
processors refuse reversed pixel bounds, naming the file the bad value came from."""

from __future__ import annotations

import pytest

from app.engine.loader.names import CheckpointError
from app.engine.models.vision.muse_glimmer_config import muse_glimmer_vision_config
from app.engine.models.vision.paddleocr_config import paddle_vision_config
from app.engine.models.vision.qwen_vl_config import qwen_vision_config

PARSERS = {
    "qwen": (qwen_vision_config, "num_heads", {}),
    "paddle": (paddle_vision_config, "num_attention_heads", {"hidden_size": 64}),
    "muse": (muse_glimmer_vision_config, "num_attention_heads", {}),
}


@pytest.mark.parametrize("family", PARSERS)
def test_defaults_parse_to_the_derived_sizes(family):
    parse, _, top = PARSERS[family]
    cfg = parse({"vision_config": {}, **top}, None)
    assert cfg.head_dim * cfg.num_heads == cfg.hidden_size
    assert cfg.merge_unit == cfg.merge_size**2 and cfg.factor == cfg.patch_size * cfg.merge_size


# each default width: 5 heads leave no whole head size; the other count gives a head size of 7 or 3 (not x4)
@pytest.mark.parametrize(("family", "hidden", "heads"), [("qwen", 3584, 5), ("qwen", 3584, 512),
                                                         ("paddle", 1152, 5), ("paddle", 1152, 384),
                                                         ("muse", 1536, 5), ("muse", 1536, 512)])  # fmt: skip
def test_a_head_size_the_rotary_cannot_split_is_refused(family, hidden, heads):
    parse, key, top = PARSERS[family]
    with pytest.raises(
        CheckpointError, match=f"config.json vision_config: hidden_size {hidden} over {heads} heads"
    ):
        parse({"vision_config": {key: heads}, **top}, None)


@pytest.mark.parametrize("family", ["qwen", "paddle"])
def test_reversed_pixel_bounds_are_refused_naming_the_processor_file(family):
    parse, _, top = PARSERS[family]
    processor = {"min_pixels": 2000 * 2000, "max_pixels": 100 * 100}
    with pytest.raises(
        CheckpointError, match=r"processor_config\.json: min_pixels 4000000 / max_pixels 10000"
    ):
        parse({"vision_config": {}, **top}, processor, "processor_config.json")
