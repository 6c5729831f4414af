"""Attack on recorded model-call failures (issue #13, session 33): a model call that raised is
a ``failed:raised`` call row, and replays that read the cache raise it again. What a user meets
when the endpoint was down, refused or rate-limited at the recording, and every later run once
it answers.
"""

from __future__ import annotations

from pathlib import Path

from rewind.store import open_store
from tests import test_failed_calls as failed
from tests.model_stub import stub_and_client


def test_a_cached_chain_whose_every_try_failed_sends_again_once_the_endpoint_answers(
    tmp_path: Path,
) -> None:
    """The chain catches the endpoint's failures and returns a fallback (``flaky``: 3 tries,
    then ``error: ...``). Recorded while the endpoint was down, every try failed and the trace
    completed with the fallback. Each later ``Tracer(read_cache=True)`` run, the endpoint
    answering now, raised the three recorded failures again, sent nothing and returned the
    fallback, forever: the user could not get past the outage without editing code. A cached
    trace replays a recorded failure only when the source got an answer after it (the failure
    was part of the recorded path, the chain recovered); failures after the source's last
    answer are sent again (the endpoint was down). Explicit replays still replay them."""
    failed._DROPS[0] = 3
    with stub_and_client(failed._reply) as (stub, client):
        source = failed._record(tmp_path, client)
        assert stub.count == 3
        failed._DROPS[0] = 0
        cached = failed._replay("cached", tmp_path, client, source)
        sent = stub.count - 3
        in_place = failed._replay("in-place", tmp_path, client, source)
        assert stub.count - 3 == sent
    st = open_store(tmp_path)
    try:
        assert sent == 2  # the first try answered, then the follow-up
        assert failed._labels(st, cached) == [["miss:source-failed"]] * 2  # its steps 1, 2 failed
        assert [s[1] for s in failed._steps(st, cached)] == ["success", "success"]
        assert st.get_run(cached).parent_run_id == source
        assert failed._labels(st, in_place) == [["failed:replayed"]] * 3
        assert failed._steps(st, in_place) == failed._steps(st, source)
    finally:
        st.close()
