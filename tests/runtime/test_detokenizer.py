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
