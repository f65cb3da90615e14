from quantkit.bench.prompts import PROMPT_SETS, TEXT_OPENING_TOKENS, draw_prompts, prompt_ids
from quantkit.data.records import parse_record
from quantkit.models import load_tokenizer


def test_draw_is_deterministic_and_spreads_over_every_set(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    first, again = draw_prompts(tokenizer, 20, max_tokens=96), draw_prompts(tokenizer, 20, max_tokens=96)
    assert first == again
    assert len(first) == 20 and len({p.source for p in first}) == 20
    assert {p.dataset for p in first} == set(PROMPT_SETS)
    assert all(0 < len(p.token_ids) <= 96 for p in first)
    assert draw_prompts(tokenizer, 20, seed=1) != draw_prompts(tokenizer, 20, seed=0)


def test_uneven_count_gives_the_first_sets_one_more(tiny_model):
    prompts = draw_prompts(load_tokenizer(tiny_model), 7)
    counts = [sum(p.dataset == d for p in prompts) for d in PROMPT_SETS]
    assert counts == [2, 2, 1, 1, 1]


def test_chat_prompt_stops_before_the_last_reply_and_text_keeps_its_opening(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    chat = parse_record({"messages": [{"role": "user", "content": "where is my order"},
                                      {"role": "assistant", "content": "It shipped yesterday."},
                                      {"role": "user", "content": "thanks"},
                                      {"role": "assistant", "content": "You are welcome."}]}, "t:1")
    text = tokenizer.decode(prompt_ids(chat, tokenizer))
    assert "It shipped yesterday." in text and "thanks" in text and "welcome" not in text
    long_text = parse_record({"text": "The storage API returns 429. " * 50}, "t:2")
    assert len(prompt_ids(long_text, tokenizer)) == TEXT_OPENING_TOKENS
