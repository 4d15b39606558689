"""The sandbox chat templates render in: jinja2's immutable sandbox, with a time limit and a size limit.

A checkpoint's template is code from a file. The sandbox already refuses unsafe attributes; these
limits stop the rest: a nested `range(100000)` loop (it hung `serve`) and `{{'x'*1000000000}}`
(20.9 GB before the kernel killed it). Jinja code cannot be interrupted from outside, so the render
checks as it goes: every call, range step and output chunk looks at the deadline, and every way a
template can make a large value asks first — `*`, `+`, `**` and `%` (intercepted binary operators),
`~` (the code generator's concatenation), numbers passed to calls and filters, and `range` itself.
A template that breaks a limit raises `TemplateLimitError` within the time limit, having allocated
at most the size limit.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.ext
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.nodes import Concat
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg

MAX_RENDER_SECONDS = 2.0
MAX_RENDER_CHARS = 64 * 2**20  # characters of output, and of any one string or list a template builds
# Characters all the strings and lists a render builds may add up to: one value is held to
# MAX_RENDER_CHARS, but a loop could build (and drop) one of that size at every step.
MAX_BUILT_CHARS = 16 * MAX_RENDER_CHARS
MAX_RANGE = 100_000
MAX_POWER_BITS = 4096  # no template needs a larger integer than this
_CHECK_EVERY = 1024  # range steps between deadline checks
_WIDE_FORMAT = re.compile(r"\d{8,}")  # a width or precision of 8+ digits in a format string


class TemplateLimitError(ValueError):
    """A chat template ran past its time limit or tried to build more text than its size limit."""


class SlowRender(Exception):
    """A render ran past the quick lane's budget (`quick_lane`): its caller moves it to a slow lane
    and renders it again there under the full limits. Not a TemplateLimitError: nothing is refused."""


@dataclass
class Limits:
    seconds: float = MAX_RENDER_SECONDS
    chars: int = MAX_RENDER_CHARS


@dataclass
class _Budget:
    deadline: float
    chars: int
    built: int = 0  # characters of every value built so far, kept or not
    quick_deadline: float | None = None  # in the quick lane: SlowRender past it

    @property
    def built_chars(self) -> int:
        return MAX_BUILT_CHARS * self.chars // MAX_RENDER_CHARS

    def spend(self, size: int, what: str) -> None:
        """A value of `size` items is about to be built: within the per-value and the per-render limit."""
        self.check_size(size, what)
        self.built += size
        if self.built > self.built_chars:
            raise TemplateLimitError(
                f"{what} would take the strings the template built to {self.built} characters in all "
                f"(limit {self.built_chars})"
            )
        self.check_time()

    def check_time(self) -> None:
        now = time.monotonic()
        if now > self.deadline:
            raise TemplateLimitError("the template ran past its time limit")
        if self.quick_deadline is not None and now > self.quick_deadline:
            raise SlowRender(f"the render took more than the quick lane's {_QUICK_SECONDS.get()} s")

    def check_size(self, size: int, what: str) -> None:
        if size > self.chars:
            raise TemplateLimitError(f"{what} would make {size} items (limit {self.chars})")


_BUDGET: contextvars.ContextVar[_Budget] = contextvars.ContextVar("chat_template_budget")
_QUICK_SECONDS: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "quick_render_seconds", default=None
)


@contextlib.contextmanager
def quick_lane(seconds: float) -> Iterator[None]:
    """Renders inside this block raise SlowRender once they pass `seconds` (within their own limits):
    a server renders on a small pool, and one input that makes a template explode must not hold a
    worker for the whole time limit while other requests queue behind it."""
    token = _QUICK_SECONDS.set(seconds)
    try:
        yield
    finally:
        _QUICK_SECONDS.reset(token)


def _budget() -> _Budget:
    budget = _BUDGET.get(None)
    if budget is None:  # rendered outside render_bounded (a built-in's helper): the default limits
        budget = _Budget(time.monotonic() + MAX_RENDER_SECONDS, MAX_RENDER_CHARS)
    return budget


def _check_numbers(args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> None:
    budget = _budget()
    budget.check_time()
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and abs(value) > budget.chars:
            budget.check_size(abs(value), what)


class _BoundedRange:
    """`range()` for templates: at most MAX_RANGE items, each step within the deadline."""

    def __init__(self, *args: int) -> None:
        self._range = range(*args)
        if len(self._range) > MAX_RANGE:
            raise TemplateLimitError(f"range of {len(self._range)} items (limit {MAX_RANGE})")

    def __iter__(self) -> Iterator[int]:
        budget = _budget()
        for i, value in enumerate(self._range):
            if i % _CHECK_EVERY == 0:
                budget.check_time()
            yield value

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: Any) -> Any:
        return self._range[index]

    def __contains__(self, value: object) -> bool:
        return value in self._range


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, str | list | tuple) else None


class _CodeGenerator(CodeGenerator):
    """Compiles `a ~ b` to a concatenation that checks its size before it builds the string."""

    def visit_Concat(self, node: Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with limits; reading an unsafe attribute (`__class__`, `__globals__`)
    fails at once instead of quietly rendering as empty."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals["range"] = _BoundedRange
        self.globals.pop("lipsum", None)  # lipsum(n=10**9): no chat template needs it
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(f"the template reads {attribute!r} of a {type(obj).__name__}: not allowed")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_numbers(args, kwargs, f"calling {getattr(__obj, '__name__', 'a function')}")
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        owner = getattr(value, "__self__", None)
        if isinstance(owner, str) and _WIDE_FORMAT.search(owner):
            raise TemplateLimitError("a format string with a width of 8 or more digits")
        return super().wrap_str_format(value)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.check_time()
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if _sized(seq) is not None and isinstance(count, int):
                    budget.spend(_sized(seq) * max(count, 0), f"{type(seq).__name__} * {count}")
        elif operator == "+" and _sized(left) is not None and _sized(right) is not None:
            budget.spend(_sized(left) + _sized(right), f"{type(left).__name__} + {type(right).__name__}")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            bits = int(right * math.log2(abs(left)))
            if bits > MAX_POWER_BITS:
                raise TemplateLimitError(f"{left} ** {right} would have {bits} bits (limit {MAX_POWER_BITS})")
        elif operator == "%" and isinstance(left, str) and _WIDE_FORMAT.search(left):
            raise TemplateLimitError("a format string with a width of 8 or more digits")
        return super().call_binop(context, operator, left, right)

    def bounded_concat(self, parts: tuple[Any, ...]) -> str:
        texts = [str(part) for part in parts]
        _budget().spend(sum(map(len, texts)), "a ~ concatenation")
        return "".join(texts)


def _bounded_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """The filter, refusing numbers past the size limit among its arguments (`center(10**9)`);
    the value being filtered is not an argument (`{{ 1733000000 | string }}` is fine)."""
    skip = 2 if _PassArg.from_obj(function) is not None else 1  # the context or environment, then the value

    @functools.wraps(function)  # keeps jinja's pass_context/pass_environment marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_numbers(args[skip:], kwargs, f"the {name} filter")
        return function(*args, **kwargs)

    return bounded


def render_bounded(template: jinja2.Template, context: dict[str, Any], limits: Limits) -> str:
    """Render within `limits`; TemplateLimitError names the limit that was hit (SlowRender in a quick
    lane that it outlasted)."""
    started = time.monotonic()
    quick = _QUICK_SECONDS.get()
    budget = _Budget(
        started + limits.seconds, limits.chars, quick_deadline=None if quick is None else started + quick
    )
    token = _BUDGET.set(budget)
    try:
        chunks, size = [], 0
        for chunk in template.generate(**context):
            size += len(chunk)
            budget.check_size(size, "the rendered prompt")
            budget.check_time()
            chunks.append(chunk)
        return "".join(chunks)
    finally:
        _BUDGET.reset(token)


def sandbox() -> BoundedSandbox:
    return BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
