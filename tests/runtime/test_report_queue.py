"""A worker's report queue: a report stream whose call has ended takes no report with it (gRPC's
sending thread still asks an ended call's iterator for one more message, and drops it)."""

from __future__ import annotations

import threading

from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.workers.report_queue import ReportQueue


def report(n: int) -> pb.Report:
    return pb.Report(instance=f"w{n}")


def test_an_ended_stream_hands_back_what_it_took_in_order():
    q, closed = ReportQueue(), threading.Event()
    first, ended = q.stream(closed, poll_s=0.01)
    q.put(report(1))
    assert next(first).instance == "w1"
    # the call ends while its sending thread waits in next(): the report it then takes goes back
    taken: list = []
    t = threading.Thread(target=lambda: taken.extend(first))
    t.start()
    ended.set()
    q.put(report(2))
    q.put(report(3))
    t.join(5)
    assert not t.is_alive() and taken == []
    second, _ = q.stream(closed, poll_s=0.01)
    assert [next(second).instance, next(second).instance] == ["w2", "w3"]


def test_a_closed_worker_ends_its_streams():
    q, closed = ReportQueue(), threading.Event()
    messages, _ = q.stream(closed, poll_s=0.01)
    closed.set()
    assert list(messages) == []
