"""Chat templates: messages (and tools) -> prompt text (tool calls are parsed back in `tool_calls.py`).

A checkpoint's own Jinja template (GGUF `tokenizer.chat_template`, or the Hugging Face folder's)
runs in jinja2's immutable sandbox with the names Hugging Face templates expect (`messages`,
`tools`, `add_generation_prompt`, `bos_token`, `raise_exception`, `strftime_now`, a `tojson`
that keeps non-ASCII text). Families whose file has no template (the embedded Gemma) get a
built-in one: Gemma's turns, ChatML (Qwen), Llama 3 or PaddleOCR-VL's; so do checkpoints whose
template breaks the probe's limits, and PaddleOCR-VL's whose template renders no text of a message (the
published one reads content only as typed parts). Built-ins list tools as JSON schemas in the system turn and ask for
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (PaddleOCR-VL's takes no tools).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2

from app.engine.text import gemma4_reply, harmony
from app.engine.text.harmony_render import HarmonyTemplate
from app.engine.text.template_sandbox import Limits, SlowRender, TemplateLimitError, render_bounded, sandbox
from app.engine.text.tool_calls import ToolCall, parse_tool_calls

log = logging.getLogger(__name__)

# A checkpoint's template is rendered once at load on a small conversation: one that breaks these
# limits there is refused for the family's built-in. Real templates take milliseconds and a few KB.
PROBE_LIMITS = Limits(seconds=1.0, chars=2**20)
_PROBE_MESSAGES = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is the weather in Paris?"},
]
_PROBE_TEXT = "Paddock probe: is this text rendered?"
_PROBE_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
]  # fmt: skip


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, > and & for HTML and writes non-ASCII as \u escapes; HF's keeps text as is.
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> jinja2.Environment:
    env = sandbox()
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


_ENV = _environment()

# End-of-turn markers a model may write as text; any a template uses become stop strings.
_END_MARKERS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>")

_TOOL_PREAMBLE = (
    "You may call one or more functions to answer the user. The available functions are given as JSON "
    "schemas within <tools></tools> tags:{{ NL }}<tools>"
    "{%- for tool in tools -%}{{ NL }}{{ (tool.function if tool.function is defined else tool) | tojson }}{%- endfor -%}"
    "{{ NL }}</tools>{{ NL ~ NL }}To call a function, answer with a JSON object giving its name and arguments "
    "within <tool_call></tool_call> tags:{{ NL }}<tool_call>{{ NL }}"
    '{"name": <function-name>, "arguments": <args-json-object>}{{ NL }}</tool_call>'
)
_TOOL_PREAMBLE_TEMPLATE = _ENV.from_string(_TOOL_PREAMBLE)

# The built-ins. The environment trims a newline after a block tag and `{%-`/`-%}` eat source
# whitespace, so every newline they write is inside an expression: {{ NL }} is "\n".
_SYSTEM = (  # `system`: the system text with the tool preamble; `turns`: the other messages
    "{%- set system = (messages[0].content or '') if messages and messages[0].role == 'system' else '' -%}"
    "{%- set turns = messages[1:] if messages and messages[0].role == 'system' else messages -%}"
    "{%- if tools -%}{%- set system = (system ~ NL ~ NL if system else '') ~ tool_preamble -%}{%- endif -%}"
)
_CALLS = (  # an assistant message's tool calls, each on its own lines after the content
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if not loop.first or (message.content or '') | trim -%}{{ NL }}{%- endif -%}"
    "<tool_call>{{ NL }}"
    '{"name": {{ fn.name | tojson }}, "arguments": {{ fn.arguments | tojson }}}'
    "{{ NL }}</tool_call>"
    "{%- endfor -%}"
)
# A message's text as these templates write it: trimmed, as the families' own templates do, except
# an assistant's, which goes back exactly as the model wrote it, so that the next turn's prompt
# repeats the previous answer's tokens and the prefix cache reuses them (server/turn_memory.py).
_CONTENT = (
    "{%- set _content = (message.content or '') if message.role == 'assistant' else (message.content or '') | trim -%}"
)
_GEMMA = (  # Gemma's turns: the system text opens the first user turn; a run of tool results is one user turn
    "{{ bos_token }}" + _SYSTEM + "{%- set prefix = system ~ NL ~ NL if system else '' -%}"
    "{%- if not turns and system -%}<start_of_turn>user{{ NL }}{{ system }}<end_of_turn>{{ NL }}{%- endif -%}"
    "{%- for message in turns -%}" + _CONTENT + ""
    "{%- set is_tool = message.role == 'tool' -%}"
    "{%- if not is_tool or loop.first or loop.previtem.role != 'tool' -%}"
    "<start_of_turn>{{ 'model' if message.role == 'assistant' else 'user' }}{{ NL }}"
    "{{- prefix if loop.first else '' -}}"
    "{%- else -%}{{ NL }}{%- endif -%}"
    "{%- if is_tool -%}"
    "<tool_response>{{ NL }}{{ (message.content or '') | trim }}{{ NL }}</tool_response>"
    "{%- else -%}"
    "{{ _content }}" + _CALLS + ""
    "{%- endif -%}"
    "{%- if not is_tool or loop.last or loop.nextitem.role != 'tool' -%}<end_of_turn>{{ NL }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<start_of_turn>model{{ NL }}{%- endif -%}"
)
_CHATML = (
    _SYSTEM + "{%- if system -%}<|im_start|>system{{ NL }}{{ system }}<|im_end|>{{ NL }}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if message.role == 'tool' -%}"  # a run of tool results is one user turn
    "{%- if loop.first or loop.previtem.role != 'tool' -%}<|im_start|>user{%- endif -%}"
    "{{ NL }}<tool_response>{{ NL }}{{ message.content or '' }}{{ NL }}</tool_response>"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}<|im_end|>{{ NL }}{%- endif -%}"
    "{%- else -%}"
    "<|im_start|>{{ message.role }}{{ NL }}{{ message.content or '' }}" + _CALLS + "<|im_end|>{{ NL }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ NL }}{%- endif -%}"
)
_LLAMA3 = (
    "{{ bos_token }}" + _SYSTEM + "{%- if system -%}"
    "<|start_header_id|>system<|end_header_id|>{{ NL ~ NL }}{{ system }}<|eot_id|>{%- endif -%}"
    "{%- for message in turns -%}" + _CONTENT + ""
    "<|start_header_id|>{{ 'ipython' if message.role == 'tool' else message.role }}<|end_header_id|>{{ NL ~ NL }}"
    "{{- _content -}}" + _CALLS + "<|eot_id|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start_header_id|>assistant<|end_header_id|>{{ NL ~ NL }}{%- endif -%}"
)
_PADDLEOCR = (  # PaddleOCR-VL's turns, as its published template writes them for text content; no tools
    "{{- '<|begin_of_sentence|>' -}}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}{{ (message.content or '') ~ NL }}"
    "{%- elif message.role == 'user' -%}{{ 'User: ' ~ (message.content or '') ~ NL }}"
    "{%- elif message.role == 'assistant' -%}{{ 'Assistant: ' ~ (message.content or '') ~ eos_token }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Assistant: ' }}{%- endif -%}"
)
BUILTIN_TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemma": (_GEMMA, ("<end_of_turn>",)),
    "chatml": (_CHATML, ("<|im_end|>",)),
    "llama3": (_LLAMA3, ("<|eot_id|>",)),
    "paddleocr": (_PADDLEOCR, ()),
}
# Which built-in a vocabulary wants, by a marker token it has; else by architecture.
_BUILTIN_BY_TOKEN = (
    ("<|IMAGE_PLACEHOLDER|>", "paddleocr"),  # ERNIE's vocabulary as PaddleOCR-VL extends it
    ("<|channel|>", "harmony"),  # o200k_harmony (GPT-OSS)
    ("<start_of_turn>", "gemma"),
    ("<|start_header_id|>", "llama3"),
    ("<|im_start|>", "chatml"),
)
# Families whose published template reads content only as a list of typed parts, so renders none of the
# text content messages have here: their checkpoint template is checked for that and replaced by the built-in.
_PARTS_ONLY_FAMILIES = ("paddleocr",)
_BUILTIN_BY_ARCHITECTURE = (
    ("gemma", "gemma"), ("llama", "llama3"), ("qwen", "chatml"), ("gpt-oss", "harmony"), ("paddleocr", "paddleocr")
)  # fmt: skip


class ChatTemplate:
    """One compiled template; `source` says where it came from ("checkpoint", "builtin:gemma", ...)."""

    def __init__(
        self,
        text: str,
        *,
        source: str,
        bos_token: str | None = None,
        eos_token: str | None = None,
        stop_strings: tuple[str, ...] | None = None,
        tool_use_text: str | None = None,
    ) -> None:
        self.source = source
        self.refused: str | None = None  # why the checkpoint's own template was refused for this built-in
        self._template = _compile(text, source)
        self._tool_template = _compile(tool_use_text, f"{source} (tool_use)") if tool_use_text else None
        self._specials = {"bos_token": bos_token or "", "eos_token": eos_token or ""}
        sources = text + (tool_use_text or "")
        self.stop_strings = (
            stop_strings if stop_strings is not None else tuple(m for m in _END_MARKERS if m in sources)
        )
        self.tool_call_start: str | None = (
            "<tool_call>" if "<tool_call>" in sources or "builtin" in source else None
        )
        # GPT-OSS templates write harmony: replies come back in channels (text/harmony.py); Gemma 4's
        # write a thought channel and their own tool-call tokens (text/gemma4_reply.py)
        self.reply_format: str | None = reply_format_of(sources)
        if self.reply_format == "harmony":
            self.tool_call_start = None
            self.stop_strings = self.stop_strings or (harmony.RETURN, harmony.CALL)
        elif self.reply_format == "gemma4":
            self.tool_call_start = None

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """The prompt text for these messages (OpenAI-shaped dicts: role, content, tool_calls, ...);
        TemplateLimitError if the template runs past its time or size limit. `extra` goes to the
        template as variables (chat_template_kwargs)."""
        return self.render_within(Limits(), messages, tools, add_generation_prompt, extra)

    def render_within(
        self,
        limits: Limits,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """`render` under other limits (the load probe's tighter ones)."""
        template = self._tool_template if tools and self._tool_template is not None else self._template
        context = {
            **self._specials,
            **(extra or {}),
            "messages": _normalized(messages),
            "tools": tools or None,
            "add_generation_prompt": add_generation_prompt,
            "tool_preamble": _TOOL_PREAMBLE_TEMPLATE.render(tools=tools, NL="\n") if tools else "",
            "NL": "\n",
        }
        try:
            return render_bounded(template, context, limits)
        except TemplateLimitError as exc:
            raise TemplateLimitError(f"chat template ({self.source}) exceeded its limits: {exc}") from None
        except RecursionError:
            raise TemplateLimitError(f"chat template ({self.source}) recursed too deep") from None
        except SlowRender:  # a server's quick lane hands it to its slow one (prompting.py)
            raise
        except Exception as exc:  # raise_exception(), undefined names, sandbox refusals, None + str ...
            raise ValueError(f"chat template ({self.source}) failed: {exc}") from exc

    def probe(self) -> None:
        """Render a small conversation, with and without tools, within PROBE_LIMITS; TemplateLimitError
        if the template breaks them. Other failures pass: a template may refuse a conversation."""
        for tools in (None, _PROBE_TOOLS):
            try:
                self.render_within(PROBE_LIMITS, _PROBE_MESSAGES, tools)
            except TemplateLimitError:
                raise
            except ValueError:  # the template refuses this conversation (raise_exception): not a limit
                continue

    def drops_text(self) -> bool:
        """Whether the template leaves a message's text out: one that reads content only as a list of
        typed parts (PaddleOCR-VL's published one) renders none of the text every message has here.
        A template that refuses the probe is not judged by it."""
        try:
            rendered = self.render_within(PROBE_LIMITS, [{"role": "user", "content": _PROBE_TEXT}])
        except ValueError:
            return False
        return _PROBE_TEXT not in rendered

    def parse_tool_calls(self, text: str) -> tuple[str, list[ToolCall]]:
        """Split a reply into (remaining content, tool calls); text that is not a valid call stays content."""
        if self.reply_format is not None:
            reply = self.parse_reply(text)
            return reply.content, reply.calls
        return parse_tool_calls(text)

    def parse_reply(self, text: str) -> harmony.Reply:
        """Reasoning, answer and tool calls of a finished reply (reasoning only in channelled formats)."""
        if self.reply_format == "harmony":
            return harmony.parse_reply(text)
        if self.reply_format == "gemma4":
            return gemma4_reply.parse_reply(text)
        content, calls = self.parse_tool_calls(text)
        return harmony.Reply("", content, calls)


def reply_format_of(template_text: str) -> str | None:
    """"harmony" (GPT-OSS: `<|channel|>`), "gemma4" (its `<|channel>` thought channel and `<|tool_call>`
    calls), or None: a reply that is all answer, with calls parsed by text/tool_calls.py."""
    if "<|channel|>" in template_text:
        return "harmony"
    if "<|tool_call>" in template_text or "<|channel>" in template_text:
        return "gemma4"
    return None


def chat_template_for(metadata_or_config: Any, tokenizer: Any, architecture: str) -> ChatTemplate:
    """The checkpoint's own template if it has one, else the built-in for its family.

    `metadata_or_config`: GGUF metadata, a config mapping with "chat_template", or a Hugging Face
    folder; the tokenizer's `chat_template` (read from its folder) is the next place looked.
    """
    bos, eos = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "eos_token", None)
    text, tool_use = _checkpoint_template(metadata_or_config)
    text = text or getattr(tokenizer, "chat_template", None)
    name = _builtin_name(tokenizer, architecture)
    refused = None
    if text:
        template = ChatTemplate(
            text, source="checkpoint", bos_token=bos, eos_token=eos, tool_use_text=tool_use
        )
        try:
            template.probe()
            if name not in _PARTS_ONLY_FAMILIES or not template.drops_text():
                return template
            refused = "chat template (checkpoint) renders no message text: it reads content only as typed parts"
        except TemplateLimitError as exc:
            refused = str(exc)
        log.warning("%s; using the built-in %s template instead", refused, name)
    if name == "harmony":
        harmony_template = HarmonyTemplate()
        harmony_template.refused = refused
        return harmony_template  # type: ignore[return-value]
    body, stops = BUILTIN_TEMPLATES[name]
    builtin = ChatTemplate(body, source=f"builtin:{name}", bos_token=bos, eos_token=eos, stop_strings=stops)
    builtin.refused = refused
    return builtin


