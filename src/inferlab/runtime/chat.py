"""The model's chat template (tokenizer.chat_template, a Jinja2 template) rendered as Hugging Face
and llama.cpp render it: sandboxed, trimmed blocks, lstripped blocks."""

from __future__ import annotations

from ..errors import FileFormatError, MissingDependencyError


def render_chat(template: str, messages: list[dict], *, add_generation_prompt: bool = True, **extra) -> str:
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:  # pragma: no cover - jinja2 is in the runtime extra
        raise MissingDependencyError("jinja2", "applying a chat template", "runtime") from exc

    def raise_exception(message):
        raise FileFormatError(f"chat template error: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **extra)
    except TemplateError as exc:
        raise FileFormatError(f"the model's chat template does not render: {exc}") from exc
