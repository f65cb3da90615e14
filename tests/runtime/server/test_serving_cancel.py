"""A handler cancelled while its call waits for admission still aborts what it submitted."""

from __future__ import annotations

import asyncio

from quantkit.runtime.server.engine_loop import Submission
from quantkit.runtime.server.serving import Call, OpenAIServing


class SilentLoop:
    """An engine loop that takes submissions and never answers (admission still queued)."""

    def __init__(self):
        self.submitted, self.aborted = [], []

    def submit(self, submissions, sink) -> None:
        self.submitted += [s.request_id for s in submissions]

    def abort(self, request_ids) -> None:
        self.aborted += list(request_ids)


def test_a_handler_cancelled_before_admission_aborts_its_submissions():
    loop = SilentLoop()
    serving = OpenAIServing(loop, tokenizer=None, model_name="tiny", max_model_len=64, vocab_size=10)
    call = Call(chat=False, response_id="cmpl-1", submissions=[Submission("cmpl-1-0", [1, 2], None),
                                                                 Submission("cmpl-1-1", [3], None)],
                stream=False, include_usage=False)

    async def cancel_while_waiting():
        task = asyncio.ensure_future(serving.run(call, request=None))
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(cancel_while_waiting())
    assert loop.submitted == ["cmpl-1-0", "cmpl-1-1"] and loop.aborted == ["cmpl-1-0", "cmpl-1-1"]
