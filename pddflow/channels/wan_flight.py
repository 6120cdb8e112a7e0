"""wan_flight: KVBlocks across datacenters over Arrow Flight, resumable over parallel streams
(docs/channels.md, wan_flight protocol); the public names of its modules."""

from pddflow.channels.wan_flight_params import WanFlightParams
from pddflow.channels.wan_flight_receiver import WanFlightReceiver
from pddflow.channels.wan_flight_sender import WanFlightSender

__all__ = ["WanFlightParams", "WanFlightReceiver", "WanFlightSender"]
