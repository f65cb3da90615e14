"""Incremental detokenization and stop strings.

The whole output is decoded again after each token (outputs are short; this keeps multi-byte
characters and merges right). Text ending in an incomplete character, or in what may be the start of
a stop string, is held back from streaming until it resolves.
"""

from __future__ import annotations

from quantkit.runtime.sequence import Sequence


def update_text(seq: Sequence, tokenizer) -> str | None:
    """Refresh seq.output_text; return the stop string it now contains (text cut before it), else None."""
    text = tokenizer.decode(seq.output_token_ids, skip_special_tokens=seq.params.skip_special_tokens)
    for stop in seq.params.stop:
        at = text.find(stop, max(0, len(seq.output_text) - len(stop)))
        if at != -1:
            seq.output_text = text[:at]
            return stop
    seq.output_text = text
    return None


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