def builtin_template(name: str, bos_token: str | None = None, eos_token: str | None = None) -> ChatTemplate:
    if name not in BUILTIN_TEMPLATES:
        raise ValueError(f"no built-in chat template {name!r}; built-ins: {sorted(BUILTIN_TEMPLATES)}")
    body, stops = BUILTIN_TEMPLATES[name]
    return ChatTemplate(
        body, source=f"builtin:{name}", bos_token=bos_token, eos_token=eos_token, stop_strings=stops
    )


# -- helpers -----------------------------------------------------------------------------------


def _compile(text: str, source: str) -> jinja2.Template:
    try:
        return _ENV.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template ({source}) does not parse: {exc} (line {exc.lineno})") from exc


def _normalized(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates expect them: text content as one string ("" for none), a tool
    call's arguments as an object (templates write them with `tojson`), "developer" read as "system"."""
    if not isinstance(messages, list):
        raise ValueError(f"messages must be a list of objects, got {type(messages).__name__}")
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{index}] must be an object with a string 'role'")
        message = copy.deepcopy(dict(message))
        if message["role"] == "developer":
            message["role"] = "system"
        if isinstance(message.get("content"), list):
            message["content"] = _text_of_parts(message["content"], index)
        elif message.get("content") is None:  # an assistant turn that only calls tools
            message["content"] = ""
        for call in message.get("tool_calls") or []:
            function = call.get("function", call) if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                with contextlib.suppress(ValueError):  # not JSON: the template gets the text as it came
                    function["arguments"] = json.loads(function["arguments"])
        out.append(message)
    return out


