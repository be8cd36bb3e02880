"""ChatTemplate renders as ``apply_chat_template(..., tokenize=False)`` (the one contact with transformers' chat
code, pinned here), reads each template shape's generation prompt and end-of-turn token, and refuses what it
cannot use in one line."""

from __future__ import annotations

import json
import re

import pytest

import padpipe as pp
from padpipe.chat.template import ChatTemplate, Probe, load_chat_tokenizer
from tests import chat_fixtures as fx

transformers = pytest.importorskip("transformers")

PROBES = {
    "chatml": Probe("<|im_start|>assistant\n", True, "<|im_end|>", ("<|im_end|>", "<|endoftext|>")),
    "chatml_marked": Probe("<|im_start|>assistant\n", True, "<|im_end|>", ("<|im_end|>", "<|endoftext|>")),
    "qwen25": Probe("<|im_start|>assistant\n", True, "<|im_end|>", ("<|im_end|>", "<|endoftext|>")),
    "llama3": Probe(
        "<|start_header_id|>assistant<|end_header_id|>\n\n", True, "<|eot_id|>", ("<|eot_id|>", "<|endoftext|>")
    ),
    "llama3_marked": Probe(
        "<|start_header_id|>assistant<|end_header_id|>\n\n", True, "<|eot_id|>", ("<|eot_id|>", "<|endoftext|>")
    ),
    "mistral": Probe("", True, "</s>", ("</s>",)),
    "gemma": Probe("<start_of_turn>model\n", True, "<end_of_turn>", ("<end_of_turn>", "<|endoftext|>")),
    "gemma_marked": Probe("<start_of_turn>model\n", True, "<end_of_turn>", ("<end_of_turn>", "<|endoftext|>")),
    "qwen3": Probe("<|im_start|>assistant\n", True, "<|im_end|>", ("<|im_end|>", "<|endoftext|>")),
}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_template_renders_as_apply_chat_template(name: str) -> None:
    tok = fx.tokenizer(name=name)
    template = ChatTemplate(tok)
    chats = fx.conversations(6, seed=2, system=0.0 if name.startswith(("gemma", "mistral")) else 0.5)
    for chat in chats:
        for prompt in (False, True):
            texts, blocks = template.render([chat], generation_prompt=prompt, markers=template.marked())
            assert texts == [tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=prompt)]
            assert (blocks is not None) == ("marked" in name)


def test_template_passes_tools_and_arguments_as_apply_chat_template() -> None:
    tok = fx.tokenizer(name="qwen25")
    chat = fx.tool_conversation()
    texts, _ = ChatTemplate(tok).render([chat], tools=[fx.WEATHER_TOOL])
    assert texts == [tok.apply_chat_template(chat, tools=[fx.WEATHER_TOOL], tokenize=False)]
    tok = fx.tokenizer(name="llama3")
    texts, _ = ChatTemplate(tok).render([chat], kwargs={"date_string": "1 Jan 2026"})
    assert "Today Date: 1 Jan 2026" in texts[0]
    assert texts == [tok.apply_chat_template(chat, date_string="1 Jan 2026", tokenize=False)]


def test_template_drops_none_values_of_messages_as_apply_chat_template() -> None:
    tok = fx.tokenizer(name="qwen25")
    chat = [{"role": "user", "content": "hi", "tool_calls": None}, {"role": "assistant", "content": "yo", "x": None}]
    assert ChatTemplate(tok).render([chat])[0] == [tok.apply_chat_template(chat, tokenize=False)]


def test_template_picks_the_tool_use_template_with_tools() -> None:
    tok = fx.tokenizer()
    tok.chat_template = {"default": fx.CHATML, "tool_use": fx.QWEN25}
    template = ChatTemplate(tok)
    chat = fx.tool_conversation()
    assert template.render([chat])[0] == [tok.apply_chat_template(chat, tokenize=False)]
    assert template.render([chat], tools=[fx.WEATHER_TOOL])[0] == [
        tok.apply_chat_template(chat, tools=[fx.WEATHER_TOOL], tokenize=False)
    ]


@pytest.mark.parametrize("name", sorted(PROBES))
def test_template_reads_the_generation_prompt_and_end_of_turn_of_each_shape(name: str) -> None:
    assert ChatTemplate(fx.tokenizer(name=name)).probe == PROBES[name]


