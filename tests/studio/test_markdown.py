"""Answers as Markdown: the HTML structure of each construct, code collected and highlighted, raw HTML and
script links from a model's text never passed through."""

from __future__ import annotations

from html.parser import HTMLParser

from app.studio.markdown import render_markdown

TEXT = """# Plan

Some **bold** and `inline` code.

1. first
2. second

- apples
- pears

| name | size |
|------|-----:|
| a    | 1    |
| b    | 22   |

```python
def f(x):
    return x + 1
```

    indented block

<script>alert(1)</script> [bad](javascript:alert(1)) [good](https://example.com)
"""


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.links: list[str] = []
        self.styled_spans = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attributes = dict(attrs)
        if tag == "a":
            self.links.append(attributes.get("href") or "")
        if tag == "span" and "color" in (attributes.get("style") or ""):
            self.styled_spans += 1


def _parse(text: str):
    rendered = render_markdown(text, lambda n: f"copy:{n}", first_block=3)
    tags = Tags()
    tags.feed(rendered.html)
    return rendered, tags


def test_each_construct_becomes_its_html_element():
    rendered, tags = _parse(TEXT)
    for tag in ("h1", "strong", "code", "ol", "ul", "li", "table", "th", "td", "pre"):
        assert tag in tags.tags, tag
    assert tags.tags.count("li") == 4 and tags.tags.count("td") == 4 and tags.tags.count("pre") == 2
    assert '<table border="1"' in rendered.html  # Qt's rich text draws rules only from attributes


def test_code_blocks_are_collected_numbered_and_highlighted():
    rendered, tags = _parse(TEXT)
    assert rendered.code_blocks == ("def f(x):\n    return x + 1", "indented block")
    assert "copy:3" in tags.links and "copy:4" in tags.links  # numbered from first_block
    assert tags.styled_spans >= 3  # pygments coloured the Python keywords, names and operator


def test_raw_html_and_script_links_from_the_model_are_not_markup():
    rendered, tags = _parse(TEXT)
    assert "script" not in tags.tags and "&lt;script&gt;" in rendered.html
    assert "https://example.com" in tags.links and not any(link.startswith("javascript") for link in tags.links)


def test_a_single_newline_is_a_line_break():
    rendered, tags = _parse("Step one\nStep two\n\nNext paragraph")
    assert tags.tags.count("p") == 2 and "br" in tags.tags
    assert rendered.html.startswith("<p>Step one<br />\nStep two</p>")


def test_an_image_in_an_answer_is_a_link_to_it_never_loaded():
    rendered, tags = _parse("See ![a *cat*](https://x.org/cat.png) and ![](https://x.org/b.png) "
                            "and ![x](javascript:alert(1))")
    assert "img" not in tags.tags
    assert "[image: a cat]" in rendered.html and "[image: image]" in rendered.html
    assert tags.links.count("https://x.org/cat.png") == 1 and "https://x.org/b.png" in tags.links
    assert not any(link.startswith("javascript") for link in tags.links)
