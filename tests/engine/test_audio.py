"""Transcription with the embedded Whisper tiny.en on a committed espeak-ng clip, and the output formats."""

from __future__ import annotations

import io
import json
import shutil
import wave
from pathlib import Path

import pytest
from openai.types.audio import Transcription, TranscriptionVerbose

from app.engine.tasks import transcript_formats as formats
from app.engine.tasks.audio import (
    AudioError,
    Segment,
    Transcriber,
    Transcript,
    TranscriptionCancelled,
    Word,
    default_model_path,
    resolve_device,
)

SPEECH = Path(__file__).parents[1] / "fixtures" / "audio" / "speech.wav"
# The clip says "The quick brown fox jumps over the lazy dog. Please water the garden." (make_speech.sh);
# tiny.en hears "jump" for "jumps", so only the words it gets right are checked.
SPOKEN_WORDS = ["the", "quick", "brown", "fox", "over", "lazy", "dog", "please", "water", "garden"]


@pytest.fixture(scope="module")
def transcriber() -> Transcriber:
    model = Transcriber(device="cpu")
    model.load()
    return model


@pytest.fixture(scope="module")
def transcript(transcriber: Transcriber) -> Transcript:
    return transcriber.transcribe(SPEECH)


def normalised(words: list[Word]) -> list[str]:
    return [w.word.lower().strip(".,!?") for w in words]


def test_the_spoken_words_come_back_with_monotonic_timestamps(transcript: Transcript) -> None:
    assert transcript.language == "en"
    assert transcript.duration == pytest.approx(82096 / 16000, abs=0.01)  # soxi's sample count
    heard = normalised(transcript.words)
    for word in SPOKEN_WORDS:
        assert word in heard, f"{word!r} missing from {transcript.text!r}"
    assert transcript.text.lower().startswith("the quick brown fox")
    assert [segment.id for segment in transcript.segments] == list(range(len(transcript.segments)))
    times = [t for w in transcript.words for t in (w.start, w.end)]
    assert times == sorted(times)
    assert times[0] >= 0.0 and times[-1] <= transcript.duration + 0.05
    for segment in transcript.segments:
        assert segment.start <= segment.end
        assert segment.words[0].start >= segment.start - 0.05 and segment.words[-1].end <= segment.end + 0.05
        assert all(0.0 <= w.probability <= 1.0 for w in segment.words)
        assert segment.tokens and segment.text.strip()


def test_bytes_input_with_progress(transcriber: Transcriber, transcript: Transcript) -> None:
    seen: list[float] = []
    again = transcriber.transcribe(SPEECH.read_bytes(), language="English", progress=seen.append)
    assert again.text == transcript.text
    assert seen[0] == 0.0 and seen[-1] == 1.0
    assert seen == sorted(seen)


def test_file_object_input_can_be_cancelled(transcriber: Transcriber) -> None:
    done: list[float] = []  # progress: the cancel turns true once the first segment is in
    with SPEECH.open("rb") as handle, pytest.raises(TranscriptionCancelled, match="cancelled at"):
        transcriber.transcribe(
            handle, prompt="Foxes and dogs.", word_timestamps=False, progress=done.append,
            cancel=lambda: bool(done) and done[-1] > 0,
        )  # fmt: skip


def wav_bytes(frames: bytes) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(frames)
    return buffer.getvalue()


def test_bad_audio_gets_a_clear_error(transcriber: Transcriber, tmp_path: Path) -> None:
    with pytest.raises(AudioError, match=r"^audio: the audio is empty \(0 bytes\)"):
        transcriber.transcribe(b"")
    with pytest.raises(AudioError, match=r"^upload\.wav: the audio contains no samples"):
        transcriber.transcribe(wav_bytes(b""), source="upload.wav")
    with pytest.raises(AudioError, match=r"^notes\.mp3: cannot decode the audio"):
        transcriber.transcribe(b"this is not audio at all" * 20, source="notes.mp3")
    empty_file = tmp_path / "silence.wav"
    empty_file.touch()
    with pytest.raises(AudioError, match=r"^silence\.wav: the audio file is empty"):
        transcriber.transcribe(empty_file)
    with pytest.raises(AudioError, match=r"^missing\.wav: file not found"):
        transcriber.transcribe(tmp_path / "missing.wav")


def test_bad_parameters_are_named(transcriber: Transcriber) -> None:
    with pytest.raises(ValueError, match="unknown language 'klingon'"):
        transcriber.transcribe(SPEECH, language="klingon")
    with pytest.raises(ValueError, match="temperature must be between 0 and 1"):
        transcriber.transcribe(SPEECH, temperature=1.5)


