"""The two ways a relay can hand a sequence to main, each over its real channel through the graph's
emulated link (`pddflow bench handoff`, docs/benchmarks.md): the generated token IDs over
`token_ids` and an extend on main (what the runtime does), or the KV of those tokens over
`wan_flight`, landed in main's cache. Both end in the same state on main: the prompt and the
handed-off tokens computed, the next token pending, ready for the next decode step."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace

from pddflow.channels.link_relay import LinkRelay
from pddflow.channels.token_ids.client import TokenIdsClient
from pddflow.channels.token_ids.codec import envelope
from pddflow.channels.token_ids.protocol import TokenIdsParams
from pddflow.channels.token_ids.server import TokenIdsServer
from pddflow.channels.wan_flight.params import WanFlightParams
from pddflow.channels.wan_flight.receiver import WanFlightReceiver
from pddflow.channels.wan_flight.sender import WanFlightSender
from pddflow.core.link import Jitter, LinkModel
from pddflow.core.payloads import KVBlocks, TokenIds
from pddflow.operators.engine import Engine
from pddflow.operators.sequence import Sequence

# a lognormal sample far in the tail can take seconds; a send must not time out on it
DEADLINE_S = 120.0


@dataclass
class Measured:
    """One handoff: from the relay handing it to the channel until main can decode the next one."""

    seconds: float  # wall clock, all of it
    wire_bytes: int  # relay -> main bytes that crossed the link's TCP relay (headers, framing)
    ack_bytes: int  # main -> relay
    payload_bytes: int  # the protobuf message, or the KV blocks' bytes
    compute_s: float  # main's share of `seconds`: the extend, or landing the KV
    # the same work in main's thread CPU time: what it takes on a core of its own, which the
    # wall clock of a shared machine does not show (one torch thread computes on the caller's)
    compute_cpu_s: float

    @property
    def link_s(self) -> float:
        """Until main had the message or the KV: the channel through the emulated link."""
        return self.seconds - self.compute_s


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit("/", 1)[-1].rsplit(":", 1)
    return host, int(port)


class TokenIdsPath:
    """relay -> LinkRelay -> main's token_ids server; main extends over the IDs and samples."""

    def __init__(self, link: LinkModel, seed: int, deadline_s: float, jitter: bool):
        token = secrets.token_hex(16)  # as a deployment authenticates cross-cluster channels
        # the runtime emulates token IDs with the link's RTT and bandwidth but not its jitter, which
        # models bulk KV queueing on a busy WAN (PDD: std 4.8 ms); `jitter` puts it back
        shaped = link if jitter else replace(link, jitter=Jitter())
        params = TokenIdsParams(deadline_s=deadline_s, token=token, emulate=shaped, seed=seed)
        self.server = TokenIdsServer("127.0.0.1", 0, params=params, name="main")
        self.relay = LinkRelay(_host_port(self.server.address))
        self.client = TokenIdsClient(self.relay.address, params=params, name="relay")
        try:
            self.client.connect(timeout_s=deadline_s)
        except BaseException:
            self.close()  # the server and the relay already listen
            raise

    def run(self, engine: Engine, seq: Sequence, ids: list[int]) -> Measured:
        """`seq` is main's: the prompt computed, nothing pending."""
        msg = TokenIds(seq.seq_id, 0, ids, final=True)
        up0, down0 = self.relay.stats.up_bytes, self.relay.stats.down_bytes
        t0 = time.perf_counter()
        ack = self.client.send_async(msg, timeout_s=DEADLINE_S)
        got = self.server.recv(timeout_s=DEADLINE_S).payload
        if not isinstance(got, TokenIds) or got.seq_id != seq.seq_id:
            raise RuntimeError(f"token_ids delivered {got!r}, expected the handoff of {seq.seq_id}")
        c0, cpu0 = time.perf_counter(), time.thread_time()
        engine.sample(seq, engine.extend(seq, got.ids))
        t1, cpu1 = time.perf_counter(), time.thread_time()
        ack.result(timeout=DEADLINE_S)  # the ack has crossed back: every byte up is counted
        return Measured(
            t1 - t0,
            self.relay.stats.up_bytes - up0,
            self.relay.stats.down_bytes - down0,
            envelope(msg, 0).ByteSize(),
            t1 - c0,
            cpu1 - cpu0,
        )

    def close(self) -> None:
        self.client.close()
        self.relay.close()
        self.server.close()


class KVPath:
    """relay -> LinkRelay -> main's wan_flight receiver; main lands the KV in its cache."""

    def __init__(self, link: LinkModel, seed: int, deadline_s: float, streams: int, checksum: str):
        params = WanFlightParams(
            streams=streams,
            deadline_s=deadline_s,
            token=secrets.token_hex(16),
            emulate=link,
            seed=seed,
            checksum=checksum,
        )
        self.receiver = WanFlightReceiver("127.0.0.1", 0, params=params, tensor_lib="torch")
        self.relay = LinkRelay(_host_port(self.receiver.location))
        self.sender = WanFlightSender(f"grpc://{self.relay.address}", params=params)
        try:
            self.sender.connect(timeout_s=deadline_s)
        except BaseException:
            self.close()  # the receiver and the relay already listen
            raise

    def run(self, engine: Engine, seq: Sequence, kv: KVBlocks, ids: list[int]) -> Measured:
        """`seq` is main's: the prompt computed, nothing pending. `ids`: the handed-off tokens and
        the next one, which the relay sampled from the last token's logits."""
        up0, down0 = self.relay.stats.up_bytes, self.relay.stats.down_bytes
        t0 = time.perf_counter()
        sent = self.sender.send_async(kv, timeout_s=DEADLINE_S)
        got = self.receiver.recv(kv.seq_id, timeout_s=DEADLINE_S)
        c0, cpu0 = time.perf_counter(), time.thread_time()
        engine.append_tokens(seq, ids)
        engine.import_kv(seq, got)
        t1, cpu1 = time.perf_counter(), time.thread_time()
        report = sent.result(timeout=DEADLINE_S)  # after the final ack: every byte up is counted
        return Measured(
            t1 - t0,
            self.relay.stats.up_bytes - up0,
            self.relay.stats.down_bytes - down0,
            report.bytes,
            t1 - c0,
            cpu1 - cpu0,
        )

    def close(self) -> None:
        self.sender.close()
        self.relay.close()
        self.receiver.close()
