from quantkit.runtime.detokenizer import take_delta, update_text
from quantkit.runtime.sampling_params import SamplingParams
from quantkit.runtime.sequence import Sequence, SequenceStatus


class CharTokenizer:
    """Token i decodes to chr(i); 0xFFFD stands for an incomplete multi-byte character."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def feed(text: str, stop=()):
    seq = Sequence("r", [1], SamplingParams(stop=list(stop)))
    deltas, found = [], None
    for ch in text:
        seq.append_token(ord(ch))
        found = update_text(seq, CharTokenizer())
        if found:
            seq.status = SequenceStatus.FINISHED
        deltas.append(take_delta(seq))
        if found:
            break
    return seq, deltas, found


def test_stop_string_is_cut_and_its_prefix_never_streamed():
    seq, deltas, found = feed("hello END world", stop=["END"])
    assert found == "END" and seq.output_text == "hello "
    assert "".join(deltas) == "hello " and all("E" not in d for d in deltas)


def test_a_false_stop_prefix_is_released_later():
    seq, deltas, found = feed("an Eel", stop=["END"])
    assert found is None and seq.output_text == "an Eel"
    assert deltas[3] == "" and "".join(deltas) == "an Eel"  # "E" held back, then released


def test_incomplete_characters_are_held_back():
    _, deltas, _ = feed("ab\ufffdc")
    assert deltas == ["a", "b", "", "\ufffdc"]


def test_incremental_text_equals_a_full_decode_with_the_real_tokenizer():
    """SmolLM2's byte-level BPE splits multi-byte characters across tokens; the windowed decode must
    still give exactly the full decode, and stream it all."""
    from quantkit.models import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model("smollm2-135m"))
    text = "Héllo wörld, 你好 🙂🚀 naïve café\n\tdef f(x):\n        return x ** 2  # ünïcödé ✓"
    ids = tokenizer.encode(text, add_special_tokens=False)
    seq = Sequence("r", [1], SamplingParams())
    deltas = []
    for i in ids:
        seq.append_token(i)
        update_text(seq, tokenizer)
        deltas.append(take_delta(seq))
    seq.status = SequenceStatus.FINISHED
    deltas.append(take_delta(seq))
    assert seq.output_text == tokenizer.decode(ids) == text
    assert "".join(deltas) == text
    assert seq.read_offset == len(ids)  # every window closed: nothing is decoded twice any more
