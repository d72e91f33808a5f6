"""Chat templates: the checkpoint's own (chat_template.jinja beside the tokenizer), a --chat-template override, a
clear 400 without one, template errors as 400; token strings for log-probs."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from frontend.openai_api.errors import OpenAIError
from frontend.openai_api.tokenizer import ModelTokenizer

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"


@pytest.fixture
def tokenizer_dir(tmp_path):
    vocab = {"<eos>": 0, "hello": 1, "world": 2, "[UNK]": 3}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>").save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


def test_without_a_template_chat_is_a_clear_400(tokenizer_dir):
    tok = ModelTokenizer(tokenizer_dir)
    with pytest.raises(OpenAIError) as err:
        tok.render_chat(MESSAGES, True, False, None)
    assert err.value.status == 400 and "--chat-template" in err.value.message


def test_the_checkpoints_own_template_and_an_override(tokenizer_dir, tmp_path):
    (tokenizer_dir / "chat_template.jinja").write_text(TEMPLATE)
    assert ModelTokenizer(tokenizer_dir).render_chat(MESSAGES, True, False, None) == "<system>s<user>u<a>"
    assert ModelTokenizer(tokenizer_dir).render_chat(MESSAGES, False, False, None) == "<system>s<user>u"
    override = tmp_path / "other.jinja"
    override.write_text("{{ messages[-1]['content'] }}!")
    assert ModelTokenizer(tokenizer_dir, override).render_chat(MESSAGES, True, False, None) == "u!"


def test_template_errors_are_400(tokenizer_dir, tmp_path):
    strict = tmp_path / "strict.jinja"
    strict.write_text("{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}")
    with pytest.raises(OpenAIError, match="no system role") as err:
        ModelTokenizer(tokenizer_dir, strict).render_chat(MESSAGES, True, False, None)
    assert err.value.status == 400
    with pytest.raises(OpenAIError, match="continue_final_message"):
        ModelTokenizer(tokenizer_dir, strict).render_chat(MESSAGES, True, True, None)


def test_token_strings(tokenizer_dir):
    assert ModelTokenizer(tokenizer_dir).token_strings([1, 2]) == ["hello", "world"]
    # a padded vocabulary's row past the tokenizer's ids (generated, or among the top log-probs): no text, no error
    known = len(ModelTokenizer(tokenizer_dir).tokenizer)
    assert ModelTokenizer(tokenizer_dir).token_strings([1, known, known + 40]) == ["hello", "", ""]
    with pytest.raises(OpenAIError, match="--tokenizer-dir"):
        ModelTokenizer(None).token_strings([1])


@pytest.mark.parametrize("key", ["tokenize", "chat_template", "messages", "conversation", "return_dict"])
def test_chat_template_kwargs_may_not_set_what_the_server_sets(tokenizer_dir, tmp_path, key):
    """Passed twice they failed as a TypeError (a 500); now a 400 naming the key."""
    override = tmp_path / "t.jinja"
    override.write_text("{% for m in messages %}{{ m.content }}{% endfor %}{{ flavour | default('') }}")
    tok = ModelTokenizer(tokenizer_dir, override)
    with pytest.raises(OpenAIError, match=f"chat_template_kwargs may not set '{key}'") as err:
        tok.render_chat(MESSAGES, False, False, {key: True})
    assert err.value.status == 400
    assert tok.render_chat(MESSAGES, False, False, {"flavour": "!"}) == "su!"  # the template's own variables pass
