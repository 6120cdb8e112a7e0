"""wan_flight: KVBlocks across datacenters over Apache Arrow Flight (gRPC over TCP).

The receiver (e.g. MainDecode) runs a Flight server; the sender (Prefill) pushes with DoPut.

* A KV set is cut into runs of whole blocks (one record batch each, `codec_kv` wire form) in a
  shared queue; `streams` DoPut calls, each over its own TCP connection (a per-client gRPC
  subchannel pool), pull runs from it as fast as their connection drains, so one slow TCP stream
  takes fewer runs instead of bounding the transfer.
* After every batch the receiver writes a `KVAck` (protobuf) into the DoPut metadata stream: which
  blocks landed with a matching checksum, which were rejected. Rejected blocks are resent (at most
  `max_block_retries` times, then ChannelCorrupt); a corrupt block is never landed.
* A dropped connection is retried with backoff until the deadline; the stream asks the receiver
  (action `kv.status`) which blocks it holds and resumes after the last acknowledged one.
* Every call carries the send's deadline (gRPC deadline = time left); a peer that never answers
  makes `send` raise ChannelTimeout at the deadline. The receiver drops a partial set once the
  sender's deadline (sent in the descriptor) has passed.
* TLS (`grpc+tls://`), bearer-token middleware (missing or wrong token: ChannelAuthError), gRPC
  keepalive and message size limits (gRPC options on the client; the Flight server, which
  pyarrow does not let us configure, checks every batch against the same limit itself).
* Optional link emulation (`emulate=LinkModel`, sender side): each stream's batches are held to
  the emulated link's token bucket and one-way delay, and completion waits for the final
  acknowledgement's return delay.

    wan_flight_params.py    WanFlightParams
    wan_flight_receiver.py  WanFlightReceiver (the Flight server)
    wan_flight_sender.py    WanFlightSender (the Flight client, one connection per stream)
    wan_flight_send_job.py  one send's resumable bookkeeping (runs to send, acks, rejections)
    wan_flight_errors.py    Flight errors -> channel errors
"""

from pddflow.channels.wan_flight_params import WanFlightParams
from pddflow.channels.wan_flight_receiver import WanFlightReceiver
from pddflow.channels.wan_flight_sender import WanFlightSender

__all__ = ["WanFlightParams", "WanFlightReceiver", "WanFlightSender"]
