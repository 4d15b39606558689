"""`paddock generate --image FILE ... --chat PROMPT` on the tiny Gemma 3 vision fixture."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import main

FIXTURES = Path(__file__).parents[2] / "fixtures" / "vision"
MODEL = str(FIXTURES / "gemma3" / "hf")
IMAGE_TOKEN = json.loads((FIXTURES / "manifest.json").read_text())["image_token_id"]
BASE = ["generate", "--model", MODEL, "--device", "cpu", "--temperature", "0", "--max-tokens", "2", "--json"]


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main([*BASE, *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_images_go_into_the_chat_prompt(capsys):
    code, out, _ = _run(capsys, "--chat", "--top-logprobs", "3", "Hello")
    assert code == 0
    plain = json.loads(out)
    image = str(FIXTURES / "images" / "odd_rgba.png")
    wide = str(FIXTURES / "images" / "wide.png")  # the whole image and four pan-and-scan crops
    code, out, _ = _run(capsys, "--chat", "--top-logprobs", "3", "--image", image, "--image", wide, "Hello")
    assert code == 0
    record = json.loads(out)
    assert record["prompt_token_ids"].count(IMAGE_TOKEN) == (1 + 5) * 16
    assert record["top_logprobs"][0] != plain["top_logprobs"][0]


def test_image_errors_name_the_problem(capsys, tmp_path):
    image = str(FIXTURES / "images" / "odd_rgba.png")
    code, _, err = _run(capsys, "--image", image, "Hello")
    assert code == 2 and "--image needs --chat" in err
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG not really")
    code, _, err = _run(capsys, "--chat", "--image", str(broken), "Hello")
    assert code == 2 and f"--image {broken}: image could not be decoded" in err
    code, _, err = _run(capsys, "--chat", "--image", str(tmp_path / "missing.png"), "Hello")
    assert code == 2 and "missing.png" in err