def test_template_sees_a_template_that_ignores_add_generation_prompt() -> None:
    ignoring = fx.CHATML.replace("{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}", "")
    probe = Probe("<|im_start|>assistant\n", False, "<|im_end|>", ("<|im_end|>", "<|endoftext|>"))
    assert ChatTemplate(fx.tokenizer(ignoring)).probe == probe  # the header its answers open with: their prompt


def test_template_given_overrides_the_tokenizers_and_changes_the_fingerprint() -> None:
    tok = fx.tokenizer(name="chatml")
    own, given = ChatTemplate(tok), ChatTemplate(tok, fx.GEMMA)
    assert given.render([[{"role": "user", "content": "x"}]])[0] == ["<start_of_turn>user\nx<end_of_turn>\n"]
    assert own.fingerprint() != given.fingerprint()
    assert own.fingerprint() == ChatTemplate(fx.tokenizer(name="chatml")).fingerprint()


def test_template_loads_a_pretrained_folder(tmp_path) -> None:
    fx.tokenizer(name="llama3").save_pretrained(tmp_path)
    template = ChatTemplate(str(tmp_path))
    assert template.probe == PROBES["llama3"]
    assert template.token_id("eos_id") == template.tokenizer.convert_tokens_to_ids("<|endoftext|>")


def test_template_stops_at_the_tokenizers_eos_and_its_generation_configs_and_keys_them(tmp_path) -> None:
    tok = fx.tokenizer(name="chatml")
    template = ChatTemplate(tok)
    assert template.stop_tokens == ("<|endoftext|>",) and template.probe == PROBES["chatml"]
    tok.save_pretrained(tmp_path)
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    from_folder = ChatTemplate(str(tmp_path))  # as a model ships it: the stops its generation config lists
    assert from_folder.stop_tokens == ("<|endoftext|>", "<|im_end|>")
    assert from_folder.fingerprint() != template.fingerprint()  # a chat cache keyed on them
    hub = fx.tokenizer(name="chatml")
    hub.name_or_path = "no-such-org/no-such-model"  # not in the local cache: never fetched
    assert ChatTemplate(hub).stop_tokens == ("<|endoftext|>",)


def test_template_raises_error_without_a_template() -> None:
    message = (
        "chat() needs a chat template, but the tokenizer (TokenizersBackend) has none and no `chat_template=` "
        "was given: pass chat_template= a Jinja template string."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ChatTemplate(fx.tokenizer(None))
    assert ChatTemplate(fx.tokenizer(None), required=False).marked() is False


def test_template_raises_error_on_a_template_that_fails_on_a_plain_conversation() -> None:
    with pytest.raises(
        ValueError,
        match=r"^chat\(\): the chat template fails on a plain conversation \(a user message "
        r"and an answer\): TemplateError: no$",
    ):
        ChatTemplate(fx.tokenizer("{{ raise_exception('no') }}"))


def test_template_raises_error_on_tokenizers_that_cannot_render() -> None:
    with pytest.raises(
        TypeError,
        match=r"^chat\(\) needs a transformers tokenizer \(it renders the chat template "
        r"with the tokenizer's special tokens\), but got a tokenizers.Tokenizer; wrap it",
    ):
        load_chat_tokenizer(pp.examples.tokenizer())
    with pytest.raises(TypeError, match=r"^chat\(\) needs a transformers tokenizer .* but got a tokenizers.Tokenizer"):
        load_chat_tokenizer(pp.examples.TOKENIZER_JSON)  # a tokenizer.json file has no chat template either
    with pytest.raises(
        TypeError,
        match=r"^`tokenizer` must be a transformers tokenizer or a pretrained folder, but "
        r"is int instead\.$",
    ):
        load_chat_tokenizer(3)
    with pytest.raises(TypeError, match=r"^`chat_template` must be a Jinja template string, but is 3 instead\.$"):
        ChatTemplate(fx.tokenizer(), 3)  # type: ignore[arg-type]


def test_template_reads_how_an_earlier_answer_ends_where_the_last_ends_otherwise() -> None:
    template = (  # as gpt-oss: the last answer ends with <|return|>, the others with <|end|>
        "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}"
        "{{ '<|return|>' if loop.last and m.role == 'assistant' else '<|end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}<|start|>assistant<|message|>{% endif %}"
    )
    tok = fx.tokenizer(template, additional_special_tokens=["<|start|>", "<|message|>", "<|end|>", "<|return|>"])
    probe = ChatTemplate(tok).probe
    assert probe.end_of_turn == "<|return|>" and probe.ends == ("<|return|>", "<|end|>", "<|endoftext|>")