def _text_of_parts(parts: list[Any], index: int) -> str:
    texts = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text" and not isinstance(part, str):
            raise ValueError(f"messages[{index}] has a {kind!r} content part; only text is supported")
        texts.append(part if isinstance(part, str) else str(part.get("text", "")))
    return "\n".join(texts)


def _checkpoint_template(source: Any) -> tuple[str | None, str | None]:
    """(default template, tool-use variant) from GGUF metadata, a config mapping or a folder."""
    if isinstance(source, (str, Path)):
        folder = Path(source)
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8"), None
        for name in ("chat_template.json", "tokenizer_config.json"):
            path = folder / name
            if path.is_file():
                try:
                    config = json.loads(path.read_text(encoding="utf-8"))
                except ValueError as exc:
                    raise ValueError(f"cannot read {path}: {exc}") from exc
                found = _named_templates(config.get("chat_template") if isinstance(config, dict) else None)
                if found[0]:
                    return found
        return None, None
    if isinstance(source, Mapping):
        if "tokenizer.chat_template" in source:
            return source["tokenizer.chat_template"], source.get("tokenizer.chat_template.tool_use")
        return _named_templates(source.get("chat_template"))
    return None, None


def _named_templates(value: Any) -> tuple[str | None, str | None]:
    if isinstance(value, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        return named.get("default") or next(iter(named.values()), None), named.get("tool_use")
    return (value, None) if isinstance(value, str) else (None, None)


def _builtin_name(tokenizer: Any, architecture: str) -> str:
    token_to_id = getattr(tokenizer, "token_to_id", None)
    for token, name in _BUILTIN_BY_TOKEN:
        if token_to_id is not None and token_to_id(token) is not None:
            return name
    family = (architecture or "").lower()
    return next((name for prefix, name in _BUILTIN_BY_ARCHITECTURE if family.startswith(prefix)), "chatml")
