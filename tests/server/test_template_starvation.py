"""Issue 40: a chat template that explodes only on some inputs (a hostile model file) cannot starve other
requests. 16 such requests held the four prompt workers for the 2 s render limit each, and a normal
request waited 7.9 s behind them. Now a render that outlasts the quick lane's budget moves to the slow
lane, freeing its worker. Checked with events, not clocks: the bad renders are held until released."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import httpx
import pytest

from app.engine.server.prompting import PromptBuilder
from app.engine.text.chat_template import ChatTemplate
from app.engine.text.template_sandbox import (
    Limits,
    SlowRender,
    TemplateLimitError,
    quick_lane,
    render_bounded,
    sandbox,
)

from .conftest import running_server
from .fakes import FakeEngine
from .helpers import wait_until

BAD = 16
# Explodes only where a message says "boom": then it loops, calling hold() (the test's own brake). 5,000 turns:
# held, each waits 5 ms, so no held render ends within 25 s; released, the 16 renders run the rest of theirs
# at full speed (20,000 turns cost the file 2.5 CPU-s more on the 2-core VM)
HOSTILE = (
    "{% for m in messages %}{% if 'boom' in m.content %}{% for i in range(5000) %}{{ hold() }}{% endfor %}"
    "{% endif %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n"
)


class HeldTemplate(ChatTemplate):
    """The hostile template, whose exploding renders wait on `release` (with a 60 s limit, so a held
    render is never cut by the 2 s one while the test looks)."""

    def __init__(self) -> None:
        super().__init__(HOSTILE, source="hostile test template")
        self.release = threading.Event()
        self.holders: set[int] = set()  # threads that ran an exploding render
        self._template.globals["hold"] = self._hold

    def _hold(self) -> str:
        self.holders.add(threading.get_ident())
        self.release.wait(0.005)
        return ""

    def render(
        self, messages: Any, tools: Any = None, add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        return self.render_within(Limits(seconds=60), messages, tools, add_generation_prompt, extra)


def chat(base_url: str, content: str) -> httpx.Response:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


def test_a_normal_request_is_served_while_16_exploding_renders_are_held():
    template = HeldTemplate()
    engine = FakeEngine(chat_template=template)
    with running_server(engine, prompt_workers=4) as server, ThreadPoolExecutor(BAD) as pool:
        bad = [pool.submit(chat, server.base_url, f"boom {i}") for i in range(BAD)]
        # every quick worker has met an exploding render: the old pool was full from here on
        assert wait_until(lambda: len(template.holders) >= 4, timeout=60)
        normal = chat(server.base_url, "hello")
        assert normal.status_code == 200, normal.text
        assert not any(future.done() for future in bad)  # all still rendering or waiting to, held
        template.release.set()
        assert [future.result().status_code for future in bad] == [200] * BAD


def test_a_render_past_the_quick_budget_is_moved_not_refused():
    template = sandbox().from_string("{% for i in range(100000) %}{{ hold() }}{% endfor %}done")
    calls = []

    def hold() -> str:
        calls.append(1)
        threading.Event().wait(0.002)
        return ""

    context = {"hold": hold}
    with quick_lane(0.05), pytest.raises(SlowRender):
        render_bounded(template, context, Limits(seconds=60))
    assert 0 < len(calls) < 100_000
    short = sandbox().from_string("{% for i in range(3) %}{{ i }}{% endfor %}")
    with quick_lane(0.05):
        assert render_bounded(short, {}, Limits()) == "012"  # quick renders are untouched
    with pytest.raises(TemplateLimitError), quick_lane(5.0):  # the full limit still applies first
        render_bounded(template, context, Limits(seconds=0.05))


def test_off_loop_reruns_a_slow_render_on_the_slow_workers():
    engine = FakeEngine()
    builder = PromptBuilder(engine, workers=2)
    lanes: list[str] = []
    template = sandbox().from_string("{% for i in range(100000) %}{{ hold() }}{% endfor %}")

    def work() -> str:
        try:
            render_bounded(
                template, {"hold": lambda: threading.Event().wait(0.002) and ""}, Limits(seconds=0.5)
            )
        except TemplateLimitError:
            lanes.append("slow, cut by its own limit")
            return "refused"
        except SlowRender:
            lanes.append("quick, moved")
            raise
        return "rendered"

    assert anyio.run(builder.off_loop, work) == "refused"
    assert lanes == ["quick, moved", "slow, cut by its own limit"]
