"""Sessions: an id is opened once, records calls in order until closed, is refused
(with its HTTP status) when never opened or closed, runs its close hooks, and keeps
sessions recorded from many threads apart."""
import threading

import pytest

from agentjax.endpoint.sessions import (RecordedCall, SessionClosed, SessionError,
                                        SessionInUse, Sessions, UnknownSession)


def call(n: int) -> RecordedCall:
    return RecordedCall(prompt_ids=(1, n), completion_ids=(n,), logprobs=(-0.5,),
                        versions=(0,), finish_reason="stop", weight_version=0,
                        messages=({"role": "user", "content": str(n)},), tools=(),
                        logprob_distribution="sampling")


def test_a_session_records_in_order_until_closed_and_is_never_reused():
    sessions, closed = Sessions(), []
    sessions.add_close_hook(closed.append)
    sessions.open("a")
    sessions.record("a", call(1))
    sessions.record("a", call(2))
    assert sessions.calls("a") == [call(1), call(2)] and sessions.open_ids() == ["a"]
    assert sessions.close("a") == [call(1), call(2)] and closed == ["a"]
    for refused in (lambda: sessions.record("a", call(3)), lambda: sessions.close("a"),
                    lambda: sessions.check("a")):
        with pytest.raises(SessionClosed) as error:
            refused()
        assert error.value.status == 410
    with pytest.raises(SessionInUse) as error:
        sessions.open("a")
    assert error.value.status == 409
    with pytest.raises(UnknownSession) as error:
        sessions.record("b", call(1))
    assert error.value.status == 404 and closed == ["a"]
    for bad in ("", "a/b", "a b", "x" * 257, None):
        with pytest.raises(SessionError) as error:
            sessions.open(bad)
        assert error.value.status == 400


def test_sessions_recorded_from_many_threads_stay_apart():
    sessions = Sessions()
    threads, per_thread, calls = 8, 50, 4
    mixed = []  # a thread's assertion would not fail the test: its findings are kept

    def work(t):
        for s in range(per_thread):
            session_id = f"{t}-{s}"
            sessions.open(session_id)
            for n in range(calls):
                sessions.record(session_id, call(t * 10_000 + s * 10 + n))
            if sessions.close(session_id) != [call(t * 10_000 + s * 10 + n)
                                              for n in range(calls)]:
                mixed.append(session_id)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert mixed == [] and sessions.open_ids() == []
    with pytest.raises(SessionInUse):
        sessions.open("7-49")
