"""HubSession: what the hub browser picks from a listing and what of it is on disk, without a window."""

from pathlib import Path

import pytest

from app.studio.downloads import PARTIAL_SUFFIX, RemoteFile, RepoListing, model_folder
from app.studio.hub_session import HubSession

MODEL, PROJECTOR = "m-Q4_K_M.gguf", "mmproj-m-f16.gguf"
SHARDS = ("big-00001-of-00002.gguf", "big-00002-of-00002.gguf")


def _listing(*paths: str) -> RepoListing:
    return RepoListing("org/m", "a" * 40, tuple(RemoteFile(p, 1000 + i) for i, p in enumerate(paths)))


def test_a_repo_with_one_gguf_model_picks_it_with_its_projector_unless_unticked(tmp_path: Path) -> None:
    session = HubSession(lambda: tmp_path)
    session.open(_listing(MODEL, PROJECTOR, "README.md"))
    assert session.first_choice() == (True, MODEL)
    choice = session.choose(MODEL, with_vision=True)
    assert [f.path for f in session.chosen] == [MODEL, PROJECTOR] and choice.vision and choice.fit_file == MODEL
    assert f"{MODEL} + {PROJECTOR} (vision)" in choice.note
    choice = session.choose(MODEL, with_vision=False)
    assert [f.path for f in session.chosen] == [MODEL] and not choice.vision and "(vision)" not in choice.note


def test_a_split_gguf_is_chosen_whole_and_a_file_that_is_no_model_is_refused(tmp_path: Path) -> None:
    session = HubSession(lambda: tmp_path)
    session.open(_listing(*SHARDS, MODEL))
    assert session.first_choice() == (False, None)  # two models: the user chooses
    assert [f.path for f in session.chosen] == []
    session.choose(SHARDS[0], with_vision=True)
    assert [f.path for f in session.chosen] == list(SHARDS)
    refused = session.choose("README.md", with_vision=True)
    assert refused.note == "That file is not a model: pick a .gguf file." and not refused.check_fit
    assert session.chosen == [] and session.download_state().ready is False


def test_a_safetensors_repo_picks_its_model_files(tmp_path: Path) -> None:
    session = HubSession(lambda: tmp_path)
    session.open(_listing("config.json", "model.safetensors", "tokenizer.json", "notes.txt"))
    assert session.first_choice() == (True, None)
    choice = session.choose(None, with_vision=True)
    assert {f.path for f in session.chosen} == {"config.json", "model.safetensors", "tokenizer.json"}
    assert choice.fit_file is None and choice.check_fit and "3 files (weights, config, tokenizer)" in choice.note


def test_the_download_state_counts_what_is_on_disk_a_paused_part_included(tmp_path: Path) -> None:
    session = HubSession(lambda: tmp_path)
    listing = _listing(MODEL)
    session.open(listing)
    assert session.download_state().label == "Download" and not session.download_state().ready
    session.choose(MODEL, with_vision=False)
    assert session.download_state().label == "Download 1000 B" and session.download_state().ready
    folder = model_folder(tmp_path, listing.repo_id)
    folder.mkdir(parents=True)
    (folder / (MODEL + PARTIAL_SUFFIX)).write_bytes(bytes(400))
    state = session.download_state()
    assert state.label.startswith("Resume (") and state.ready and session.kept() == 400
    (folder / MODEL).write_bytes(bytes(1000))
    assert session.download_state().label == "Downloaded" and not session.download_state().ready


def test_choosing_before_a_listing_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no repository is listed"):
        HubSession(lambda: tmp_path).choose(MODEL, with_vision=True)
