"""The ray backend's watch and restart, against a stand-in for Ray: how a dead worker, a dead actor
and a silent node are seen, and that a poll sent before a restart is not believed after it."""

from __future__ import annotations

import time

import pytest

from pddflow.runtime.deploy import ray_backend
from pddflow.runtime.deploy.backend import DeployError
from pddflow.runtime.deploy.ray_backend import Hosted, RayBackend


class ActorDied(Exception):
    pass


class Ref:
    def __init__(self, value=None, error=None, done=True):
        self.value, self.error, self.done = value, error, done


class FakeRay:
    class exceptions:  # noqa: N801 - as ray.exceptions
        RayActorError = ActorDied

    def __init__(self):
        self.killed = []

    def wait(self, refs, num_returns=1, timeout=None):
        done = [r for r in refs if r.done]
        return done, [r for r in refs if not r.done]

    def get(self, ref, timeout=None):
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, actor, no_restart=True):
        self.killed.append(actor)


class Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *a):
        return self.fn(*a)


class FakeActor:
    def __init__(self, ip="10.0.0.1"):
        self.ip = ip
        self.polls: list[Ref] = []  # what the next polls answer, in order
        self.starts = 0
        self.poll = Method(lambda: self.polls.pop(0) if self.polls else Ref((True, "", 7)))
        self.start = Method(self._start)
        self.where = Method(lambda: Ref({"ip": self.ip, "node_id": "n2", "actor_pid": 2}))
        self.halts = 0
        self.halt = Method(self._halt)

    def _halt(self):
        self.halts += 1
        return Ref(None)

    def _start(self, *_):
        self.starts += 1
        return Ref([100 + self.starts])  # every rank's pid: one rank here


@pytest.fixture
def backend(monkeypatch):
    fake = FakeRay()
    monkeypatch.setattr(ray_backend, "_ray", lambda: fake)
    be = RayBackend()
    h = Hosted("main/0", 0, 0, actor=FakeActor(), where={"ip": "10.0.0.1", "node_id": "n1"})
    h.alive, h.last_answer = True, time.monotonic()
    be.hosts["main/0"] = h
    be.running.add("main/0")
    be.fake = fake
    return be


def poll(be):
    be._poll(be.fake, be.hosts["main/0"])


def test_a_dead_worker_is_seen_and_restarted_in_its_actor(backend):
    h = backend.hosts["main/0"]
    actor = h.actor
    actor.polls.append(Ref((False, "main/0 exited with status -9", 0)))
    poll(backend)
    assert not backend.alive("main/0") and "status -9" in backend.exit_summary("main/0")
    backend.restart("main/0")
    assert backend.alive("main/0") and actor.starts == 1 and h.actor is actor


def test_a_poll_sent_before_a_restart_is_not_believed_after_it(backend):
    h = backend.hosts["main/0"]
    stale = Ref((False, "the old worker died", 0), done=False)
    h.actor.polls.append(stale)
    poll(backend)  # sent, not answered yet
    h.alive = False  # (the supervisor saw the death another way)
    backend.restart("main/0")
    stale.done = True
    poll(backend)  # the old answer arrives: it is about the worker before the restart
    assert backend.alive("main/0")
    poll(backend)  # a new poll, about the new worker
    assert backend.alive("main/0") and h.pid == 7


def test_a_dead_actor_comes_back_as_a_new_actor_on_the_same_address(backend, monkeypatch):
    h = backend.hosts["main/0"]
    h.actor.polls.append(Ref(error=ActorDied("the actor's process was killed")))
    poll(backend)
    assert not backend.alive("main/0") and h.actor is None
    assert "its Ray actor died" in backend.exit_summary("main/0")
    fresh = FakeActor()
    monkeypatch.setattr(backend, "_make_actor", lambda hosted: setattr(hosted, "actor", fresh))
    backend.restart("main/0")
    assert h.actor is fresh and fresh.starts == 1 and backend.alive("main/0")
    assert h.where["node_id"] == "n2"


def test_an_instance_is_not_moved_to_another_address(backend, monkeypatch):
    h = backend.hosts["main/0"]
    h.actor.polls.append(Ref(error=ActorDied("node lost")))
    poll(backend)
    elsewhere = FakeActor(ip="10.0.0.99")
    monkeypatch.setattr(backend, "_make_actor", lambda hosted: setattr(hosted, "actor", elsewhere))
    with pytest.raises(DeployError, match="moved from 10.0.0.1 to 10.0.0.99"):
        backend.restart("main/0")
    assert backend.fake.killed == [elsewhere] and h.actor is None
    assert not backend.alive("main/0")


def test_a_silent_actor_counts_as_lost(backend, monkeypatch):
    monkeypatch.setattr(ray_backend, "UNANSWERED_S", 0.05)
    h = backend.hosts["main/0"]
    h.actor.polls.append(Ref(done=False))
    poll(backend)
    assert backend.alive("main/0")
    time.sleep(0.1)
    poll(backend)
    assert not backend.alive("main/0") and "answered nothing" in backend.exit_summary("main/0")


def test_a_parked_instance_is_not_watched_and_starts_in_its_kept_actor(backend):
    """Live scaling: stopping an instance halts its worker and keeps its actor; parked, it is
    neither polled nor reported dead; started, its worker runs in the same actor again."""
    be, h = backend, backend.hosts["main/0"]
    actor = h.actor
    be.stop_instance("main/0")
    assert actor.halts == 1 and h.actor is actor and be.fake.killed == []
    assert be.instances() == [] and be.check() is None and not be.alive("main/0")
    poll(be)
    assert h.pending is None  # not polled
    be.start_instance("main/0")
    assert be.instances() == ["main/0"] and be.alive("main/0") and h.pid == 101
    assert h.actor is actor and be.check() is None
