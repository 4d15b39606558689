"""Answers as Markdown: the HTML subset Qt's rich text shows, code highlighted, each code block numbered.

markdown-it-py parses CommonMark plus tables and strikethrough; raw HTML in the text is
escaped, never passed through (a model's output is not trusted markup), and links with
javascript:/file:/data: targets are dropped by markdown-it's own link check. Pygments
colours code with inline styles, since Qt's rich text has no stylesheet classes. Each
fenced or indented code block is collected in `RenderedMarkdown.code_blocks` and gets a
header with its language and a Copy link made by `copy_href(n)`, numbered across the
whole transcript so one click handler serves every block.

A single newline is a line break, as in every chat UI (CommonMark would join the lines into
one paragraph: an answer streamed as separate lines became one run-on paragraph when it
finished). An image in an answer is shown as a link to it: Qt's rich text would try to load
the URL itself and draw a broken-image icon, and the Studio fetches nothing a model names.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CODE_STYLE = ("background-color:#f4f4f4; color:#1f1f1f; font-family:monospace; padding:6px; "
              "white-space:pre-wrap")
TABLE_ATTRS = 'border="1" cellspacing="0" cellpadding="4"'  # Qt draws table rules only from attributes


@dataclass(frozen=True)
class RenderedMarkdown:
    html: str
    code_blocks: tuple[str, ...]


def render_markdown(text: str, copy_href: Callable[[int], str], first_block: int = 0) -> RenderedMarkdown:
    """`text` as HTML; code blocks are numbered from `first_block` and their Copy links use `copy_href`."""
    blocks: list[str] = []
    env: dict[str, Any] = {"blocks": blocks, "first": first_block, "href": copy_href}
    body = _parser().render(text, env)
    body = body.replace("<table>", f"<table {TABLE_ATTRS}>")
    return RenderedMarkdown(body.strip(), tuple(blocks))  # a trailing newline would show as a space


def highlight(code: str, language: str) -> str:
    """`code` as HTML spans with inline colours (plain escaped text for an unknown language)."""
    from pygments import highlight as pygments_highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        lexer = get_lexer_by_name(language) if language else None
    except ClassNotFound:
        lexer = None
    if lexer is None:
        return html.escape(code)
    return pygments_highlight(code, lexer, HtmlFormatter(noclasses=True, nowrap=True))


_PARSER: Any = None


def _parser() -> Any:
    global _PARSER
    if _PARSER is None:
        from markdown_it import MarkdownIt

        parser = MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True})
        parser.enable(["table", "strikethrough"])
        parser.add_render_rule("fence", _code_block)
        parser.add_render_rule("image", _image_link)
        parser.add_render_rule("code_block", _code_block)
        _PARSER = parser
    return _PARSER


def _image_link(renderer: Any, tokens: list[Any], idx: int, options: Any, env: dict[str, Any]) -> str:
    """`![alt](url)` as a link saying it is an image (markdown-it has already dropped unsafe URLs)."""
    token = tokens[idx]
    alt = renderer.renderInlineAsText(token.children or [], options, env) or "image"
    src = str(token.attrGet("src") or "")
    label = f"[image: {html.escape(alt)}]"
    return f'<a href="{html.escape(src, quote=True)}">{label}</a>' if src else label


def _code_block(renderer: Any, tokens: list[Any], idx: int, options: Any, env: dict[str, Any]) -> str:
    token = tokens[idx]
    code = token.content.removesuffix("\n")
    language = (token.info or "").strip().split(" ")[0] if token.type == "fence" else ""
    number = env["first"] + len(env["blocks"])
    env["blocks"].append(code)
    label = html.escape(language) if language else "code"
    header = (f'<p style="margin:6px 0 0 0; color:#606060; font-size:small">{label} · '
              f'<a href="{env["href"](number)}">Copy</a></p>')
    return f'{header}<pre style="{CODE_STYLE}">{highlight(code, language)}</pre>\n'
