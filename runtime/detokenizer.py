"""Incremental detokenization and stop strings.

Each step decodes only a window of the latest tokens, from the last token boundary whose text is final
(prefix_offset) to the end, and keeps what the window adds beyond the text of its already-final part:
decoding the whole output again after every token cost O(n^2) (~4% of a 64 x 128-token run). Starting
the window one boundary back keeps the spacing that tokenizers attach to the token before (SentencePiece's
leading space). A window that ends in an incomplete multi-byte character stays open until it completes.
Text ending in an incomplete character, or in what may be the start of a stop string, is held back from
streaming until it resolves.
"""

from __future__ import annotations

from quantkit.runtime.sequence import Sequence


def update_text(seq: Sequence, tokenizer) -> str | None:
    """Refresh seq.output_text; return the stop string it now contains (text cut before it), else None."""
    pending = _new_text(seq, tokenizer)  # first: it may move text into seq.stable_text
    text = seq.stable_text + pending
    for stop in seq.params.stop:
        at = text.find(stop, max(0, len(seq.output_text) - len(stop)))
        if at != -1:
            seq.output_text = text[:at]
            return stop
    seq.output_text = text
    return None


def _new_text(seq: Sequence, tokenizer) -> str:
    """The text the tokens after seq.read_offset add; commits it (moves the window on) once it is whole."""
    ids, skip = seq.output_token_ids, seq.params.skip_special_tokens
    prefix = tokenizer.decode(ids[seq.prefix_offset:seq.read_offset], skip_special_tokens=skip)
    window = tokenizer.decode(ids[seq.prefix_offset:], skip_special_tokens=skip)
    new = window[len(prefix):]
    if new and not new.endswith("\ufffd"):
        seq.stable_text += new
        seq.prefix_offset, seq.read_offset = seq.read_offset, len(ids)
        return ""
    return new


def take_delta(seq: Sequence) -> str:
    """Text not yet streamed that is safe to stream now."""
    text = seq.output_text
    end = len(text)
    if not seq.is_finished:
        if text.endswith("\ufffd"):
            end = len(text.rstrip("\ufffd"))
        for stop in seq.params.stop:  # a stop string's prefix at the end may still become the stop string
            for k in range(min(len(stop) - 1, end), 0, -1):
                if text[:end].endswith(stop[:k]):
                    end -= k
                    break
    delta = text[seq.num_streamed_chars:end] if end > seq.num_streamed_chars else ""
    seq.num_streamed_chars = max(seq.num_streamed_chars, end)
    return delta
