"""The control plane refuses anyone without the deployment's token: a forged Submit, Abort or
Report never reaches a worker or the frontend."""

from __future__ import annotations

import grpc
import pytest

from pddflow.runtime.proto import runtime_pb2 as pb
from pddflow.runtime.rpc import FRONTEND, WORKER, Credentials, WorkerClient, open_reports, serve


@pytest.fixture
def worker_service():
    seen: list[pb.Cancel] = []

    def abort(m: pb.Cancel) -> pb.Reply:
        seen.append(m)
        return pb.Reply(ok=True)

    server, port = serve(WORKER, Credentials("s3cret"), {"Abort": (pb.Cancel, pb.Reply, abort)})
    yield f"127.0.0.1:{port}", seen
    server.stop(grace=0)


def test_worker_calls_need_the_token(worker_service):
    address, seen = worker_service
    good = WorkerClient(address, Credentials("s3cret"))
    assert good.call("Abort", pb.Cancel(seq_id="a", reason="mine"), timeout_s=5).ok
    for forger in (
        WorkerClient(address, Credentials("guess")),
        WorkerClient(address, Credentials("")),
    ):
        with pytest.raises(grpc.RpcError) as err:
            forger.call("Abort", pb.Cancel(seq_id="victim", reason="forged"), timeout_s=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # no metadata at all: a raw channel
    with grpc.insecure_channel(address) as ch:
        call = ch.unary_unary(
            f"/{WORKER}/Abort",
            request_serializer=pb.Cancel.SerializeToString,
            response_deserializer=pb.Reply.FromString,
        )
        with pytest.raises(grpc.RpcError) as err:
            call(pb.Cancel(seq_id="victim"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert [m.seq_id for m in seen] == ["a"]


def test_report_stream_needs_the_token():
    got: list[pb.Report] = []

    def reports(stream, context) -> pb.Empty:
        got.extend(stream)
        return pb.Empty()

    server, port = serve(
        FRONTEND, Credentials("s3cret"), streams_in={"Reports": (pb.Report, pb.Empty, reports)}
    )
    try:
        forged = pb.Report(
            instance="main/0",
            tokens=pb.TokenBatch(
                tokens=[pb.Tokens(seq_id="victim", start=0, ids=[1, 2], final=True)]
            ),
        )
        fut = open_reports(f"127.0.0.1:{port}", iter([forged]), Credentials("guess"))
        with pytest.raises(grpc.RpcError) as err:
            fut.result(timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        real = pb.Report(instance="main/0", status=pb.WorkerStatus(instance="main/0"))
        open_reports(f"127.0.0.1:{port}", iter([real]), Credentials("s3cret")).result(timeout=10)
        assert [r.instance for r in got] == ["main/0"] and got[0].HasField("status")
    finally:
        server.stop(grace=0)


def _signed(ca, d, name: str):
    from pddflow.channels.security import TLSConfig, key_and_request

    d.mkdir()
    key, csr = key_and_request(d, name)
    (d / "cert.pem").write_bytes(ca.sign(csr, ("127.0.0.1", "localhost")))
    return TLSConfig(cert_chain=str(d / "cert.pem"), private_key=key, root_certs=ca.cert)


def test_mutual_tls_with_the_deployments_ca(tmp_path):
    """The ray backend's TLS: each end's own key, a certificate the deployment's CA signed; a
    party whose certificate another CA signed is refused even with the right token."""
    from pddflow.channels.security import CertificateAuthority

    ca = CertificateAuthority.create(tmp_path / "ca")
    other = CertificateAuthority.create(tmp_path / "other")
    server_tls = _signed(ca, tmp_path / "worker", "prefill/0")  # an instance name
    seen: list[str] = []

    def abort(m: pb.Cancel) -> pb.Reply:
        seen.append(m.seq_id)
        return pb.Reply(ok=True)

    server, port = serve(
        WORKER, Credentials("s3cret", server_tls), {"Abort": (pb.Cancel, pb.Reply, abort)}
    )
    try:
        address = f"127.0.0.1:{port}"
        fe = _signed(ca, tmp_path / "fe", "fe")
        assert fe.private_key_bytes() != server_tls.private_key_bytes()
        mine = WorkerClient(address, Credentials("s3cret", fe))
        assert mine.call("Abort", pb.Cancel(seq_id="a"), timeout_s=10).ok
        stranger = WorkerClient(address, Credentials("s3cret", _signed(other, tmp_path / "x", "x")))
        with pytest.raises(grpc.RpcError) as err:
            stranger.call("Abort", pb.Cancel(seq_id="forged"), timeout_s=3)
        # the handshake fails: the call waits for a connection that never comes
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert seen == ["a"]
    finally:
        server.stop(grace=0)
