"""A `Transcript` in each `response_format` of OpenAI's /v1/audio/transcriptions.

Shapes follow OpenAI's whisper-1 responses: `json` is `{"text", "usage"}`; `verbose_json` adds
`task`, the language as an English name ("english"), `duration`, and `segments` and/or `words`
depending on `timestamp_granularities`; `text` is the text and a newline; `srt` and `vtt` are one
cue per segment.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.engine.tasks.audio import Segment, Transcript

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
GRANULARITIES = ("segment", "word")
MEDIA_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "text/plain; charset=utf-8",
    "vtt": "text/plain; charset=utf-8",
}

# Whisper's languages: ISO-639-1 code (a few are longer) -> the name OpenAI reports in verbose_json.
_LANGUAGE_TABLE = """
en:english zh:chinese de:german es:spanish ru:russian ko:korean fr:french ja:japanese pt:portuguese
tr:turkish pl:polish ca:catalan nl:dutch ar:arabic sv:swedish it:italian id:indonesian hi:hindi
fi:finnish vi:vietnamese he:hebrew uk:ukrainian el:greek ms:malay cs:czech ro:romanian da:danish
hu:hungarian ta:tamil no:norwegian th:thai ur:urdu hr:croatian bg:bulgarian lt:lithuanian la:latin
mi:maori ml:malayalam cy:welsh sk:slovak te:telugu fa:persian lv:latvian bn:bengali sr:serbian
az:azerbaijani sl:slovenian kn:kannada et:estonian mk:macedonian br:breton eu:basque is:icelandic
hy:armenian ne:nepali mn:mongolian bs:bosnian kk:kazakh sq:albanian sw:swahili gl:galician
mr:marathi pa:punjabi si:sinhala km:khmer sn:shona yo:yoruba so:somali af:afrikaans oc:occitan
ka:georgian be:belarusian tg:tajik sd:sindhi gu:gujarati am:amharic yi:yiddish lo:lao uz:uzbek
fo:faroese ht:haitian_creole ps:pashto tk:turkmen nn:nynorsk mt:maltese sa:sanskrit
lb:luxembourgish my:myanmar bo:tibetan tl:tagalog mg:malagasy as:assamese tt:tatar haw:hawaiian
ln:lingala ha:hausa ba:bashkir jw:javanese su:sundanese yue:cantonese
"""
LANGUAGE_NAMES = {
    code: name.replace("_", " ") for code, name in (pair.split(":") for pair in _LANGUAGE_TABLE.split())
}
_CODES_BY_NAME = {name: code for code, name in LANGUAGE_NAMES.items()}


def language_code(language: str) -> str:
    """Map "en", "EN" or "English" to "en"; anything else is a ValueError naming the input."""
    key = language.strip().lower()
    if key in LANGUAGE_NAMES:
        return key
    if key in _CODES_BY_NAME:
        return _CODES_BY_NAME[key]
    raise ValueError(f"unknown language {language!r}: use an ISO-639-1 code such as 'en', 'de' or 'fr'")


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


def check_request(response_format: str, timestamp_granularities: Sequence[str] = ()) -> None:
    """OpenAI's rules: known format and granularities; word timestamps only with verbose_json."""
    if response_format not in RESPONSE_FORMATS:
        raise ValueError(
            f"unknown response_format {response_format!r}; choose one of {', '.join(RESPONSE_FORMATS)}"
        )
    unknown = [g for g in timestamp_granularities if g not in GRANULARITIES]
    if unknown:
        raise ValueError(f"unknown timestamp_granularities {unknown}; choose from {', '.join(GRANULARITIES)}")
    if timestamp_granularities and response_format != "verbose_json":
        raise ValueError("timestamp_granularities requires response_format 'verbose_json'")


def to_json(transcript: Transcript) -> dict[str, Any]:
    return {"text": transcript.text, "usage": _usage(transcript)}


def to_verbose_json(transcript: Transcript, timestamp_granularities: Sequence[str] = ()) -> dict[str, Any]:
    """Segments unless only word timestamps were asked for; words only when asked for."""
    granularities = set(timestamp_granularities) or {"segment"}
    body: dict[str, Any] = {
        "task": "transcribe",
        "language": language_name(transcript.language),
        "duration": transcript.duration,
        "text": transcript.text,
    }
    if "word" in granularities:
        body["words"] = [{"word": w.word, "start": w.start, "end": w.end} for w in transcript.words]
    if "segment" in granularities:
        body["segments"] = [_segment_json(segment) for segment in transcript.segments]
    body["usage"] = _usage(transcript)
    return body


def to_text(transcript: Transcript) -> str:
    return transcript.text + "\n"


def to_srt(transcript: Transcript) -> str:
    cues = [
        f"{number}\n{srt_timestamp(segment.start)} --> {srt_timestamp(segment.end)}\n{segment.text.strip()}\n\n"
        for number, segment in enumerate(transcript.segments, start=1)
    ]
    return "".join(cues)


def to_vtt(transcript: Transcript) -> str:
    cues = [
        f"{vtt_timestamp(segment.start)} --> {vtt_timestamp(segment.end)}\n{segment.text.strip()}\n\n"
        for segment in transcript.segments
    ]
    return "WEBVTT\n\n" + "".join(cues)


def render(transcript: Transcript, response_format: str, timestamp_granularities: Sequence[str] = ()) -> str:
    """The response body as text (JSON formats serialised), after `check_request`'s checks."""
    check_request(response_format, timestamp_granularities)
    if response_format == "json":
        return json.dumps(to_json(transcript), ensure_ascii=False)
    if response_format == "verbose_json":
        return json.dumps(to_verbose_json(transcript, timestamp_granularities), ensure_ascii=False)
    return {"text": to_text, "srt": to_srt, "vtt": to_vtt}[response_format](transcript)


def srt_timestamp(seconds: float) -> str:
    hours, minutes, secs, millis = _clock(seconds)
    return f"{hours:02d}:{minutes:02d}:{secs:02d},{millis:03d}"


def vtt_timestamp(seconds: float) -> str:
    hours, minutes, secs, millis = _clock(seconds)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}.{millis:03d}"


def _clock(seconds: float) -> tuple[int, int, int, int]:
    total_ms = max(0, round(seconds * 1000))
    return total_ms // 3_600_000, total_ms // 60_000 % 60, total_ms // 1000 % 60, total_ms % 1000


def _segment_json(segment: Segment) -> dict[str, Any]:
    return {
        "id": segment.id,
        "seek": segment.seek,
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "tokens": segment.tokens,
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
    }


def _usage(transcript: Transcript) -> dict[str, Any]:
    # whisper-1 bills whole seconds, rounded up.
    return {"type": "duration", "seconds": math.ceil(transcript.duration)}