def test_device_choice_on_a_machine_without_gpu() -> None:
    import ctranslate2

    if ctranslate2.get_cuda_device_count() > 0:
        assert resolve_device() == ("cuda", "float16")
        return
    assert resolve_device() == ("cpu", "int8")
    assert resolve_device("cpu", "float32") == ("cpu", "float32")
    with pytest.raises(RuntimeError, match="sees no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("tpu")


def test_missing_model_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no model\.bin"):
        Transcriber(model_path=tmp_path)


# --- response formats ----------------------------------------------------------------------------


def two_segments() -> Transcript:
    first = Segment(
        id=0,
        start=0.0,
        end=2.5,
        text=" Hello there.",
        words=[Word(0.0, 1.0, "Hello", 0.9), Word(1.1, 2.5, "there.", 0.8)],
        tokens=[50363, 15496, 612, 13],
        avg_logprob=-0.2,
        compression_ratio=0.8,
        no_speech_prob=0.01,
    )
    second = Segment(
        id=1,
        start=3661.042,
        end=3662.5,
        text=" Bye.",
        words=[Word(3661.042, 3662.5, "Bye.", 0.7)],
        seek=366104,
    )
    return Transcript(text="Hello there. Bye.", language="en", duration=3662.51, segments=[first, second])


def test_srt_and_vtt_cues() -> None:
    transcript = two_segments()
    assert formats.render(transcript, "srt") == (
        "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n2\n01:01:01,042 --> 01:01:02,500\nBye.\n\n"
    )
    assert formats.render(transcript, "vtt") == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n\n01:01:01.042 --> 01:01:02.500\nBye.\n\n"
    )
    assert formats.render(transcript, "text") == "Hello there. Bye.\n"
    assert formats.srt_timestamp(59.9996) == "00:01:00,000"


def test_json_shapes_parse_as_the_openai_sdk_types() -> None:
    transcript = two_segments()
    plain = Transcription.model_validate_json(formats.render(transcript, "json"))
    assert plain.text == "Hello there. Bye."
    assert json.loads(formats.render(transcript, "json"))["usage"] == {"type": "duration", "seconds": 3663}

    verbose = TranscriptionVerbose.model_validate_json(formats.render(transcript, "verbose_json"))
    assert verbose.language == "english" and verbose.duration == 3662.51
    assert verbose.words is None
    assert [s.text for s in verbose.segments or []] == [" Hello there.", " Bye."]
    assert verbose.segments and verbose.segments[0].tokens == [50363, 15496, 612, 13]
    assert verbose.segments[1].seek == 366104

    words_only = TranscriptionVerbose.model_validate_json(
        formats.render(transcript, "verbose_json", ["word"])
    )
    assert words_only.segments is None  # OpenAI leaves segments out when only words are asked for
    assert [(w.word, w.start, w.end) for w in words_only.words or []] == [
        ("Hello", 0.0, 1.0),
        ("there.", 1.1, 2.5),
        ("Bye.", 3661.042, 3662.5),
    ]
    both = json.loads(formats.render(transcript, "verbose_json", ["word", "segment"]))
    assert len(both["words"]) == 3 and len(both["segments"]) == 2


def test_request_checks() -> None:
    with pytest.raises(ValueError, match="unknown response_format 'xml'"):
        formats.render(two_segments(), "xml")
    with pytest.raises(ValueError, match="requires response_format 'verbose_json'"):
        formats.check_request("json", ["word"])
    with pytest.raises(ValueError, match="unknown timestamp_granularities"):
        formats.check_request("verbose_json", ["sentence"])
    assert formats.language_code("German") == "de" and formats.language_name("de") == "german"


def test_real_transcript_in_every_format(transcript: Transcript) -> None:
    for response_format in formats.RESPONSE_FORMATS:
        body = formats.render(transcript, response_format)
        assert "quick brown fox" in body.lower()
    srt_cues = formats.to_srt(transcript).strip().split("\n\n")
    assert len(srt_cues) == len(transcript.segments)
    verbose = TranscriptionVerbose.model_validate(formats.to_verbose_json(transcript, ["word", "segment"]))
    assert [w.word for w in verbose.words or []] == [w.word for w in transcript.words]


def _model_copy(folder: Path) -> Path:
    folder.mkdir()
    for file in default_model_path().iterdir():
        (folder / file.name).symlink_to(file)
    return folder


def test_feature_extractor_settings_are_read_from_either_layout(tmp_path: Path) -> None:
    # A fine-tune saved by transformers 5 keeps them in processor_config.json (the fixture is what
    # WhisperProcessor.save_pretrained wrote: make_whisper_processor_config.py); faster-whisper alone
    # reads only preprocessor_config.json and would fall back to its defaults (chunk_length 30).
    saved = SPEECH.parent / "transformers5" / "processor_config.json"
    new = _model_copy(tmp_path / "new")
    shutil.copy(saved, new / "processor_config.json")
    old = _model_copy(tmp_path / "old")
    settings = json.loads(saved.read_text())["feature_extractor"]
    (old / "preprocessor_config.json").write_text(json.dumps({**settings, "chunk_length": 25}))
    for folder, chunk in ((new, 20), (old, 25), (default_model_path(), 30)):
        model = Transcriber(model_path=folder, device="cpu").load()
        assert model.feature_extractor.chunk_length == chunk, folder
        assert model.feature_extractor.n_samples == chunk * 16000
    (new / "processor_config.json").write_text('{"feature_extractor": {')
    with pytest.raises(ValueError, match=r"new/processor_config.json: not valid JSON"):
        Transcriber(model_path=new, device="cpu").load()
